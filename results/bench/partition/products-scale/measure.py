"""Times ``assign_parts`` alone on a synthetic graph of ogbn-products' size, with the peak
resident memory of a process that holds only the graph's CSR and partitions it.

    .venv/bin/python results/bench/partition/products-scale/measure.py generate --csr /tmp/csr
    .venv/bin/python results/bench/partition/products-scale/measure.py cut --csr /tmp/csr \
        --method kaminpar --threads 1 --num-parts 4 --out results/bench/partition/products-scale

``generate`` samples the graph (adaqp.data's generator; features are not kept: the
assignment does not read them) and saves its CSR and train mask; ``cut`` loads them, runs
``assign_parts`` and appends one record to ``readings.jsonl``: time, peak RSS of the
process (``ru_maxrss``) and RSS before the cut, edge cut, and the balance of nodes and of
training nodes. Each cut runs in a fresh process, so the peaks do not mix.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SPEC = dict(
    num_nodes=2_449_029,
    num_classes=47,
    avg_degree=50.5,
    feature_dim=1,
    power_law=0.0,
    communities=256,
    inter_community=0.1,
    seed=0,
)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def generate(csr: Path) -> None:
    from adaqp.data import SyntheticSpec, load_dataset

    start = time.perf_counter()
    graph = load_dataset("synthetic", synthetic=SyntheticSpec(**SPEC))
    csr.mkdir(parents=True, exist_ok=True)
    np.save(csr / "indptr.npy", graph.indptr.astype(np.int64))
    np.save(csr / "indices.npy", graph.indices.astype(np.int32))
    np.save(csr / "train_mask.npy", graph.train_mask)
    print(
        f"generated {graph.num_nodes} nodes, {graph.num_edges} directed edges in "
        f"{time.perf_counter() - start:.1f} s"
    )


def cut(args) -> None:
    from adaqp.partitioning.cut import assign_parts

    indptr = np.load(args.csr / "indptr.npy")
    indices = np.load(args.csr / "indices.npy")
    train_mask = np.load(args.csr / "train_mask.npy")
    before = _rss_mb()
    start = time.perf_counter()
    parts = assign_parts(
        indptr,
        indices,
        args.num_parts,
        method=args.method,
        threads=args.threads,
        train_mask=train_mask,
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    src_part = np.repeat(parts.astype(np.int8), np.diff(indptr))
    edge_cut = int((src_part != parts[indices]).sum())
    nodes = np.bincount(parts, minlength=args.num_parts)
    train = np.bincount(parts[train_mask], minlength=args.num_parts)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": head.stdout.strip(),
        "spec": SPEC,
        "num_nodes": len(indptr) - 1,
        "num_edges": len(indices),
        "method": args.method,
        "threads": args.threads if args.method == "kaminpar" else 1,
        "num_parts": args.num_parts,
        "assign_s": seconds,
        "rss_before_mb": before,
        "peak_rss_mb": peak,
        "edge_cut_directed": edge_cut,
        "edge_cut_fraction": edge_cut / len(indices),
        "balance_nodes": float(nodes.max() / nodes.mean()),
        "balance_train": float(train.max() / train.mean()),
    }
    print(json.dumps(record))
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "readings.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["generate", "cut"])
    parser.add_argument("--csr", type=Path, required=True)
    parser.add_argument("--method", default="kaminpar")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--num-parts", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    if args.what == "generate":
        generate(args.csr)
    else:
        cut(args)


if __name__ == "__main__":
    main()
