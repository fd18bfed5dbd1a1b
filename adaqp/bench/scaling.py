"""How the costs grow: training across P = 1, 2, 4, 8 workers, and partitioning as the
graph grows from 100k to 10M edges, with fitted power-law exponents; or, with ``--hosts``,
strong scaling on emulated hosts that each own a CPU budget and a link
(``adaqp.bench.scaling_hosts``, root).

Writes ``scaling.json``, ``scaling.md`` and, with matplotlib, ``scaling.png`` to
``--out-dir`` (by default ``results/local/bench/``; ``--out-dir
results/bench/scaling/<workload>`` updates a committed reading). Every point is a fresh
process (torchrun for training, a subprocess for partitioning), so peak memory is that run's
own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from adaqp.bench import DEFAULT_OUT_DIR, count_list, pyplot, scaling_hosts, torchrun_train

PARTITION_SCRIPT = """
import json, resource, sys, tempfile, time
from adaqp.data import SyntheticSpec, generate_synthetic
from adaqp.partitioning.build import make_partition
spec = SyntheticSpec(num_nodes=int(sys.argv[1]), avg_degree=20.0, feature_dim=16, seed=0)
t0 = time.perf_counter()
graph = generate_synthetic(spec)
t1 = time.perf_counter()
with tempfile.TemporaryDirectory() as out:
    meta = make_partition(graph, out + "/p", num_parts=int(sys.argv[2]), spec={"n": spec.num_nodes})
