"""Training with and without ``train.compute_rows = "loss"``, side by side: rows computed per
layer, halo bytes per epoch, peak memory and epoch time, from each run's summary.json.

    .venv/bin/python results/bench/compute-rows/signal-10pct/measure.py \
        --config configs/cluster-synthetic-signal-gcn.toml --nproc 4 --epochs 30 \
        --modes vanilla adaqp --repeats 2 --out results/bench/compute-rows/signal-10pct

Runs alternate between ``all`` (the baseline, every row) and ``loss`` within each repeat
and mode, so that a busy machine slows both alike. Writes ``runs.json`` (every summary's
figures) and ``table.md`` (medians over repeats) to ``--out``; the runs themselves go to
``results/local/compute-rows/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
FIELDS = (
    "rows_by_layer",
    "halo_bytes_per_epoch",
    "halo_bytes_by_tag",
    "peak_memory_mb",
    "epoch_time_s",
    "comm_wait_s",
    "final_train_loss",
    "best_val_acc",
    "world_size",
)


def run(args, mode: str, rows: str, repeat: int) -> dict:
    out = ROOT / "results/local/compute-rows" / f"{Path(args.out).name}-{mode}-{rows}-{repeat}"
    command = [
        "bash",
        str(ROOT / "launch/train.sh"),
        args.config,
        "--nproc",
        str(args.nproc),
        "--mode",
        mode,
        "--epochs",
        str(args.epochs),
        "--out",
        str(out),
        "--overwrite",
        "--set",
        f"train.compute_rows={rows}",
        "--set",
        "checkpoint.every=0",
        *[x for s in args.set for x in ("--set", s)],
    ]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    summary = json.loads((out / "summary.json").read_text())
    return {"mode": mode, "compute_rows": rows, "repeat": repeat} | {k: summary[k] for k in FIELDS}


def table(runs: list[dict]) -> str:
    lines = [
        "| mode | compute_rows | rows per layer (sum over ranks) | halo MB/epoch | "
        "peak MiB (largest rank) | epoch s (median of runs) | final train loss |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r["mode"], r["compute_rows"]) for r in runs}, key=lambda k: (k[0], k[1] != "all")
    )
    for mode, rows in keys:
        same = [r for r in runs if r["mode"] == mode and r["compute_rows"] == rows]
        first = same[0]
        lines.append(
            f"| `{mode}` | `{rows}` | {', '.join(f'{n:,}' for n in first['rows_by_layer'])} | "
            f"{first['halo_bytes_per_epoch'] / 1e6:.2f} | "
            f"{statistics.median(r['peak_memory_mb'] for r in same):.0f} | "
            f"{statistics.median(r['epoch_time_s'] for r in same):.3f} | "
            f"{first['final_train_loss']:.6f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--modes", nargs="+", default=["vanilla", "adaqp"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="config override")
    parser.add_argument("--out", required=True, help="folder for runs.json and table.md")
    args = parser.parse_args()
    runs = [
        run(args, mode, rows, repeat)
        for repeat in range(args.repeats)
        for mode in args.modes
        for rows in ("all", "loss")
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps({"argv": sys.argv, "runs": runs}, indent=1))
    (out / "table.md").write_text(table(runs))
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
