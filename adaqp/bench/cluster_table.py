"""The ``cluster.md`` table of ``python -m adaqp.bench cluster``: one row per mode, what
each host used (CPU and peak memory), the adaptive modes' plans against their measured
exchanges, and the runs that failed."""

from __future__ import annotations

import math
from typing import Any

from adaqp.bench import NOCOMM_ACC_NOTE, bits_cell, merge_overrides


def accuracy(mode: str, a: dict[str, Any]) -> str:
    """A mode's test accuracy cell: mean ± std over seeds, ``nocomm``'s marked."""
    note = f" ({NOCOMM_ACC_NOTE})" if mode == "nocomm" else ""
    return f"{a['test_acc']:.4f} ± {a['test_acc_std']:.4f}{note}"


def render(name: str, meta: dict[str, Any], agg: dict[str, Any]) -> str:
    """``cluster.md``: the mode table, then what the adaptive modes planned, then the runs
    that failed (``meta["failed"]``), if any."""

    def fmt(value, pattern: str) -> str:
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        return "n/a" if missing else pattern.format(value)

    lines = [
        f"# {name}: {meta['hosts']} emulated hosts x {meta['procs_per_host']} worker, "
        f"{meta['bandwidth']} links{' ' + meta['latency'] if meta.get('latency') else ''}, "
        f"{meta['epochs']} epochs, seeds {meta['seeds']}",
        "",
        f"Workload: `{meta['config']}` with {', '.join(merge_overrides(meta['overrides']))}.",
        "Epoch times are medians after warm-up, means over seeds; `nocomm` skips the halo "
        f"exchange (benchmark-only): its test accuracy, marked ({NOCOMM_ACC_NOTE}), is each "
        "part trained without its halo rows, so Vanilla's lead over it is what the halo "
        "rows carry. `uniform-N`: `adaqp` with every message at N bits. Time to vanilla val: "
        "training time (evaluation excluded) until the validation accuracy reaches the same "
        f"seed's vanilla final value minus {meta['tta_tolerance']:.3f}, as a ratio to "
        "vanilla's own time, averaged over the seeds that get there (counted). CPU ms: "
        "CPU time of a worker's process per epoch (all its threads), which waiting and "
        "being descheduled do not add to.",
        "",
        "| mode | epoch ms | compute | exchange wait | (de)quant | all-reduce | CPU ms "
        "| halo MB/epoch | avg bits | max staleness | test acc | speedup vs vanilla "
        "| ratio to nocomm | CPU ratio to nocomm | time to vanilla val |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, a in agg.items():
        b = a["breakdown"]
        lines.append(
            f"| {mode} | {1e3 * a['epoch_time_s']:.1f} | {1e3 * b['compute_s']:.1f} "
            f"| {1e3 * b['wait_s']:.1f} | {1e3 * b['quant_s']:.1f} | {1e3 * b['allreduce_s']:.1f} "
            f"| {fmt(1e3 * a['cpu_time_s'], '{:.1f}')} | {a['halo_bytes_per_epoch'] / 1e6:.2f} | "
            f"{bits_cell(a['avg_bits'], a['halo_bytes_per_epoch'])} | {a.get('max_staleness', 0)} "
            f"| {accuracy(mode, a)} | {a['speedup_over_vanilla']:.2f}x "
            f"| {fmt(a['ratio_to_nocomm'], '{:.2f}x')} "
            f"| {fmt(a['cpu_ratio_to_nocomm'], '{:.2f}x')} "
            f"| {fmt(a['time_to_accuracy_ratio'], '{:.2f}x')} "
            f"({a['runs_reaching_vanilla_val']}/{len(meta['seeds'])} seeds) |"
        )
    lines += _host_usage_lines(agg)
    planned = {m: a for m, a in agg.items() if "bits_by_host_pair" in a}
    if planned:
        pairs = sorted({p for a in planned.values() for p in a["bits_by_host_pair"]})
        lines += [
            "",
            "Adaptive modes: the planner's cost model against the measured exchange "
            "((de)quantization + transfer, median over the epochs of the last plan, summed "
            "over exchanges, mean over seeds), measured two ways: the slowest rank's span "
            "(it includes waiting for peers that reach the exchange later), and from the "
            "last rank's arrival to the last rank's rows (the exchange alone, which is what "
            "the model prices); and the model's times through the calibration fitted on "
            "the exchanges measured before the last solve (`cost_calibration`). Then the "
            "mean planned width by sending -> receiving host (first seed; 32 = full "
            "precision).",
            "",
            "| mode | predicted ms | span ms | span / predicted | after arrival ms "
            "| after arrival / predicted | calibrated ms | after arrival / calibrated "
            "| after arrival / calibrated by exchange | "
            + " | ".join(f"bits {p}" for p in pairs)
            + " |",
            "|---|---|---|---|---|---|---|---|---|" + "---|" * len(pairs),
        ]
        for mode, a in planned.items():
            bits = a["bits_by_host_pair"]
            by_tag = ", ".join(
                f"{t} {r:.2f}" for t, r in a["after_arrival_over_calibrated_by_tag"].items()
            )
            lines.append(
                f"| {mode} | {1e3 * a['predicted_exchange_s']:.1f} "
                f"| {1e3 * a['measured_exchange_s']:.1f} | {a['measured_over_predicted']:.2f} "
                f"| {1e3 * a['after_arrival_exchange_s']:.1f} "
                f"| {fmt(a['after_arrival_over_predicted'], '{:.2f}')} "
                f"| {1e3 * a['calibrated_exchange_s']:.1f} "
                f"| {fmt(a['after_arrival_over_calibrated'], '{:.2f}')} "
                f"| {by_tag or 'n/a'} | "
                + " | ".join(fmt(bits.get(p), "{:.2f}") for p in pairs)
                + " |"
            )
    failed = meta.get("failed") or {}
    if failed:
        lines += ["", "Failed (left out of the tables above; their other seeds not run):", ""]
        lines += [f"- {mode}: {error}" for mode, error in failed.items()]
    return "\n".join(lines) + "\n"


def _budget(host: dict[str, Any]) -> str:
    cpus, memory = host.get("cpus"), host.get("memory_limit_bytes")
    parts = [f"{cpus:g} CPU" if cpus else "CPU unlimited"]
    parts.append(f"{memory / 2**20:.0f} MiB" if memory else "memory unlimited")
    return ", ".join(parts)


def _host_usage_lines(agg: dict[str, Any]) -> list[str]:
    """Per mode and host: CPU seconds of the whole job (all the host's processes, start-up
    included), their share of its wall time, and the peak memory; empty for runs made
    without the hosts' control groups."""
    measured = {m: a["hosts"] for m, a in agg.items() if a.get("hosts")}
    if not measured:
        return []
    hosts = next(iter(measured.values()))
    lines = [
        "",
        "What each host used over the whole job (its control group: every process, start-up "
        "and evaluation included; means over seeds, the peak the highest): CPU seconds, "
        "their share of the job's wall time in cores, and peak memory (page cache "
        "included, as the kernel charges it). Budgets: "
        + "; ".join(f"host {h['host']} {_budget(h)}" for h in hosts)
        + ".",
        "",
        "| mode | wall s | "
        + " | ".join(f"host {h['host']} CPU s (cores)" for h in hosts)
        + " | "
        + " | ".join(f"host {h['host']} peak MiB" for h in hosts)
        + " |",
        "|---|---|" + "---|" * (2 * len(hosts)),
    ]
    for mode, usage in measured.items():
        lines.append(
            f"| {mode} | {usage[0]['elapsed_s']:.1f} | "
            + " | ".join(f"{h['cpu_seconds']:.1f} ({h['cpu_share']:.2f})" for h in usage)
            + " | "
            + " | ".join(f"{h['peak_memory_bytes'] / 2**20:.0f}" for h in usage)
            + " |"
        )
    return lines