t2 = time.perf_counter()
print(json.dumps({"num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                  "generate_s": t1 - t0, "partition_s": t2 - t1, "edge_cut": meta["edge_cut"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def fit_exponent(x: list[float], y: list[float]) -> float:
    """Slope of log y against log x (y ~ x^k)."""
    import numpy as np

    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def _training_point(world_size: int, args, runs_dir: Path) -> dict:
    out = runs_dir / f"p{world_size}"
    train_args = [
        "--config",
        "configs/synthetic-gcn.toml",
        "--mode",
        "vanilla",
        "--epochs",
        str(args.epochs),
        "--out",
        str(out),
        "--overwrite",  # a benchmark re-run replaces its own runs
        "--set",
        "checkpoint.every=0",
    ]
    for item in (
        f"data.synthetic.num_nodes={args.train_nodes}",
        "data.synthetic.avg_degree=20",
        "data.synthetic.feature_dim=64",
        "train.eval_every=0",
        "metrics.progress=false",
        f"partition.dir=partitions/bench-scaling-{args.train_nodes}-p{world_size}",
    ):
        train_args += ["--set", item]
    torchrun_train(world_size, train_args, args.timeout, f"P={world_size}")
    s = json.loads((out / "summary.json").read_text())
    return {
        "world_size": world_size,
        "epoch_time_s": s["epoch_time_s"],
        "comm_time_s": s["comm_time_s"],
        "peak_memory_mb_per_rank": s["peak_memory_mb"],
        "halo_bytes_per_epoch": s["halo_bytes_per_epoch"],
    }


def _partition_point(num_nodes: int, num_parts: int, timeout: float) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PARTITION_SCRIPT, str(num_nodes), str(num_parts)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"partitioning {num_nodes} nodes failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--world-sizes",
        type=count_list,
        default="1,2,4,8",
        help="comma-separated worker counts P to train with (torchrun on this machine)",
    )
    parser.add_argument(
        "--train-nodes",
        type=int,
        default=50_000,
        help="nodes of the synthetic graph trained at each P (average degree 20)",
    )
    parser.add_argument("--epochs", type=int, default=20, help="training epochs per P")
    parser.add_argument(
        "--partition-nodes",
        type=count_list,
        default="5000,15000,50000,150000,500000",
        help="comma-separated graph sizes to partition (avg degree 20: 100k to 10M edges)",
    )
    parser.add_argument(
        "--num-parts", type=int, default=4, help="parts each partitioned graph is cut into"
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds per training run or partitioning"
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="where scaling.json, .md and .png go; results/bench/scaling/<workload> updates a "
        "committed reading",
    )
    scaling_hosts.add_host_arguments(parser)


def main(args: argparse.Namespace) -> int:
    if args.hosts:
        return scaling_hosts.run_sweep(args)
    runs_dir = Path("results/runs/bench-scaling")
    training = []
    for p in args.world_sizes:
        started = time.perf_counter()
        training.append(_training_point(p, args, runs_dir))
        t = training[-1]
        print(
            f"train P={p}: epoch {1e3 * t['epoch_time_s']:.0f} ms, peak "
            f"{t['peak_memory_mb_per_rank']:.0f} MB/rank ({time.perf_counter() - started:.0f}s)",
            flush=True,
        )
    partitioning = []
    for n in args.partition_nodes:
        partitioning.append(_partition_point(n, args.num_parts, args.timeout))
        q = partitioning[-1]
        print(
            f"partition {q['num_edges']} edges: {q['partition_s']:.2f}s, peak "
            f"{q['peak_rss_mb']:.0f} MB",
            flush=True,
        )
    fits = {
        "epoch_time_vs_P": fit_exponent(
            [t["world_size"] for t in training], [t["epoch_time_s"] for t in training]
        ),
        "memory_per_rank_vs_P": fit_exponent(
            [t["world_size"] for t in training], [t["peak_memory_mb_per_rank"] for t in training]
        ),
        "partition_time_vs_edges": fit_exponent(
            [q["num_edges"] for q in partitioning], [q["partition_s"] for q in partitioning]
        ),
        "partition_memory_vs_edges": fit_exponent(
            [q["num_edges"] for q in partitioning], [q["peak_rss_mb"] for q in partitioning]
        ),
    }
    report = {
        "machine_cores": os.cpu_count(),
        "train_nodes": args.train_nodes,
        "training": training,
        "partitioning": partitioning,
        "exponents": fits,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "scaling.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Scaling ({os.cpu_count()} cores)",
        "",
        f"Training: synthetic graph, {args.train_nodes} nodes, average degree 20, vanilla "
        f"mode, {args.epochs} epochs, all workers on this machine.",
        "",
        "| P | epoch ms | exchange ms | peak MB per rank | halo MB/epoch |",
        "|---|---|---|---|---|",
    ]
    for t in training:
        lines.append(
            f"| {t['world_size']} | {1e3 * t['epoch_time_s']:.0f} | "
            f"{1e3 * t['comm_time_s']:.0f} | {t['peak_memory_mb_per_rank']:.0f} | "
            f"{t['halo_bytes_per_epoch'] / 1e6:.1f} |"
        )
    lines += [
        "",
        f"Partitioning into {args.num_parts} parts (METIS, including halo building and writing):",
        "",
        "| edges | generate s | partition s | peak MB | edge cut |",
        "|---|---|---|---|---|",
    ]
    for q in partitioning:
        lines.append(
            f"| {q['num_edges']} | {q['generate_s']:.2f} | {q['partition_s']:.2f} | "
            f"{q['peak_rss_mb']:.0f} | {q['edge_cut']} |"
        )
    lines += [
        "",
        "Fitted exponents (y ~ x^k): "
        + ", ".join(f"{k} {v:.2f}" for k, v in fits.items() if not math.isnan(v)),
    ]
    (args.out_dir / "scaling.md").write_text("\n".join(lines) + "\n")
    _plot(args.out_dir / "scaling.png", training, partitioning, fits)
    print("\n".join(lines))
    print(f"-> {args.out_dir / 'scaling.md'}")
    return 0


def _plot(path: Path, training: list[dict], partitioning: list[dict], fits: dict) -> bool:
    """Writes the figure to ``path``; False (and one warning) without matplotlib."""
    plt = pyplot(str(path))
    if plt is None:
        return False

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    ps = [t["world_size"] for t in training]
    a.loglog(ps, [t["epoch_time_s"] for t in training], "o-", label="epoch time (s)")
    a.loglog(
        ps, [t["peak_memory_mb_per_rank"] / 1e3 for t in training], "s-", label="peak GB per rank"
    )
    a.set_xlabel("workers P")
    a.set_title(f"training (epoch ~ P^{fits['epoch_time_vs_P']:.2f})")
    a.legend()
    es = [q["num_edges"] for q in partitioning]
    b.loglog(es, [q["partition_s"] for q in partitioning], "o-", label="partition time (s)")
    b.loglog(es, [q["peak_rss_mb"] / 1e3 for q in partitioning], "s-", label="peak GB")
    b.set_xlabel("edges")
    b.set_title(f"partitioning (time ~ E^{fits['partition_time_vs_edges']:.2f})")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
