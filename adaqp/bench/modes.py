"""Modes side by side: vanilla, adaqp-q, adaqp-p, adaqp, onebit (S = 1, 2), ``adaqp`` at a
uniform 1, 2, 4 and 8 bits and the no-exchange reference ``nocomm``, several seeds each,
every run a real ``torchrun`` job of the unchanged trainer.

Writes ``<--out-dir>/modes-<dataset>.json`` (every run's summary plus aggregates) and
``<--out-dir>/modes-<dataset>.md`` (the table), by default under ``results/local/bench/``
(``--out-dir results/bench/modes/<workload>`` updates a committed reading); the runs
themselves go to ``results/runs/bench-modes-<dataset>/``. Byte and accuracy figures compare
modes within one invocation; epoch times on a shared machine are indicative only.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from adaqp.bench import (
    ADAPTIVE_VARIANTS,
    CLUSTER_CONFIG,
    COST_MODEL_VARIANTS,
    DEFAULT_OUT_DIR,
    MODE_VARIANTS,
    NOCOMM_ACC_NOTE,
    SIGNAL_CONFIG,
    STALENESS_VARIANTS,
    UNIFORM_VARIANTS,
    add_run_options,
    bits_cell,
    chosen_variants,
    merge_overrides,
    run_order,
    seed_list,
    torchrun_train,
)

logger = logging.getLogger(__name__)

DEFAULT_VARIANTS = (*MODE_VARIANTS, *UNIFORM_VARIANTS, "adaqp-adaptive", "nocomm")
VARIANTS: dict[str, tuple[str, ...]] = {
    **MODE_VARIANTS,
    **UNIFORM_VARIANTS,
    "nocomm": ("--mode", "nocomm"),
    **ADAPTIVE_VARIANTS,
    **COST_MODEL_VARIANTS,
    **STALENESS_VARIANTS,
}
"""Every variant this benchmark can run: the same names, and flags, as ``bench cluster``'s."""

DATASETS: dict[str, tuple[str, tuple[str, ...]]] = {
    # Cora and CiteSeer as in AdaQP's evaluation: 3 layers, hidden 256.
    "cora": ("configs/cora-gcn.toml", ("model.layers=3", "model.hidden=256")),
    "citeseer": ("configs/citeseer-gcn.toml", ("model.layers=3", "model.hidden=256")),
    # The earlier cluster workload, sized for a 2-core machine (20k nodes).
    "synthetic": (CLUSTER_CONFIG, ("train.eval_every=5",)),
    # The cluster's default workload: the same size, halo rows that carry signal.
    "synthetic-signal": (SIGNAL_CONFIG, ("train.eval_every=5",)),
}

SUMMARY_KEYS = (
    "test_acc",
    "final_test_acc",
    "best_val_acc",
    "final_train_loss",
    "halo_bytes_per_epoch",
    "avg_bits",
    "epoch_time_s",
    "comm_time_s",
    "comm_wait_s",
    "quant_time_s",
    "dequant_time_s",
    "allreduce_time_s",
    "hidden_comm_fraction",
    "max_staleness",
    "effective_staleness",
)


def _run_one(dataset: str, variant: str, seed: int, args, out_dir: Path, part_dir: Path):
    config, overrides = DATASETS[dataset]
    run_dir = out_dir / f"{variant}-seed{seed}"
    train_args = [
        "--config",
        config,
        "--seed",
        str(seed),
        "--out",
        str(run_dir),
        "--overwrite",  # a benchmark re-run replaces its own runs
        "--set",
        "checkpoint.every=0",
        "--epochs",
        str(args.epochs),
        *VARIANTS[variant],
    ]
    defaults = (*overrides, f"partition.dir={part_dir}", "metrics.progress=false")
    for item in merge_overrides((*defaults, *args.set)):
        train_args += ["--set", item]
    started = time.perf_counter()
    torchrun_train(args.world_size, train_args, args.timeout, f"{variant} seed {seed}")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["wall_s"] = time.perf_counter() - started
    return summary


def _aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for key in SUMMARY_KEYS:
        values = [float(r[key]) for r in runs]
        out[key] = {
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        }
    return out


