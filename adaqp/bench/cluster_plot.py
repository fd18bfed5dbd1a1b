"""The figures of ``bench cluster``: epoch time breakdown, time to accuracy, bytes by layer,
and test accuracy against time to accuracy (``pareto.png``).

Drawn from the runs and aggregates ``adaqp.bench.cluster`` reads; without matplotlib
nothing is drawn and one warning says so (the JSON and table are written regardless).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaqp.bench import pyplot

FIGURES = (
    "breakdown.png",
    "time_to_accuracy.png",
    "curves.png",
    "bytes_by_layer.png",
    "pareto.png",
)


def plot(out_dir: Path, runs: dict[str, list[dict[str, Any]]], agg: dict[str, Any]) -> bool:
    """Writes the ``FIGURES``; False (and one warning) where matplotlib is not installed."""
    plt = pyplot(f"{', '.join(FIGURES)} in {out_dir}")
    if plt is None:
        return False
    modes = list(agg)
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(modes)
    for key, label in (
        ("compute_s", "compute"),
        ("wait_s", "exchange wait"),
        ("quant_s", "(de)quantization"),
        ("allreduce_s", "gradient all-reduce"),
    ):
        values = [1e3 * agg[m]["breakdown"][key] for m in modes]
        ax.bar(modes, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("epoch time (ms)")
    ax.set_title("Epoch time breakdown")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "breakdown.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in modes:
        if mode == "nocomm":
            continue  # its accuracy is not the graph's
        epochs = runs[mode][0]["epochs"]
        points = [(e["train_time_s"], e["val_acc"]) for e in epochs if e["val_acc"] is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], label=mode)
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("Time to accuracy (first seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "time_to_accuracy.png", dpi=120)
    plt.close(fig)

    _curves(plt, out_dir, runs, modes)
    _pareto(plt, out_dir, agg)

    tags = sorted({t for m in modes for t in runs[m][0]["summary"]["halo_bytes_by_tag"]})
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        by_tag = runs[mode][0]["summary"]["halo_bytes_by_tag"]
        ax.bar(
            [j + i * width for j in range(len(tags))],
            [by_tag.get(t, 0) / 1e6 for t in tags],
            width=width,
            label=mode,
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tags))], tags, rotation=20)
    ax.set_ylabel("MB per epoch (all ranks)")
    ax.set_title("Halo bytes per epoch by layer and direction")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "bytes_by_layer.png", dpi=120)
    plt.close(fig)
    return True


def _mean_curve(mode_runs: list[dict[str, Any]]) -> tuple[list[float], list[float], list[float]]:
    """Epochs evaluated in every seed's run, with the mean over seeds of the validation
    accuracy and of the training time up to that epoch."""
    by_run = [
        {
            e["epoch"]: (e["val_acc"], e["train_time_s"])
            for e in r["epochs"]
            if e["val_acc"] is not None
        }
        for r in mode_runs
    ]
    common = sorted(set.intersection(*(set(b) for b in by_run))) if by_run else []
    acc = [sum(b[e][0] for b in by_run) / len(by_run) for e in common]
    time_s = [sum(b[e][1] for b in by_run) / len(by_run) for e in common]
    return [float(e) for e in common], acc, time_s


def _curves(plt, out_dir: Path, runs: dict[str, list[dict[str, Any]]], modes: list[str]) -> None:
    """curves.png: validation accuracy (mean over seeds) against epochs and against
    training time, with Vanilla's final validation accuracy as a line."""
    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for mode in modes:
        if mode == "nocomm":
            continue
        epochs, acc, time_s = _mean_curve(runs[mode])
        by_epoch.plot(epochs, acc, label=mode)
        by_time.plot(time_s, acc, label=mode)
    if "vanilla" in runs:  # the target of the time-to-accuracy column
        finals = [r["epochs"][-1]["val_acc"] for r in runs["vanilla"]]
        for ax in (by_epoch, by_time):
            ax.axhline(sum(finals) / len(finals), color="grey", linestyle=":", linewidth=1)
    by_epoch.set_xlabel("epoch")
    by_time.set_xlabel("training time (s, evaluation excluded)")
    by_epoch.set_ylabel(f"validation accuracy (mean of {len(runs[modes[0]])} seeds)")
    by_epoch.legend(fontsize=8)
    fig.suptitle("Accuracy against epochs and against time")
    fig.tight_layout()
    fig.savefig(out_dir / "curves.png", dpi=120)
    plt.close(fig)


def pareto_points(agg: dict[str, Any]) -> tuple[list[tuple[str, float, float, float]], list[str]]:
    """``(mode, time to Vanilla's val as a ratio to Vanilla's, test acc, its std)`` of the
    modes that reached Vanilla's final validation accuracy in some seed, and the names of
    those that never did (drawn apart: they have no time)."""
    points, never = [], []
    for mode, a in agg.items():
        ratio = a.get("time_to_accuracy_ratio")
        if ratio is None:
            never.append(mode)
        else:
            points.append((mode, ratio, a["test_acc"], a["test_acc_std"]))
    return points, never


def _pareto(plt, out_dir: Path, agg: dict[str, Any]) -> None:
    """pareto.png: each mode's test accuracy (mean ± std over seeds) against its time to
    Vanilla's final validation accuracy; modes that never reach it sit in a column at the
    right, and ``nocomm``'s accuracy is a dotted line (what no halo rows at all give)."""
    points, never = pareto_points(agg)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    right = max((p[1] for p in points), default=1.0) * 1.25
    markers = "osD^vP*Xh<>p"
    # A legend, not labels by the points: the fast modes sit close together.
    for i, (mode, x, acc, std) in enumerate(
        [*points, *((m, right, agg[m]["test_acc"], agg[m]["test_acc_std"]) for m in never)]
    ):
        label = f"{mode} (never)" if mode in never else mode
        ax.errorbar([x], [acc], yerr=[std], fmt=markers[i % len(markers)], capsize=3, label=label)
    if "nocomm" in agg:
        ax.axhline(agg["nocomm"]["test_acc"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("time to Vanilla's final val acc (x Vanilla's; right column: never)")
    ax.set_ylabel("test accuracy (mean ± std over seeds)")
    ax.set_title("Accuracy against time to accuracy")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(out_dir / "pareto.png", dpi=120)
    plt.close(fig)
