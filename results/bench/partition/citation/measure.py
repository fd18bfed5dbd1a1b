"""Compares partition methods on the citation graphs: edge cut, halo rows per inner row,
balance of nodes and of training nodes, and the time of the assignment alone.

    .venv/bin/python results/bench/partition/citation/measure.py \
        --out results/bench/partition/citation

Writes readings.json (one record per dataset, parts, method and seed) and summary.json
(the mean over seeds; times are medians), and prints the table in README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from adaqp.data import load_dataset
from adaqp.partitioning.build import build_parts, partition_stats
from adaqp.partitioning.cut import assign_parts

METHODS = {
    "metis": {"method": "metis"},
    "kaminpar": {"method": "kaminpar", "threads": 1},
    "kaminpar 2 threads": {"method": "kaminpar", "threads": 2},
    "kaminpar, balance_train off": {"method": "kaminpar", "threads": 1, "balance_train": False},
}


def _balance(counts: np.ndarray) -> float:
    return float(counts.max() / counts.mean())


def measure(graph, num_parts: int, name: str, seed: int) -> dict:
    kwargs = dict(METHODS[name])
    train_mask = graph.train_mask if kwargs.pop("balance_train", True) else None
    start = time.perf_counter()
    parts = assign_parts(
        graph.indptr, graph.indices, num_parts, seed=seed, train_mask=train_mask, **kwargs
    )
    seconds = time.perf_counter() - start
    arrays, edge_cut = build_parts(graph, parts)
    stats = partition_stats(arrays, graph.num_edges)
    return {
        "dataset": graph.name,
        "num_parts": num_parts,
        "method": name,
        "seed": seed,
        "assign_s": seconds,
        "edge_cut": edge_cut,
        "edge_cut_fraction": edge_cut / graph.num_edges,
        "halo_rows_per_inner_row": stats["halo_rows_per_node"],
        "central_fraction": stats["central_fraction"],
        "balance_nodes": _balance(np.bincount(parts, minlength=num_parts)),
        "balance_train": _balance(np.bincount(parts[graph.train_mask], minlength=num_parts)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--datasets", nargs="+", default=["cora", "citeseer"])
    parser.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args()
    records = []
    for dataset in args.datasets:
        graph = load_dataset(dataset)
        for num_parts in args.parts:
            for name in METHODS:
                for seed in args.seeds:
                    records.append(measure(graph, num_parts, name, seed))
    summary = []
    keys = ("edge_cut_fraction", "halo_rows_per_inner_row", "central_fraction")
    keys += ("balance_nodes", "balance_train")
    for dataset in args.datasets:
        for num_parts in args.parts:
            for name in METHODS:
                rows = [
                    r
                    for r in records
                    if (r["dataset"], r["num_parts"], r["method"]) == (dataset, num_parts, name)
                ]
                entry = {"dataset": dataset, "num_parts": num_parts, "method": name}
                entry |= {k: float(np.mean([r[k] for r in rows])) for k in keys}
                entry["balance_train_max"] = max(r["balance_train"] for r in rows)
                entry["assign_s_median"] = float(np.median([r["assign_s"] for r in rows]))
                summary.append(entry)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": head.stdout.strip(),
        "seeds": args.seeds,
    }
    (out / "readings.json").write_text(json.dumps({**meta, "records": records}, indent=1))
    (out / "summary.json").write_text(json.dumps({**meta, "summary": summary}, indent=1))
    print(
        "| graph | P | method | edge cut | halo rows / inner row | central | balance nodes "
        "| balance train (mean / worst) | assign time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for e in summary:
        print(
            f"| {e['dataset']} | {e['num_parts']} | {e['method']} | "
            f"{100 * e['edge_cut_fraction']:.1f}% | {e['halo_rows_per_inner_row']:.3f} | "
            f"{100 * e['central_fraction']:.1f}% | {e['balance_nodes']:.3f} | "
            f"{e['balance_train']:.3f} / {e['balance_train_max']:.3f} | "
            f"{1000 * e['assign_s_median']:.0f} ms |"
        )


if __name__ == "__main__":
    main()
