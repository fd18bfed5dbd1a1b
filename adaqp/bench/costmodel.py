"""Cost model against measured exchange times, over saved emulated-cluster runs.

Reads the ``cluster.json`` that ``bench cluster`` wrote for each named cluster (nothing
is run again) and, for every adaptive run (mode and seed) and every exchange, sets the
cost model's calibrated time for the plan in force at the end (the time the planner
stated for a plan it was not fitted on) against the measured time of that exchange from
the last rank's arrival (median over that plan's epochs). Writes
``<--out-dir>/cost_model.json`` (every point, and the range of measured / calibrated per
cluster and mode) and, with matplotlib, ``cost_model.png`` (measured against calibrated,
log-log, with the tolerance band); ``--out-dir`` is ``results/local/bench/`` by default,
``results/bench/costmodel/<workload>`` updates a committed reading. Each cluster is read
from ``<--clusters-dir>/<NAME>/cluster.json``; by default from ``--out-dir``, else from the
committed cluster readings, ``results/bench/cluster/``. Without ``--clusters``, every
cluster result found there that holds an adaptive run with both times is read. The
committed reading, from the clusters it holds:

    python -m adaqp.bench costmodel \\
        --clusters-dir results/bench/costmodel/shared-vs-host/clusters \\
        --out-dir results/bench/costmodel/shared-vs-host
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from adaqp.bench import COMMITTED_OUT_DIR, DEFAULT_OUT_DIR, UsageError, pyplot

MODEL_FIELD = "calibrated_exchange_s_by_tag"
MEASURED_FIELD = "exchange_after_arrival_s_by_tag"

COMMITTED_CLUSTERS = COMMITTED_OUT_DIR / "cluster"
"""Where ``bench cluster --out-dir results/bench/cluster`` commits its readings."""


def points(cluster: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per adaptive mode, one point per seed and exchange of one ``cluster.json``."""
    seeds = cluster["meta"]["seeds"]
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for mode, summaries in cluster["runs"].items():
        for seed, summary in zip(seeds, summaries, strict=True):
            model, measured = summary.get(MODEL_FIELD) or {}, summary.get(MEASURED_FIELD) or {}
            for tag in sorted(model):
                if model[tag] > 0 and tag in measured:
                    by_mode.setdefault(mode, []).append(
                        {
                            "seed": seed,
                            "tag": tag,
                            "calibrated_s": model[tag],
                            "measured_s": measured[tag],
                            "ratio": measured[tag] / model[tag],
                        }
                    )
    return by_mode


