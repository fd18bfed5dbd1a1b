"""Time to one validation accuracy, across benchmark suites: for every run under the given
``results/runs/bench-NAME/`` folders, the training time (the steps' time, re-solves
included, evaluation not: ``bench cluster``'s own ``train_time_s``) and epochs until
its validation accuracy first reaches ``--target``, with its median epoch time; means and
spreads over seeds per (suite, mode). Unlike ``bench cluster``'s own time to accuracy,
whose target is each suite's Vanilla at its last epoch, the target here is one figure for
every suite, so suites with other recipes compare.

    .venv/bin/python results/bench/cluster/signal-300mbit-gcn-compute-rows/tta.py \
        --target 0.80 --suite before=results/runs/bench-NAME1 --suite after=... \
        --out results/bench/cluster/signal-300mbit-gcn-compute-rows/tta.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from adaqp.bench.cluster import read_run


def reached(run_dir: Path, target: float) -> dict:
    run = read_run(run_dir)
    records, summary = run["epochs"], run["summary"]
    hit = next(
        (r for r in records if r.get("val_acc") is not None and r["val_acc"] >= target), None
    )
    return {
        "run": run_dir.name,
        "epoch_time_s": summary["epoch_time_s"],
        "best_val_acc": summary["best_val_acc"],
        "final_val_acc": next(
            (r["val_acc"] for r in reversed(records) if r.get("val_acc") is not None), None
        ),
        "epochs_to_target": None if hit is None else hit["epoch"],
        "time_to_target_s": None if hit is None else hit["train_time_s"],
        "test_acc": summary["test_acc_at_best_val"],
    }


def spread(values: list[float]) -> str:
    if not values:
        return "never"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.1f} ± {std:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=float, required=True)
    parser.add_argument("--suite", action="append", required=True, help="LABEL=RUNS_DIR")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows, table = (
        [],
        [
            "| suite | mode | reached (seeds) | epochs to target | time to target s | "
            "epoch ms | best val acc | test acc |",
            "|---|---|---|---|---|---|---|---|",
        ],
    )
    for item in args.suite:
        label, _, folder = item.partition("=")
        by_mode: dict[str, list[dict]] = {}
        for run_dir in sorted(Path(folder).glob("*-seed*")):
            if (run_dir / "summary.json").exists():
                by_mode.setdefault(run_dir.name.rsplit("-seed", 1)[0], []).append(
                    reached(run_dir, args.target)
                )
        for mode, runs in by_mode.items():
            hits = [r for r in runs if r["time_to_target_s"] is not None]
            rows.append({"suite": label, "mode": mode, "runs": runs})
            table.append(
                f"| {label} | `{mode}` | {len(hits)}/{len(runs)} | "
                f"{spread([r['epochs_to_target'] for r in hits])} | "
                f"{spread([r['time_to_target_s'] for r in hits])} | "
                f"{1e3 * statistics.fmean(r['epoch_time_s'] for r in runs):.1f} | "
                f"{statistics.fmean(r['best_val_acc'] for r in runs):.4f} | "
                f"{statistics.fmean(r['test_acc'] for r in runs):.4f} |"
            )
    Path(args.out).write_text(json.dumps({"target": args.target, "suites": rows}, indent=1))
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