def _table(dataset: str, results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    base = results["vanilla"]["aggregate"]
    lines = [
        f"# Modes on {dataset} ({meta['world_size']} workers, {meta['epochs']} epochs, "
        f"seeds {meta['seeds']})",
        "",
        f"Settings: `{meta['config']}` with "
        f"{', '.join(merge_overrides(meta['overrides'])) or 'no overrides'}.",
        "Times are medians after warm-up, means over seeds, on a shared 2-core machine over "
        "loopback, where the exchange is nearly free: compare bytes and accuracy here, and "
        "see the emulated-cluster benchmark for what overlap and quantization save in time. "
        f"`nocomm` skips the exchange: its accuracy ({NOCOMM_ACC_NOTE}) is each part trained "
        "without its halo rows. `uniform-N`: `adaqp` with every message at N bits.",
        "",
        "| mode | test acc (mean ± std) | halo MB/epoch | vs vanilla | avg bits | epoch ms "
        "| exchange wait ms | quant+dequant ms | all-reduce ms | staleness max / effective |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in results.items():
        a = entry["aggregate"]
        nbytes = a["halo_bytes_per_epoch"]["mean"]
        ratio = f"1/{base['halo_bytes_per_epoch']['mean'] / nbytes:.1f}" if nbytes else "-"
        note = f" ({NOCOMM_ACC_NOTE})" if name == "nocomm" else ""
        lines.append(
            f"| {name} | {a['test_acc']['mean']:.4f} ± {a['test_acc']['std']:.4f}{note} "
            f"| {nbytes / 1e6:.3f} | {ratio} "
            f"| {bits_cell(a['avg_bits']['mean'], nbytes)} | {1e3 * a['epoch_time_s']['mean']:.1f} "
            f"| {1e3 * a['comm_wait_s']['mean']:.1f} "
            f"| {1e3 * (a['quant_time_s']['mean'] + a['dequant_time_s']['mean']):.1f} "
            f"| {1e3 * a['allreduce_time_s']['mean']:.1f} "
            f"| {a['max_staleness']['mean']:.0f} / {a['effective_staleness']['mean']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        choices=sorted(DATASETS),
        default="cora",
        help="cora or citeseer (3 layers, hidden 256), synthetic "
        "(configs/cluster-synthetic-gcn.toml, 20k nodes) or synthetic-signal "
        "(configs/cluster-synthetic-signal-gcn.toml, the same size, halo rows carry signal)",
    )
    parser.add_argument(
        "--world-size", type=int, default=4, help="workers per run (torchrun on this machine)"
    )
    parser.add_argument(
        "--seeds", type=seed_list, default="0,1,2", help="comma-separated training seeds"
    )
    parser.add_argument("--epochs", type=int, default=200, help="training epochs per run")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated subset of {', '.join(VARIANTS)}; must include vanilla",
    )
    add_run_options(parser)
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="where modes-<dataset>.json and .md go; results/bench/modes/<workload> updates a "
        "committed reading",
    )


def main(args: argparse.Namespace) -> int:
    seeds = args.seeds
    variants = chosen_variants("--variants", args.variants, VARIANTS)
    runs_dir = Path("results/runs") / f"bench-modes-{args.dataset}"
    part_dir = Path("partitions") / f"bench-{args.dataset}-p{args.world_size}"
    results: dict[str, dict[str, Any]] = {}
    total = len(variants) * len(seeds)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    # Seed after seed, each seed's variants rotated: no variant always runs first or last.
    for done, (variant, seed) in enumerate(run_order(variants, seeds), start=1):
        summary = _run_one(args.dataset, variant, seed, args, runs_dir, part_dir)
        runs[variant].append(summary)
        print(
            f"[{done}/{total}] {variant} seed {seed}: test acc {summary['test_acc']:.4f}"
            f", {summary['halo_bytes_per_epoch'] / 1e6:.3f} MB/epoch, "
            f"{summary['avg_bits']:.2f} bits, {1e3 * summary['epoch_time_s']:.1f} ms/epoch"
            f" ({summary['wall_s']:.0f}s)",
            flush=True,
        )
    for variant in variants:
        results[variant] = {"runs": runs[variant], "aggregate": _aggregate(runs[variant])}
    config, overrides = DATASETS[args.dataset]
    meta = {
        "dataset": args.dataset,
        "world_size": args.world_size,
        "seeds": seeds,
        "epochs": args.epochs,
        "config": config,
        "overrides": merge_overrides((*overrides, *args.set)),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"modes-{args.dataset}.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n"
    )
    table = _table(args.dataset, results, meta)
    (args.out_dir / f"modes-{args.dataset}.md").write_text(table)
    print(table)
    print(f"-> {args.out_dir / f'modes-{args.dataset}.md'}")
    return 0
