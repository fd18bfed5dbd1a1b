"""Strong scaling on emulated hosts (root): ``bench scaling --hosts 1,2,4``.

One graph, one worker per host, every host under the same CPU (and optionally memory)
budget on its own shaped link (``adaqp.emulate``): each mode runs at each host count,
and each point reads its epoch time (median after warm-up, ``summary.json``), its speedup
over the same mode on the sweep's fewest hosts and the parallel efficiency (speedup over
the host ratio), the halo bytes per epoch, and each host's peak memory (its control
group's counter in ``cluster.json``: resident memory and page cache, torchrun included).

Memory above the interpreter's baseline: before the runs, one host group under the same
budget runs torchrun with one worker that imports torch and adaqp's training path
(``adaqp.train``, ``adaqp.run.job``) and loads nothing (``BASELINE_CODE``); its group's
peak is the baseline subtracted from every point's peak.

The partitions (one per host count) are made here, before any run and outside every
budget; the runs reuse them (so the page cache of their files is charged to this process,
not to the hosts). Time to Vanilla's accuracy: training time (evaluation excluded) until the
validation accuracy reaches the fewest-hosts Vanilla run's final one, less a tolerance;
Vanilla is exact, so its curve is the same at every host count.

Writes ``scaling.json`` (``hosts_sweep``: one point per mode and host count; ``hosts_meta``),
``scaling.md`` and, with matplotlib, ``scaling.png`` (speedup against hosts, every mode,
ideal line; and peak memory above the baseline against hosts).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from adaqp.bench import (
    UsageError,
    chosen_variants,
    count_list,
    merge_overrides,
    pyplot,
    step_time_s,
)
from adaqp.bench.cluster import VARIANTS as CLUSTER_VARIANTS
from adaqp.bench.cluster import read_run
from adaqp.emulate import Budget, EmulatedCluster, host_budgets, host_links
from adaqp.emulate.cgroups import CgroupError, CgroupTree, find_cgroups

logger = logging.getLogger(__name__)

HOSTS_CONFIG = "configs/scaling-synthetic-signal-gcn.toml"
"""The sweep's default graph: the cluster workload's generator at 200k nodes / 2M edges."""
HOST_MODES = "vanilla,adaqp,onebit,nocomm"
VARIANTS: dict[str, tuple[str, ...]] = {**CLUSTER_VARIANTS, "onebit": ("--mode", "onebit")}
"""What ``--modes`` may name: the cluster benchmark's variants and ``onebit`` at its
defaults."""

BASELINE_CODE = "import torch, torch.distributed, adaqp.train, adaqp.run.job"
"""The baseline worker: the imports of a training worker, nothing loaded."""


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """The host sweep's options (``--epochs`` and ``--timeout`` are ``scaling``'s own)."""
    group = parser.add_argument_group(
        "host sweep (root; with --hosts, instead of the --world-sizes and partition parts)"
    )
    group.add_argument(
        "--hosts",
        type=count_list,
        default=None,
        help="comma-separated emulated host counts, one worker each, e.g. 1,2,4 (default: "
        "none, the --world-sizes and partition parts run instead)",
    )
    group.add_argument(
        "--cpus-per-host", default="0.5", help="CPU quota of every host, in cores (one value)"
    )
    group.add_argument(
        "--memory-per-host",
        default="",
        help="memory limit of every host, e.g. 3g, one value (default: none)",
    )
    group.add_argument(
        "--bandwidth", default="1gbit", help="tc rate of every host's link (one value)"
    )
    group.add_argument(
        "--modes",
        default=HOST_MODES,
        help="comma-separated modes run at every host count; must include vanilla",
    )
    group.add_argument("--config", default=HOSTS_CONFIG, help="the graph and model trained")
    group.add_argument("--seed", type=int, default=0, help="training seed of every run")
    group.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="extra config override for every run, repeatable",
    )
    group.add_argument(
        "--name", default="scaling-hosts", help="runs go to results/runs/bench-NAME/"
    )
    group.add_argument(
        "--tta-tolerance",
        type=float,
        default=0.005,
        help="time-to-accuracy target: Vanilla's final val acc on the fewest hosts minus this",
    )


def _peak(hosts: list[dict[str, Any]]) -> int | None:
    peaks = [h.get("peak_memory_bytes") for h in hosts]
    return max(peaks) if peaks and None not in peaks else None


def _time_to(epochs: list[dict[str, Any]], target: float) -> float | None:
    """Training time (``step_time_s``: the solves included, evaluation not) until the
    validation accuracy reaches ``target``."""
    elapsed = 0.0
    for e in epochs:
        elapsed += step_time_s(e)
        if e.get("val_acc") is not None and e["val_acc"] >= target:
            return elapsed
    return None


def build_points(
    results: list[dict[str, Any]], baseline_bytes: int | None, tolerance: float = 0.005
) -> list[dict[str, Any]]:
    """The ``hosts_sweep`` points from what each run wrote.

    Args:
        results: per run ``{"mode", "hosts", "summary": summary.json, "cluster":
            cluster.json, "epochs": metrics.jsonl records}`` (rank 0's), any order.
        baseline_bytes: the baseline host's peak memory (None: not measured).
        tolerance: time to accuracy's target is the fewest-hosts Vanilla run's final
            validation accuracy minus this.
    """
    fewest = min(r["hosts"] for r in results)
    one = {r["mode"]: r for r in results if r["hosts"] == fewest}
    vanilla = one.get("vanilla")
    target = None
    if vanilla and vanilla["epochs"]:
        finals = [e["val_acc"] for e in vanilla["epochs"] if e.get("val_acc") is not None]
        target = finals[-1] - tolerance if finals else None
    # Every mode does the same work on one host (no halo): their mean is the steadier rate.
    one_host_s = sum(r["summary"]["epoch_time_s"] for r in one.values()) / len(one)
    points = []
    for r in sorted(results, key=lambda r: (r["mode"], r["hosts"])):
        s, hosts = r["summary"], r["cluster"].get("hosts", [])
        base = one.get(r["mode"])
        speedup = base["summary"]["epoch_time_s"] / s["epoch_time_s"] if base else None
        peak = _peak(hosts)
        above = peak - baseline_bytes if peak is not None and baseline_bytes else None
        points.append(
            {
                "mode": r["mode"],
                "hosts": r["hosts"],
                "epoch_time_s": s["epoch_time_s"],
                "speedup": speedup,
                "efficiency": speedup * fewest / r["hosts"] if speedup else None,
                "speedup_over_fewest_hosts_mean": one_host_s / s["epoch_time_s"],
                "speedup_over_vanilla": vanilla["summary"]["epoch_time_s"] / s["epoch_time_s"]
                if vanilla
                else None,
                "comm_wait_s": s["comm_wait_s"],
                "cpu_time_s": s.get("cpu_time_s"),
                "halo_mb_per_epoch": s["halo_bytes_per_epoch"] / 1e6,
                "avg_bits": s["avg_bits"],
                "peak_memory_bytes": peak,
                "peak_memory_above_baseline_bytes": above,
                "peak_memory_by_host": [h.get("peak_memory_bytes") for h in hosts],
                "cpu_share_by_host": [
                    h["cpu_seconds"] / r["cluster"]["elapsed_s"]
                    if h.get("cpu_seconds") and r["cluster"].get("elapsed_s")
                    else None
                    for h in hosts
                ],
                "test_acc": s["test_acc"],
                "final_val_acc": next(
                    (e["val_acc"] for e in reversed(r["epochs"]) if e.get("val_acc") is not None),
                    None,
                ),
                "time_to_vanilla_val_s": _time_to(r["epochs"], target)
                if target is not None
                else None,
                "elapsed_s": r["cluster"].get("elapsed_s"),
                "load_before": r.get("load_before"),
            }
        )
    for p in points:  # memory above the baseline, as a share of the same mode's fewest-hosts
        base = next((q for q in points if q["mode"] == p["mode"] and q["hosts"] == fewest), None)
        mine, theirs = (
            p["peak_memory_above_baseline_bytes"],
            (base or {}).get("peak_memory_above_baseline_bytes"),
        )
        p["memory_above_baseline_ratio"] = mine / theirs if mine and theirs else None
    return points


def run_order(modes: list[str], hosts: list[int]) -> list[tuple[str, int]]:
    """Mode after mode, each through every host count, the direction turning at each mode
    (1, 2, 4, then 4, 2, 1): a machine that slows down over the sweep (it is shared) then
    slows no host count more than another."""
    return [
        (mode, h) for j, mode in enumerate(modes) for h in (hosts if j % 2 == 0 else hosts[::-1])
    ]


def measure_baseline(tree: CgroupTree, cpus: float | None, timeout_s: float) -> int:
    """Peak memory of a host group (budget ``cpus``) running torchrun with one worker
    that runs ``BASELINE_CODE``, in a namespace of its own."""
    with EmulatedCluster(1, links=host_links(1, "")) as cluster:
        group = tree.group(f"aq{cluster.tag}-base")
        try:
            group.create(Budget(cpus=cpus))
            cmd = group.wrap(
                [
                    *("ip", "netns", "exec", cluster.host_ns(0), "env", "OMP_NUM_THREADS=1"),
                    *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
                    *("--nproc-per-node", "1", "--no-python", sys.executable, "-c"),
                    BASELINE_CODE,
                ]
            )
            subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s)
            peak = group.usage().peak_memory_bytes
        finally:
            group.remove()
    if peak is None:
        raise CgroupError("the baseline host's peak memory could not be read")
    return peak


def _train_args(args, mode: str, hosts: int, run_dir: Path) -> list[str]:
    part_dir = Path("partitions") / f"bench-{args.name}-h{hosts}"
    out = [
        *("--config", args.config, *VARIANTS[mode], "--seed", str(args.seed)),
        *("--epochs", str(args.epochs), "--out", str(run_dir), "--overwrite"),
        *("--set", "checkpoint.every=0", "--set", "metrics.progress=false"),
        *("--set", f"partition.dir={part_dir}"),
    ]
    for item in merge_overrides(args.set):
        out += ["--set", item]
    return out


def _partition(args, hosts: int) -> float:
    """Makes (or reuses) the partition for ``hosts`` parts here, outside every budget."""
    from adaqp.config import load_config
    from adaqp.partitioning.build import ensure_partition

    config = load_config(args.config, merge_overrides(args.set))
    started = time.perf_counter()
    ensure_partition(
        config.data, config.partition, hosts, Path("partitions") / f"bench-{args.name}-h{hosts}"
    )
    return time.perf_counter() - started


def run_point(args, tree: CgroupTree | None, mode: str, hosts: int) -> dict[str, Any]:
    """One training job of ``mode`` on ``hosts`` budgeted hosts; what it wrote."""
    links = host_links(hosts, args.bandwidth)
    budgets = host_budgets(hosts, args.cpus_per_host, args.memory_per_host)
    run_dir = Path("results/runs") / f"bench-{args.name}" / f"{mode}-h{hosts}"
    load = os.getloadavg()[0]
    with EmulatedCluster(hosts, links=links, budgets=budgets, cgroups=tree) as cluster:
        cluster.launch(1, _train_args(args, mode, hosts, run_dir), run_dir / "logs", args.timeout)
    run = read_run(run_dir)
    if not run["cluster"]:  # what each host used is what the sweep measures
        raise FileNotFoundError(f"{run_dir / 'logs' / 'cluster.json'} is missing or unreadable")
    return {"mode": mode, "hosts": hosts, "load_before": load, **run}


def check_host_values(args: argparse.Namespace) -> None:
    """``--cpus-per-host``, ``--memory-per-host`` and ``--bandwidth`` each hold one value
    that every host of every point gets: the points differ in their host count, so a list
    of one value per host fits none but one of them.

    Raises:
        UsageError: a list, or a value that cannot be read.
    """
    for flag, value in (
        ("--cpus-per-host", args.cpus_per_host),
        ("--memory-per-host", args.memory_per_host),
        ("--bandwidth", args.bandwidth),
    ):
        if "," in value:
            raise UsageError(
                f"{flag} {value}: the host sweep gives every host the same value; give one, "
                "not a list (python -m adaqp.cluster takes one per host)"
            )
    try:
        host_budgets(1, args.cpus_per_host, args.memory_per_host)
        host_links(1, args.bandwidth)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run_sweep(args: argparse.Namespace) -> int:
    """The host sweep (``--hosts``): runs, then ``scaling.json``, ``.md`` and ``.png``."""
    modes = chosen_variants("--modes", args.modes, VARIANTS)
    check_host_values(args)
    try:
        tree = find_cgroups()
    except CgroupError as exc:
        raise UsageError(f"the host sweep needs control groups: {exc}") from None
    try:
        return _sweep(args, modes, tree)
    finally:
        tree.release()  # v2: this process's group as it was


def _sweep(args: argparse.Namespace, modes: list[str], tree: CgroupTree) -> int:
    """Partitions, the baseline, every point (hosts' groups made under ``tree``), the report."""
    partition_s = {h: _partition(args, h) for h in args.hosts}
    cpus = host_budgets(1, args.cpus_per_host)[0].cpus
    baseline = measure_baseline(tree, cpus, args.timeout)
    print(f"baseline host: peak {baseline / 2**20:.0f} MiB", flush=True)
    results, failed = [], {}
    for mode, hosts in run_order(modes, args.hosts):
        started = time.perf_counter()
        try:
            results.append(run_point(args, tree, mode, hosts))
        except Exception as exc:  # noqa: BLE001 - reported, the sweep goes on
            failed[f"{mode}-h{hosts}"] = str(exc)
            print(f"{mode} on {hosts} host{'s' * (hosts != 1)}: failed, {exc}", flush=True)
            continue
        s = results[-1]["summary"]
        print(
            f"{mode} on {hosts} host{'s' * (hosts != 1)}: epoch {1e3 * s['epoch_time_s']:.0f} ms, "
            f"{s['halo_bytes_per_epoch'] / 1e6:.1f} MB/epoch, peak "
            f"{(_peak(results[-1]['cluster']['hosts']) or 0) / 2**20:.0f} MiB/host, test "
            f"{s['test_acc']:.4f} ({time.perf_counter() - started:.0f}s)",
            flush=True,
        )
    points = build_points(results, baseline, args.tta_tolerance) if results else []
    meta = {
        "config": args.config,
        "overrides": merge_overrides(args.set),
        "hosts": args.hosts,
        "modes": modes,
        "cpus_per_host": args.cpus_per_host,
        "memory_per_host": args.memory_per_host,
        "bandwidth": args.bandwidth,
        "epochs": args.epochs,
        "seed": args.seed,
        "baseline_peak_memory_bytes": baseline,
        "baseline": "peak of one host group under the same CPU budget running torchrun and "
        f"one worker that runs {BASELINE_CODE!r}",
        "partition_s": partition_s,
        "tta_tolerance": args.tta_tolerance,
        "machine_cores": os.cpu_count(),
        "failed": failed,
        "command": "python -m adaqp.bench " + " ".join(sys.argv[1:]),
    }
    write_report(args.out_dir, meta, points)
    return 1 if failed else 0


def write_report(out_dir: Path, meta: dict[str, Any], points: list[dict[str, Any]]) -> None:
    """``scaling.json`` (``hosts_sweep``, ``hosts_meta``), ``scaling.md`` and the figure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"machine_cores": meta["machine_cores"], "hosts_meta": meta, "hosts_sweep": points}
    (out_dir / "scaling.json").write_text(json.dumps(report, indent=2) + "\n")
    table = render(meta, points)
    (out_dir / "scaling.md").write_text(table)
    plot(out_dir / "scaling.png", points)
    print(table)
    print(f"-> {out_dir / 'scaling.md'}")


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt % value


def render(meta: dict[str, Any], points: list[dict[str, Any]]) -> str:
    """The sweep's Markdown table."""
    mib = 2**20
    lines = [
        f"# Strong scaling on emulated hosts ({meta['machine_cores']} cores)",
        "",
        f"`{meta['config']}`, {meta['epochs']} epochs, seed {meta['seed']}; one worker per "
        f"host, {meta['cpus_per_host']} cores per host, links {meta['bandwidth']}, memory "
        f"limit {meta['memory_per_host'] or 'none'}. Baseline host (imports only): "
        f"{meta['baseline_peak_memory_bytes'] / mib:.0f} MiB. Partitioned beforehand, "
        "outside the budgets. Speedup: over the same mode on the fewest hosts.",
        "",
        "| mode | hosts | epoch ms | speedup | efficiency | wait ms | halo MB/epoch | peak MiB/host"
        " | above baseline MiB | vs fewest hosts | test acc | time to Vanilla's val s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p['mode']} | {p['hosts']} | {1e3 * p['epoch_time_s']:.0f} | "
            f"{_cell(p['speedup'], '%.2fx')} | {_cell(p['efficiency'], '%.2f')} | "
            f"{1e3 * p['comm_wait_s']:.0f} | {p['halo_mb_per_epoch']:.1f} | "
            f"{_cell(p['peak_memory_bytes'] and p['peak_memory_bytes'] / mib, '%.0f')} | "
            f"{_cell(p['peak_memory_above_baseline_bytes'] and p['peak_memory_above_baseline_bytes'] / mib, '%.0f')} | "  # noqa: E501
            f"{_cell(p['memory_above_baseline_ratio'], '%.2fx')} | {p['test_acc']:.4f} | "
            f"{_cell(p['time_to_vanilla_val_s'], '%.1f')} |"
        )
    if meta.get("failed"):
        lines += ["", "Failed: " + "; ".join(f"{k}: {v}" for k, v in meta["failed"].items())]
    return "\n".join(lines) + "\n"


def plot(path: Path, points: list[dict[str, Any]]) -> bool:
    """Speedup against hosts (every mode, Vanilla's too, and the ideal line) beside peak
    memory above the baseline; False (one warning) without matplotlib."""
    plt = pyplot(str(path))
    if plt is None:
        return False
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    hosts = sorted({p["hosts"] for p in points})
    a.plot(hosts, [h / hosts[0] for h in hosts], "k:", label="ideal")
    for mode in dict.fromkeys(p["mode"] for p in points):
        mine = [p for p in points if p["mode"] == mode]
        style = "o-" if mode != "vanilla" else "s--"
        a.plot([p["hosts"] for p in mine], [p["speedup"] or math.nan for p in mine], style,
               label=mode)  # fmt: skip
        b.plot(
            [p["hosts"] for p in mine],
            [(p["peak_memory_above_baseline_bytes"] or math.nan) / 2**30 for p in mine],
            style,
            label=mode,
        )
    a.set(xlabel="hosts", ylabel="epochs per second over the fewest hosts'", xticks=hosts)
    a.set_title("speedup")
    a.legend()
    b.set(xlabel="hosts", ylabel="GiB per host", xticks=hosts)
    b.set_title("peak memory above the baseline")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