def summarise(clusters: dict[str, dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """The report: per cluster and mode, the points and their ratio range."""
    report: dict[str, Any] = {"tolerance": tolerance, "clusters": {}}
    for name, cluster in clusters.items():
        modes = {}
        for mode, pts in points(cluster).items():
            ratios = [p["ratio"] for p in pts]
            modes[mode] = {
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "within_tolerance": all(abs(r - 1) <= tolerance for r in ratios),
                "points": pts,
            }
        if not modes:
            raise ValueError(
                f"{name}: no adaptive run with {MODEL_FIELD} and {MEASURED_FIELD} "
                "(written by bench cluster for adaqp-q, adaqp and their cost-model variants)"
            )
        report["clusters"][name] = {
            "bandwidth": cluster["meta"]["bandwidth"],
            "shaped": bool(cluster["meta"]["bandwidth"]),
            "modes": modes,
        }
    shaped = [c for c in report["clusters"].values() if c["shaped"]]
    report["within_tolerance_on_shaped_clusters"] = bool(shaped) and all(
        m["within_tolerance"] for c in shaped for m in c["modes"].values()
    )
    return report


def plot(report: dict[str, Any], path: Path) -> bool:
    """Writes the figure to ``path``; False (and one warning) without matplotlib."""
    plt = pyplot(str(path))
    if plt is None:
        return False

    fig, ax = plt.subplots(figsize=(9.5, 5.5))
    # Colour by cluster, marker by mode.
    colours = plt.get_cmap("tab20")
    modes = sorted({m for c in report["clusters"].values() for m in c["modes"]})
    markers = dict(zip(modes, "o^sDv<>ph*", strict=False))
    values = []
    for i, (name, cluster) in enumerate(report["clusters"].items()):
        for mode, entry in cluster["modes"].items():
            x = [1e3 * p["calibrated_s"] for p in entry["points"]]
            y = [1e3 * p["measured_s"] for p in entry["points"]]
            values += x + y
            label = f"{name.removeprefix('cluster-synthetic-')} {mode}"
            ax.scatter(x, y, color=colours(i % 20), marker=markers.get(mode, "x"), label=label)
    low, high = 0.8 * min(values), 1.25 * max(values)
    tol = report["tolerance"]
    ax.plot([low, high], [low, high], color="black", linewidth=1)
    for factor in (1 - tol, 1 + tol):
        ax.plot([low, high], [factor * low, factor * high], "--", color="grey", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("calibrated cost model (ms)")
    ax.set_ylabel("measured from the last rank's arrival (ms)")
    ax.set_title(f"Exchange time: measured against predicted (dashed: ±{tol:.0%})")
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clusters",
        help="comma-separated names of bench cluster results (directories holding "
        "cluster.json under --clusters-dir) (default: every one found there with an "
        "adaptive run that recorded both times)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.25,
        help="band around measured = calibrated that counts as a match (0.25: within 25%%)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="where cost_model.json and cost_model.png go; results/bench/costmodel/<workload> "
        "updates a committed reading",
    )
    parser.add_argument(
        "--clusters-dir",
        type=Path,
        help="where the named cluster results are read (default: --out-dir, else the "
        f"committed {COMMITTED_CLUSTERS}/)",
    )


def _places(args: argparse.Namespace) -> list[Path]:
    """Where cluster results are read, first first: ``--clusters-dir`` if given, else
    ``--out-dir`` and then the committed readings."""
    explicit = getattr(args, "clusters_dir", None)
    places = [explicit] if explicit else [args.out_dir, COMMITTED_CLUSTERS]
    return [Path(place) for place in dict.fromkeys(places)]


def readable_clusters(args: argparse.Namespace) -> dict[str, Path]:
    """Name -> ``cluster.json`` of every cluster result under ``_places`` with a point to
    compare (an adaptive run that recorded both times), sorted by name; where two places
    hold one name, the first place's."""
    found: dict[str, Path] = {}
    for place in _places(args):
        for path in sorted(place.glob("*/cluster.json")):
            if path.parent.name in found:
                continue
            try:
                if points(json.loads(path.read_text())):
                    found[path.parent.name] = path
            except (OSError, ValueError, KeyError, TypeError):  # unreadable or not bench's
                continue
    return dict(sorted(found.items()))


def _cluster_path(name: str, args: argparse.Namespace) -> Path:
    """Where the cluster ``name`` is read: ``--clusters-dir`` if given, else ``--out-dir``
    and then the committed readings."""
    paths = [place / name / "cluster.json" for place in _places(args)]
    found = next((path for path in paths if path.is_file()), None)
    if found is None:
        raise SystemExit(
            f"{' or '.join(map(str, paths))}: not found (run `python -m adaqp.bench cluster "
            f"--name {name}` first)"
        )
    return found


def _sources(args: argparse.Namespace) -> dict[str, Path]:
    """Name -> ``cluster.json`` of the clusters to read: those ``--clusters`` names, else
    every readable one (``readable_clusters``); UsageError where there are none."""
    if args.clusters is None:
        found = readable_clusters(args)
        if not found:
            where = " or ".join(f"{place}/NAME/cluster.json" for place in _places(args))
            raise UsageError(
                f"--clusters not given and no cluster result with adaptive runs in {where}: "
                "run python -m adaqp.bench cluster first, or name them with --clusters"
            )
        print(f"--clusters not given: reading all {len(found)} found: {', '.join(found)}")
        return found
    names = [n for n in args.clusters.split(",") if n]
    if not names:
        raise SystemExit("--clusters: name at least one bench cluster result")
    return {name: _cluster_path(name, args) for name in names}


def main(args: argparse.Namespace) -> int:
    clusters, sources = {}, {}
    for name, path in _sources(args).items():
        clusters[name] = json.loads(path.read_text())
        sources[name] = str(path)
    try:
        report = summarise(clusters, args.tolerance)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    report["sources"] = sources
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "cost_model.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out_dir / "cost_model.png")
    for name, cluster in report["clusters"].items():
        for mode, entry in cluster["modes"].items():
            print(
                f"{name} {mode}: measured / calibrated {entry['ratio_min']:.2f}-"
                f"{entry['ratio_max']:.2f} over {len(entry['points'])} exchanges"
            )
    print(
        f"within ±{args.tolerance:.0%} on every shaped cluster: "
        f"{report['within_tolerance_on_shaped_clusters']} -> {args.out_dir / 'cost_model.json'}"
    )
    return 0
