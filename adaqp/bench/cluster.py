"""Every mode side by side on the emulated cluster (root): where communication really costs.

``python -m adaqp.bench cluster --name NAME [--hosts 4 --bandwidth 1gbit ...]`` builds one
emulated cluster (``adaqp.cluster``), runs vanilla, adaqp-q, adaqp-p, adaqp and the one-bit
bounded-staleness mode (S = 1 and 2) and the compute-only ``nocomm`` reference over several
seeds with the unchanged trainer, and writes to ``<--out-dir>/<NAME>/`` (by default
``results/local/bench/<NAME>/``; ``--out-dir results/bench/cluster`` updates the committed
reading of that name): ``cluster.json`` (every figure), ``cluster.md`` (the table) and, with
matplotlib, its plots: ``breakdown.png`` (stacked epoch time per mode),
``time_to_accuracy.png`` and ``curves.png`` (validation accuracy against time),
``bytes_by_layer.png`` and ``pareto.png`` (test accuracy against time to Vanilla's
accuracy). The runs themselves go to ``results/runs/bench-<NAME>/``. Every host runs under
the same budgets as in ``adaqp.cluster`` (``--cpus-per-host``, ``--memory-per-host``), and
``cluster.md`` shows what each host used (CPU seconds and peak memory, from each run's
``logs/cluster.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
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
    MODEL_SETTINGS,
    SIGNAL_CONFIG,
    STALENESS_VARIANTS,
    UNIFORM_VARIANTS,
    UsageError,
    add_run_options,
    chosen_variants,
    merge_overrides,
    run_order,
    seed_list,
    signal_recipe,
    step_time_s,
)
from adaqp.bench.cluster_plot import plot
from adaqp.bench.cluster_table import render
from adaqp.emulate import ClusterError, EmulatedCluster, host_links
from adaqp.emulate.cgroups import CgroupError, enforce
from adaqp.emulate.cli import add_budget_arguments, budgets_from

logger = logging.getLogger(__name__)

DEFAULT_MODES = (*MODE_VARIANTS, "adaqp-adaptive", "uniform-2", "nocomm")
VARIANTS: dict[str, tuple[str, ...]] = {
    **MODE_VARIANTS,
    "nocomm": ("--mode", "nocomm"),
    **UNIFORM_VARIANTS,
    **ADAPTIVE_VARIANTS,
    **COST_MODEL_VARIANTS,
    **STALENESS_VARIANTS,
}
"""Every variant this benchmark can run (``--modes`` picks some, by default
``DEFAULT_MODES``; vanilla is the baseline; ``uniform-1`` to ``uniform-8`` are
``adaqp`` at one constant width, ``adaqp`` itself being ``uniform-1`` on the GCN
workloads; ``adaqp-adaptive`` is the solver's widths)."""

WORKLOADS: dict[str, tuple[str, tuple[str, ...]]] = {
    # Sized so that a 2-core machine computes an epoch in a fraction of a second; the
    # default: halo rows that carry signal (Vanilla beats nocomm).
    "synthetic-signal": (SIGNAL_CONFIG, ("train.eval_every=1",)),
    # The earlier default, no communities: its halo rows lower the accuracy.
    "synthetic": (CLUSTER_CONFIG, ("train.eval_every=1",)),
    "cora": ("configs/cora-gcn.toml", ("model.layers=3", "model.hidden=256")),
    # The same size with community structure (how METIS cuts both: docs/datasets.md).
    "synthetic-local": ("configs/synthetic-local-gcn.toml", ("train.eval_every=1",)),
}


def read_run(run_dir: Path) -> dict[str, Any]:
    """What a benchmark run wrote: ``summary.json``, its epochs (``metrics.jsonl``, each
    with ``train_time_s`` so far) and its hosts' ``logs/cluster.json`` ({} where absent)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    try:  # what each host used (the emulated cluster's cluster.json; older runs lack it)
        cluster = json.loads((run_dir / "logs" / "cluster.json").read_text())
    except (OSError, ValueError):
        cluster = {}
    elapsed = 0.0
    for e in epochs:
        elapsed += step_time_s(e)
        e["train_time_s"] = elapsed
    return {"summary": summary, "epochs": epochs, "cluster": cluster}


def epoch_breakdown(summary: dict[str, Any]) -> dict[str, float]:
    """Epoch time split into compute, exchange wait, (de)quantization and all-reduce."""
    quant = summary["quant_time_s"] + summary["dequant_time_s"]
    wait, allreduce = summary["comm_wait_s"], summary["allreduce_time_s"]
    compute = max(summary["epoch_time_s"] - wait - quant - allreduce, 0.0)
    return {"compute_s": compute, "wait_s": wait, "quant_s": quant, "allreduce_s": allreduce}


def _time_to(epochs: list[dict[str, Any]], target: float) -> float | None:
    for e in epochs:
        if e["val_acc"] is not None and e["val_acc"] >= target:
            return e["train_time_s"]
    return None


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _ratios(
    summaries: list[dict[str, Any]], field: str, model: str = "predicted_exchange_s_by_tag"
) -> tuple[float, dict[str, float]]:
    """Measured (summary ``field``) over the model's exchange time (summary ``model``):
    all exchanges together and per exchange, means over seeds."""
    by_tag: dict[str, list[float]] = {}
    overall = []
    for s in summaries:
        predicted, measured = s.get(model, {}), s.get(field, {})
        tags = [t for t in predicted if predicted[t] > 0 and t in measured]
        for t in tags:
            by_tag.setdefault(t, []).append(measured[t] / predicted[t])
        if tags:
            overall.append(sum(measured[t] for t in tags) / sum(predicted[t] for t in tags))
    return _mean(overall), {t: _mean(v) for t, v in sorted(by_tag.items())}


def _planned(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """What adaptive runs planned: measured / predicted exchange time (per exchange and all
    exchanges together, means over seeds), measured as the slowest rank's span and from
    the last rank's arrival; and the mean width by host pair (first seed)."""
    if not summaries[0].get("predicted_exchange_s_by_tag"):
        return {}
    span, span_by_tag = _ratios(summaries, "exchange_span_s_by_tag")
    arrival, arrival_by_tag = _ratios(summaries, "exchange_after_arrival_s_by_tag")
    calibrated, calibrated_by_tag = _ratios(
        summaries, "exchange_after_arrival_s_by_tag", model="calibrated_exchange_s_by_tag"
    )
    first = summaries[0]
    hosts = first["host_of_rank"]
    by_hosts: dict[str, list[float]] = {}
    for pair, bits in first["plan_bits_by_pair"].items():
        src, dst = (int(r) for r in pair.split("->"))
        by_hosts.setdefault(f"{hosts[src]}->{hosts[dst]}", []).append(bits)

    def total(field: str) -> float:
        return _mean([sum(s.get(field, {}).values()) for s in summaries])

    return {
        "measured_over_predicted": span,
        "measured_over_predicted_by_tag": span_by_tag,
        "after_arrival_over_predicted": arrival,
        "after_arrival_over_predicted_by_tag": arrival_by_tag,
        "after_arrival_over_calibrated": calibrated,
        "after_arrival_over_calibrated_by_tag": calibrated_by_tag,
        "calibrated_exchange_s": total("calibrated_exchange_s_by_tag"),
        "predicted_exchange_s": total("predicted_exchange_s_by_tag"),
        "measured_exchange_s": total("exchange_span_s_by_tag"),
        "after_arrival_exchange_s": total("exchange_after_arrival_s_by_tag"),
        "host_of_rank": hosts,
        "bits_by_host_pair": {k: _mean(v) for k, v in sorted(by_hosts.items())},
    }


def _host_usage(clusters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host over seeds: its budget, mean CPU seconds and their share of the job's wall
    time (``cpu_share``: 0.5 is half a core throughout), and the highest peak memory."""
    measured = [c for c in clusters if c.get("elapsed_s") and c["hosts"][0].get("cpu_seconds")]
    if not measured:
        return []
    out = []
    for i, host in enumerate(measured[0]["hosts"]):
        cpu = [c["hosts"][i]["cpu_seconds"] for c in measured]
        peaks = [c["hosts"][i]["peak_memory_bytes"] or 0 for c in measured]
        out.append(
            {
                "host": i,
                "cpus": host.get("cpus"),
                "memory_limit_bytes": host.get("memory_limit_bytes"),
                "cpu_seconds": _mean(cpu),
                "cpu_share": _mean(
                    [c["hosts"][i]["cpu_seconds"] / c["elapsed_s"] for c in measured]
                ),
                "peak_memory_bytes": max(peaks),
                "elapsed_s": _mean([c["elapsed_s"] for c in measured]),
            }
        )
    return out


def _aggregate(
    runs: dict[str, list[dict[str, Any]]], seeds: list[int], tolerance: float = 0.0
) -> dict[str, Any]:
    """Means over seeds; time to accuracy per seed against that seed's vanilla run's final
    validation accuracy minus ``tolerance``."""
    out: dict[str, Any] = {}
    vanilla = runs["vanilla"]
    for mode, mode_runs in runs.items():
        summaries = [r["summary"] for r in mode_runs]
        parts = [epoch_breakdown(s) for s in summaries]
        times, ratios = [], []
        for run, base in zip(mode_runs, vanilla, strict=True):
            target = base["epochs"][-1]["val_acc"] - tolerance
            mine, theirs = _time_to(run["epochs"], target), _time_to(base["epochs"], target)
            times.append(mine)
            if mine is not None and theirs:
                ratios.append(mine / theirs)  # per seed, against that seed's vanilla
        reached = [t for t in times if t is not None]
        out[mode] = {
            "epoch_time_s": _mean([s["epoch_time_s"] for s in summaries]),
            # Older runs have no CPU time: NaN, shown as n/a.
            "cpu_time_s": _mean([s.get("cpu_time_s", math.nan) for s in summaries]),
            "breakdown": {k: _mean([p[k] for p in parts]) for k in parts[0]},
            "test_acc": _mean([s["test_acc"] for s in summaries]),
            "test_acc_std": statistics.stdev([s["test_acc"] for s in summaries])
            if len(summaries) > 1
            else 0.0,
            "halo_bytes_per_epoch": _mean([s["halo_bytes_per_epoch"] for s in summaries]),
            "avg_bits": _mean([s["avg_bits"] for s in summaries]),
            "hidden_comm_fraction": _mean([s["hidden_comm_fraction"] for s in summaries]),
            "max_staleness": max(s.get("max_staleness", 0) for s in summaries),
            "wait_share": _mean(
                [p["wait_s"] / s["epoch_time_s"] for p, s in zip(parts, summaries, strict=True)]
            ),
            "time_to_vanilla_val_s": _mean(reached) if reached else None,
            "runs_reaching_vanilla_val": len(reached),
            "time_to_accuracy_ratio": _mean(ratios) if ratios else None,
            "hosts": _host_usage([r.get("cluster", {}) for r in mode_runs]),
            **_planned(summaries),
        }
    base_epoch = out["vanilla"]["epoch_time_s"]
    nocomm = out.get("nocomm", {}).get("epoch_time_s")
    for entry in out.values():
        entry["speedup_over_vanilla"] = base_epoch / entry["epoch_time_s"]
        entry["ratio_to_nocomm"] = entry["epoch_time_s"] / nocomm if nocomm else None
        cpu = out.get("nocomm", {}).get("cpu_time_s")
        entry["cpu_ratio_to_nocomm"] = entry["cpu_time_s"] / cpu if cpu else None
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--name",
        default="cluster-signal-1gbit",
        help="name of this suite: results go to <--out-dir>/NAME/, runs to "
        "results/runs/bench-NAME/, the partition to partitions/bench-NAME/",
    )
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="synthetic-signal",
        help="what trains: synthetic-signal (configs/cluster-synthetic-signal-gcn.toml, 20k "
        "nodes whose halo rows carry signal), synthetic (configs/cluster-synthetic-gcn.toml, "
        "the earlier default, no communities), synthetic-local (communities, few cut edges) "
        "or cora (3 layers, hidden 256)",
    )
    parser.add_argument(
        "--model",
        choices=sorted(MODEL_SETTINGS),
        default=None,
        help="the model to train on the workload (default: its config's, GCN): sage as GCN, "
        "gat with 4 heads of 32 and lr 0.005; on synthetic-signal each model's recipe "
        "(adaqp.bench.SIGNAL_RECIPES: lr, warm-up, epochs); --set overrides them",
    )
    parser.add_argument("--hosts", type=int, default=4, help="emulated hosts (network namespaces)")
    parser.add_argument(
        "--procs-per-host", type=int, default=1, help="workers per host (they share its link)"
    )
    parser.add_argument(
        "--bandwidth",
        default="1gbit",
        help="tc rate of every host's link, or one per host: 300mbit,300mbit,300mbit,75mbit "
        '("" leaves the links unshaped)',
    )
    parser.add_argument(
        "--latency",
        default="",
        help="one-way delay per host link, e.g. 0.1ms, or one per host (default: none)",
    )
    add_budget_arguments(parser)
    parser.add_argument(
        "--seeds",
        type=seed_list,
        default="0,1,2",
        help="comma-separated training seeds, each running every mode",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="training epochs per run (default: on synthetic-signal the model's recipe, "
        "by which Vanilla's validation accuracy has plateaued; 100 on the others)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help=f"comma-separated subset of {', '.join(VARIANTS)}; must include vanilla",
    )
    add_run_options(parser)
    parser.add_argument(
        "--tta-tolerance",
        type=float,
        default=0.005,
        help="time-to-accuracy target: vanilla's final val acc minus this",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="rebuild table, JSON and plots from the runs already in results/runs/bench-NAME/",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="results go to OUT_DIR/NAME/; results/bench/cluster updates the committed "
        "reading NAME",
    )


def main(args: argparse.Namespace) -> int:
    seeds = args.seeds
    modes = chosen_variants("--modes", args.modes, VARIANTS)
    try:  # before any work: a typo in a link setting would otherwise end a long run
        links = host_links(args.hosts, args.bandwidth, args.latency)
        budgets_from(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    config, overrides = WORKLOADS[args.workload]
    model = MODEL_SETTINGS[args.model] if args.model else ()
    recipe = signal_recipe(config, args.model)
    if args.epochs is None:
        args.epochs = recipe.epochs if recipe else 100
    model = (*model, *recipe.overrides()) if recipe else model
    overrides = merge_overrides((*overrides, *model, *args.set))
    out_dir = args.out_dir / args.name
    runs_dir = Path("results/runs") / f"bench-{args.name}"
    part_dir = Path("partitions") / f"bench-{args.name}"
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    failed: dict[str, str] = {}
    if args.render_only:
        for mode in modes:
            runs[mode] = [read_run(runs_dir / f"{mode}-seed{seed}") for seed in seeds]
    else:
        failed = _run_all(args, links, modes, seeds, config, overrides, runs_dir, part_dir, runs)
    agg = _aggregate(runs, seeds, args.tta_tolerance)
    meta = {
        "name": args.name,
        "hosts": args.hosts,
        "procs_per_host": args.procs_per_host,
        "bandwidth": args.bandwidth,
        "latency": args.latency,
        "cpus_per_host": args.cpus_per_host,
        "memory_per_host": args.memory_per_host,
        "seeds": seeds,
        "epochs": args.epochs,
        "config": config,
        "model": args.model,
        "overrides": list(overrides),
        "tta_tolerance": args.tta_tolerance,
        "failed": failed,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cluster.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "aggregate": agg,
                "runs": {m: [r["summary"] for r in rs] for m, rs in runs.items()},
            },
            indent=2,
        )
        + "\n"
    )
    table = render(args.name, meta, agg)
    (out_dir / "cluster.md").write_text(table)
    plot(out_dir, runs, agg)
    print(table)
    print(f"-> {out_dir}")
    if failed:
        print(f"error: {len(failed)} of {len(modes)} modes failed: {', '.join(failed)}")
    return 1 if failed else 0


def _run_all(
    args, links, modes, seeds, config, overrides, runs_dir, part_dir, runs
) -> dict[str, str]:
    """Runs every mode and seed on one emulated cluster, appending to ``runs``. A run that
    fails is reported, its mode dropped from ``runs`` and its other seeds skipped, the
    other modes run on: returns the failed modes with their errors."""
    total, done = len(modes) * len(seeds), 0
    failed: dict[str, str] = {}
    try:
        budgets, cgroups = enforce(budgets_from(args), cpus_asked=args.cpus_per_host is not None)
    except CgroupError as exc:
        raise UsageError(str(exc)) from None
    with EmulatedCluster(args.hosts, links=links, budgets=budgets, cgroups=cgroups) as cluster:
        for mode, seed in run_order(modes, seeds):
            done += 1
            if mode in failed:
                continue
            run_dir = runs_dir / f"{mode}-seed{seed}"
            train_args = [
                "--config",
                config,
                *VARIANTS[mode],
                "--seed",
                str(seed),
                "--epochs",
                str(args.epochs),
                "--out",
                str(run_dir),
                "--overwrite",  # a benchmark re-run replaces its own runs
                "--set",
                "checkpoint.every=0",
                "--set",
                f"partition.dir={part_dir}",
                "--set",
                "metrics.progress=false",
            ]
            for item in overrides:
                train_args += ["--set", item]
            started = time.perf_counter()
            try:
                cluster.launch(args.procs_per_host, train_args, run_dir / "logs", args.timeout)
            except ClusterError as exc:
                print(f"[{done}/{total}] {mode} seed {seed}: failed, {exc}", flush=True)
                if mode == "vanilla":  # every comparison's baseline: nothing to compare
                    raise
                failed[mode] = f"seed {seed}: {exc}"
                del runs[mode]
                continue
            runs[mode].append(read_run(run_dir))
            s = runs[mode][-1]["summary"]
            print(
                f"[{done}/{total}] {mode} seed {seed}: epoch "
                f"{1e3 * s['epoch_time_s']:.1f} ms (wait {1e3 * s['comm_wait_s']:.1f}), "
                f"{s['halo_bytes_per_epoch'] / 1e6:.2f} MB/epoch, test acc "
                f"{s['test_acc']:.4f} ({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
    return failed
