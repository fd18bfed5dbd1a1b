"""The training worker's peak as a formula (docs/memory.md, "Training memory per worker"),
checked against the peaks ``measure.py`` recorded.

    .venv/bin/python results/bench/memory/training/formula.py /tmp/mem/after/*/

For every run folder (one ``rank<r>.json`` per rank), each rank's predicted peak from its
shape (inner rows I, halo rows H, send rows S, in-edges E, stored entries of the
aggregation matrix, central rows) and the model (F, D, L, GCN or SAGE, overlap or not),
against the rank's measured peak (``ru_maxrss``); printed per run for the largest rank,
with the runtime constant and each term, and written as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

MIB = 2**20


def held_bytes(r: dict) -> dict[str, int]:
    """Tensors held across steps (bytes), by term."""
    i, h, s, e, nnz = (
        r["num_inner"],
        r["num_halo"],
        r["num_send"],
        r["num_edges"],
        r["adjacency_nnz"],
    )
    f, m = r["feature_dim"], r["num_inner"] - r["num_central"]
    features = 4 * f * (i + h if r["cached_input"] else i)
    # indptr (int64), indices (int32), inner and halo global ids, degrees, labels (int64),
    # three masks (bool), the send list (int64)
    part = 8 * (i + 1) + 4 * e + 8 * i + 8 * h + 8 * (i + h) + 8 * i + 3 * i + 8 * s
    if r["world_size"] == 1:
        # The matrix and its transpose: int32 row offsets, int32 column and float32 value
        # per entry. SAGE's matrix reads its columns from the part's indices (shared).
        adjacency = 16 * nnz + 8 * (i + 1) - (4 * e if r["model"] == "sage" else 0)
    else:
        # Only the column split's blocks ([I, I] and [M, H]) and their transposes.
        adjacency = 16 * nnz + 4 * (2 * i + m + h + 4)
    return {
        "features": features,
        "part arrays": part,
        "adjacency": adjacency,
        "parameters and Adam": 16 * r["num_params"],
    }


def activation_bytes(r: dict) -> dict[str, int]:
    """Activations at the step's peak (bytes): saved tensors still alive and gradients in
    flight, at the start of backward or, with halo rows, at the top hidden layer's backward."""
    i, h, s = r["num_inner"], r["num_halo"], r["num_send"]
    f, d, layers = r["feature_dim"], r["hidden"], r["layers"]
    norm = 4 * d + 8 + -(-d // 8)  # the norm's input, its mean and 1/std, the ReLU's bits
    # Saved at the end of forward: layer 0's aggregated features, every hidden layer's norm
    # and its aggregated rows (layer >= 1), the last layer's input (it transforms first).
    saved = 4 * f + norm + (layers - 2) * (4 * d + norm) + 4 * d
    start = {"saved": i * saved, "gradients in flight": 4 * d * i}
    if r["world_size"] == 1:
        return start
    # The top hidden layer l = L - 2, exchanged: layers below keep all they saved, layer l
    # its aggregated rows (held for the weights' gradient); in flight: the norm input's
    # gradient (until the weights' gradient is made), the aggregated rows', the inner
    # rows' and, for SAGE, the root weight's, with the halo rows' gradients; with overlap
    # the halo gradients are sent (and [S, D] received) before the inner rows' are made,
    # and the norm input's gradient is let go first.
    top = layers - 2
    alive = 4 * f + norm + (top - 1) * (4 * d + norm) + 4 * d
    grads = (8 if r["overlap"] else 12) + (4 if r["model"] == "sage" else 0)
    exchange = 4 * d * (h + (s if r["overlap"] else 0))
    layer = {"saved": i * alive, "gradients in flight": grads * d * i + exchange}
    return layer if sum(layer.values()) > sum(start.values()) else start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--runtime-mib", type=float, help="default: the median measured")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ranks = {
        run: [json.loads(p.read_text()) for p in sorted(run.glob("rank*.json"))]
        for run in args.runs
    }
    runtimes = [
        r["rss_mb"]["before step"] - sum(held_bytes(r).values()) / MIB
        for rs in ranks.values()
        for r in rs
    ]
    runtime = args.runtime_mib or statistics.median(runtimes)
    print(
        "runtime (before the step less the held tensors): median "
        f"{statistics.median(runtimes):.0f} MiB, {min(runtimes):.0f}-{max(runtimes):.0f}; "
        f"used {runtime:.0f} MiB"
    )
    rows = []
    for run, rs in ranks.items():
        best = None
        for r in rs:
            terms = {k: v / MIB for k, v in {**held_bytes(r), **activation_bytes(r)}.items()}
            predicted = runtime + sum(terms.values())
            measured = r["rss_mb"]["ru_maxrss"]
            if best is None or measured > best["measured_mib"]:
                best = {
                    "run": run.name,
                    "rank": r["rank"],
                    "measured_mib": round(measured, 1),
                    "predicted_mib": round(predicted, 1),
                    "error": round(predicted / measured - 1, 4),
                    "terms_mib": {"runtime": round(runtime, 1)}
                    | {k: round(v, 1) for k, v in terms.items()},
                }
        rows.append(best)
        print(
            f"{best['run']:28s} measured {best['measured_mib']:7.1f}  "
            f"predicted {best['predicted_mib']:7.1f}  ({100 * best['error']:+.1f}%)"
        )
    if args.json:
        args.json.write_text(json.dumps({"runtime_mib": runtime, "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
