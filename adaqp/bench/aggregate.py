"""Aggregation throughput: our CSR SpMM (precomputed transpose) vs autograd through
``torch.sparse.mm``, forward + backward, on a synthetic graph. Writes
``<--out-dir>/aggregate.json`` (by default ``results/local/bench/``; ``--out-dir
results/bench/aggregate/synthetic-1m`` updates the committed reading), or ``--out``; the
figure that matters is the ratio within one run, whose arms take turns repeat by repeat
after a warm-up round of both.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from adaqp.bench import add_out_options, out_file

logger = logging.getLogger(__name__)

TARGET_RATIO = 1.8


def _time_fwd_bwd(steps: dict[str, Callable], repeats: int) -> dict[str, dict[str, float]]:
    """Median forward, backward and total seconds of each step, the steps taking turns in
    every repeat after a dropped warm-up round (so that no arm pays the warm-up or runs
    under other conditions than the other)."""
    fwd: dict[str, list[float]] = {name: [] for name in steps}
    bwd: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(repeats + 1):
        for name, step in steps.items():
            t0 = time.perf_counter()
            out, backward = step()
            t1 = time.perf_counter()
            backward(out)
            t2 = time.perf_counter()
            if rep:
                fwd[name].append(t1 - t0)
                bwd[name].append(t2 - t1)
    return {
        name: {
            "forward_s": statistics.median(fwd[name]),
            "backward_s": statistics.median(bwd[name]),
            "total_s": statistics.median(f + b for f, b in zip(fwd[name], bwd[name], strict=True)),
        }
        for name in steps
    }


def run(num_nodes: int, avg_degree: float, dim: int, repeats: int, threads: int, out: Path) -> dict:
    # Here, not at the top: ``--help`` must not wait for torch.
    import numpy as np
    import torch

    from adaqp.data import SyntheticSpec, generate_synthetic
    from adaqp.graph.aggregate import SparseAdjacency, spmm

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    graph = generate_synthetic(
        SyntheticSpec(num_nodes=num_nodes, avg_degree=avg_degree, feature_dim=4, seed=0)
    )
    logger.info(
        "generated %d nodes / %d edges in %.1fs",
        graph.num_nodes,
        graph.num_edges,
        time.perf_counter() - t0,
    )
    n = graph.num_nodes
    values = np.full(graph.num_edges, 1.0 / max(avg_degree, 1.0), dtype=np.float32)
    ours = SparseAdjacency.from_csr(graph.indptr, graph.indices, values, (n, n))
    plain = ours.forward  # the same CSR tensor, differentiated by autograd
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(n, dim, generator=torch.Generator().manual_seed(1))

    def ours_step():
        leaf = x.clone().requires_grad_()
        return (leaf, spmm(ours, leaf)), lambda o: o[1].backward(grad)

    def autograd_step():
        leaf = x.clone().requires_grad_()
        return (leaf, torch.sparse.mm(plain, leaf)), lambda o: o[1].backward(grad)

    # Same numbers from both, or the comparison means nothing.
    (a_leaf, a_out), a_bwd = ours_step()
    a_bwd((a_leaf, a_out))
    (b_leaf, b_out), b_bwd = autograd_step()
    b_bwd((b_leaf, b_out))
    max_diff = float((a_leaf.grad - b_leaf.grad).abs().max())
    del a_leaf, a_out, b_leaf, b_out

    results = _time_fwd_bwd({"ours": ours_step, "autograd_sparse_mm": autograd_step}, repeats)
    for name, timing in results.items():
        timing["edges_per_s"] = graph.num_edges / timing["total_s"]
        logger.info(
            "%s: fwd %.2fs bwd %.2fs -> %.2f M edges/s",
            name,
            timing["forward_s"],
            timing["backward_s"],
            timing["edges_per_s"] / 1e6,
        )
    ratio = results["ours"]["edges_per_s"] / results["autograd_sparse_mm"]["edges_per_s"]
    report = {
        "benchmark": "aggregate",
        "graph": {"num_nodes": n, "num_edges": graph.num_edges, "avg_degree": avg_degree},
        "dim": dim,
        "threads": threads,
        "repeats": repeats,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "max_abs_grad_diff": max_diff,
        "results": results,
        "ratio_ours_over_autograd": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-nodes", type=int, default=1_000_000, help="nodes of the synthetic graph"
    )
    parser.add_argument(
        "--avg-degree", type=float, default=20.0, help="average in-degree of the synthetic graph"
    )
    parser.add_argument("--dim", type=int, default=128, help="feature columns aggregated")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed forward + backward passes (median kept)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    add_out_options(parser, "aggregate.json")


def main(args: argparse.Namespace) -> int:
    out = out_file(args, "aggregate.json")
    report = run(args.num_nodes, args.avg_degree, args.dim, args.repeats, args.threads, out)
    print(
        f"ours {report['results']['ours']['edges_per_s'] / 1e6:.2f} M edges/s, autograd "
        f"{report['results']['autograd_sparse_mm']['edges_per_s'] / 1e6:.2f} M edges/s: "
        f"ratio {report['ratio_ours_over_autograd']:.2f} (target {TARGET_RATIO}) "
        f"-> {out}"
    )
    return 0
