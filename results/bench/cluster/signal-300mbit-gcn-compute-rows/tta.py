"""Time to one validation accuracy, across benchmark suites: for every run under the given
``results/runs/bench-NAME/`` folders, the training time (the steps' time, re-solves
included, evaluation not: ``bench cluster``'s own ``train_time_s``) and epochs until
its validation accuracy first reaches the target, with its epoch time; means and spreads
over seeds per (suite, mode). Unlike ``bench cluster``'s own time to accuracy, whose target
is each suite's Vanilla at its last epoch, the target here is the same for every suite, so
suites with other recipes compare: one figure (``--target``), or each seed's Vanilla final
validation accuracy in one suite minus ``--tolerance`` (``--target-from``: Vanilla is exact,
so its accuracy does not depend on the cluster it ran on).

    .venv/bin/python results/bench/cluster/signal-300mbit-gcn-compute-rows/tta.py \
        --target 0.80 --suite before=results/runs/bench-NAME1 --suite after=... \
        --out results/bench/cluster/signal-300mbit-gcn-compute-rows/tta.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from adaqp.bench.cluster import epoch_breakdown, read_run


def final_val_acc(records: list[dict]) -> float | None:
    return next((r["val_acc"] for r in reversed(records) if r.get("val_acc") is not None), None)


def seed_of(run_dir: Path) -> int:
    return int(run_dir.name.rsplit("-seed", 1)[1])


def vanilla_targets(folder: Path, tolerance: float) -> dict[int, float]:
    """Each seed's target: its Vanilla run's final validation accuracy minus ``tolerance``."""
    targets = {}
    for run_dir in sorted(folder.glob("vanilla-seed*")):
        final = final_val_acc(read_run(run_dir)["epochs"])
        if final is not None:
            targets[seed_of(run_dir)] = final - tolerance
    if not targets:
        raise SystemExit(f"error: no Vanilla run with a validation accuracy under {folder}")
    return targets


def reached(run_dir: Path, target: float) -> dict:
    run = read_run(run_dir)
    records, summary = run["epochs"], run["summary"]
    hit = next(
        (r for r in records if r.get("val_acc") is not None and r["val_acc"] >= target), None
    )
    return {
        "run": run_dir.name,
        "target": target,
        "epoch_time_s": summary["epoch_time_s"],
        "cpu_time_s": summary.get("cpu_time_s"),
        "epoch_split_s": epoch_breakdown(summary),
        "best_val_acc": summary["best_val_acc"],
        "final_val_acc": final_val_acc(records),
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


def cpu_ms(runs: list[dict]) -> str:
    """Mean CPU time per epoch in ms ("-" where a run's summary lacks it): the steadier
    figure on a shared machine, which waiting and being descheduled do not add to."""
    cpu = [r["cpu_time_s"] for r in runs]
    return "-" if None in cpu else f"{1e3 * statistics.fmean(cpu):.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    goal = parser.add_mutually_exclusive_group(required=True)
    goal.add_argument("--target", type=float, help="one validation accuracy for every run")
    goal.add_argument(
        "--target-from",
        type=Path,
        help="RUNS_DIR whose vanilla-seed<k> runs set seed k's target (final val acc - tolerance)",
    )
    parser.add_argument("--tolerance", type=float, default=0.005)
    parser.add_argument("--suite", action="append", required=True, help="LABEL=RUNS_DIR")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    targets = vanilla_targets(args.target_from, args.tolerance) if args.target_from else None
    rows, table = (
        [],
        [
            "| suite | mode | reached (seeds) | epochs to target | time to target s | "
            "epoch ms | CPU ms/epoch | best val acc | test acc |",
            "|---|---|---|---|---|---|---|---|---|",
        ],
    )
    for item in args.suite:
        label, _, folder = item.partition("=")
        by_mode: dict[str, list[dict]] = {}
        for run_dir in sorted(Path(folder).glob("*-seed*")):
            if not (run_dir / "summary.json").exists():
                continue
            target = targets.get(seed_of(run_dir)) if targets else args.target
            if target is None:
                raise SystemExit(f"error: no Vanilla target for {run_dir.name}")
            by_mode.setdefault(run_dir.name.rsplit("-seed", 1)[0], []).append(
                reached(run_dir, target)
            )
        for mode, runs in by_mode.items():
            hits = [r for r in runs if r["time_to_target_s"] is not None]
            rows.append({"suite": label, "mode": mode, "runs": runs})
            table.append(
                f"| {label} | `{mode}` | {len(hits)}/{len(runs)} | "
                f"{spread([r['epochs_to_target'] for r in hits])} | "
                f"{spread([r['time_to_target_s'] for r in hits])} | "
                f"{1e3 * statistics.fmean(r['epoch_time_s'] for r in runs):.1f} | "
                f"{cpu_ms(runs)} | "
                f"{statistics.fmean(r['best_val_acc'] for r in runs):.4f} | "
                f"{statistics.fmean(r['test_acc'] for r in runs):.4f} |"
            )
    Path(args.out).write_text(
        json.dumps({"target": args.target or targets, "suites": rows}, indent=1)
    )
    table += [
        "",
        "| suite | mode | epoch ms | compute | exchange wait | all-reduce | (de)quantizing |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        split = {
            k: 1e3 * statistics.fmean(r["epoch_split_s"][k] for r in row["runs"])
            for k in ("compute_s", "wait_s", "allreduce_s", "quant_s")
        }
        epoch = 1e3 * statistics.fmean(r["epoch_time_s"] for r in row["runs"])
        table.append(
            f"| {row['suite']} | `{row['mode']}` | {epoch:.1f} | "
            + " | ".join(f"{v:.1f}" for v in split.values())
            + " |"
        )
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
