"""Cuts candidate community settings of the synthetic products-scale workload and counts
the halo rows each part would read.

    .venv/bin/python results/bench/partition/products-workload/measure.py \
        --communities 256 --inter-community 0.03 --method kaminpar

One process per setting: it generates the **synthetic** graph at ogbn-products' size
(adaqp.data's generator; features at width 1, since the graph, labels and split are drawn
before the features and do not depend on their width), runs ``assign_parts`` with training
nodes balanced, and appends one record to ``readings.jsonl``: the spec, the edge cut, and
per part its inner rows, halo rows and halo rows per inner row, and (records from the
chosen setting on) the share of cut edges that join nodes of one class. The CSR holds in-edges
(row ``u`` lists the sources of ``v -> u``, adaqp/data/graph.py), so the halo rows of part
``p`` are the distinct sources outside ``p`` of the edges whose destination is in ``p``,
as adaqp/partitioning/build.py builds them.
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

BASE = dict(
    num_nodes=2_449_029,
    num_classes=47,
    avg_degree=50.5,
    homophily=0.7,
    feature_dim=1,
    feature_noise=2.0,
    seed=0,
)

# ogbn-products' official split: 196,615 / 39,323 / 2,213,091 of 2,449,029 nodes.
PRODUCTS_SPLIT = dict(train_fraction=0.0803, val_fraction=0.0161, test_fraction=0.9036)


def halo_stats(
    indptr: np.ndarray, indices: np.ndarray, parts: np.ndarray, num_parts: int, labels: np.ndarray
):
    """Edge cut, the share of cut edges that join one class, and per part its inner rows
    and halo rows (distinct remote sources of its in-edges)."""
    dst_part = np.repeat(parts.astype(np.int8), np.diff(indptr))
    src_part = parts.astype(np.int8)[indices]
    cross = dst_part != src_part
    del src_part
    cut_src = indices[cross]
    cut_dst = np.repeat(np.arange(len(parts), dtype=np.int64), np.diff(indptr))[cross]
    cut_homophily = float(np.mean(labels[cut_src] == labels[cut_dst])) if len(cut_src) else 0.0
    del cut_src, cut_dst
    inner, halo = [], []
    for p in range(num_parts):
        mark = np.zeros(len(parts), dtype=bool)
        mark[indices[cross & (dst_part == p)]] = True
        inner.append(int((parts == p).sum()))
        halo.append(int(mark.sum()))
    return int(cross.sum()), cut_homophily, inner, halo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--communities", type=int, required=True)
    parser.add_argument("--inter-community", type=float, required=True)
    parser.add_argument("--power-law", type=float, default=0.0)
    parser.add_argument(
        "--products-split",
        action="store_true",
        help="ogbn-products' split sizes (8.03%% / 1.61%% / 90.36%%), not the generator's default",
    )
    parser.add_argument("--method", default="kaminpar")
    parser.add_argument("--num-parts", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()

    from adaqp.data import SyntheticSpec, load_dataset
    from adaqp.partitioning.cut import assign_parts

    spec = dict(
        BASE,
        communities=args.communities,
        inter_community=args.inter_community,
        power_law=args.power_law,
    )
    if args.products_split:
        spec.update(PRODUCTS_SPLIT)
    start = time.perf_counter()
    graph = load_dataset("synthetic", synthetic=SyntheticSpec(**spec))
    generate_s = time.perf_counter() - start
    indptr, indices, train_mask = graph.indptr, graph.indices.astype(np.int32), graph.train_mask
    labels = graph.labels
    info = graph.info
    del graph
    start = time.perf_counter()
    parts = assign_parts(
        indptr, indices, args.num_parts, method=args.method, threads=1, train_mask=train_mask
    )
    assign_s = time.perf_counter() - start
    cut, cut_homophily, inner, halo = halo_stats(indptr, indices, parts, args.num_parts, labels)
    ratio = [h / i for h, i in zip(halo, inner, strict=True)]
    degree = np.diff(indptr)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": head.stdout.strip(),
        "spec": spec,
        "sampled_edge_homophily": info["sampled_edge_homophily"],
        "sampled_inter_community": info.get("sampled_inter_community"),
        "num_nodes": len(indptr) - 1,
        "num_edges_directed": len(indices),
        "max_degree": int(degree.max()),
        "method": args.method,
        "num_parts": args.num_parts,
        "generate_s": generate_s,
        "assign_s": assign_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "edge_cut_directed": cut,
        "edge_cut_fraction": cut / len(indices),
        "cut_edge_homophily": cut_homophily,
        "inner_rows": inner,
        "halo_rows": halo,
        "halo_per_inner": ratio,
        "halo_per_inner_min": min(ratio),
        "halo_per_inner_max": max(ratio),
        "halo_per_inner_total": sum(halo) / sum(inner),
    }
    print(json.dumps(record))
    with open(args.out / "readings.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
