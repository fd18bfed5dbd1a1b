"""The reading's tables from ``measure.py``'s rank files, beside the prediction.

    .venv/bin/python results/bench/memory/phases/table.py DIR... --json phases.json

Each DIR holds one run's ``rank<r>.json``. A run with glibc's allocator set through the
environment (``MALLOC_*``) or ``--trim`` is a variant: it appears only in the epochs'
table. Prints, as markdown:

- per run, the largest rank's phases: resident set, the phase's own peak, what is
  allocated and by whom, glibc's free chunks;
- each term at its largest over the instrumented epoch, above the baseline (the runtime
  before the part is loaded), P = 4 against P = 1;
- the peak of the instrumented epoch and of its training step, term by term, against
  ``adaqp.memory``'s prediction (``terms_per_worker``, same config, mode and overrides);
- every run's peaks epoch by epoch, glibc's free chunks and the step's wall time.

``--json`` writes every rank's records, the terms and the predictions (floats to two
decimals, one line).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from adaqp.config import load_config
from adaqp.memory.estimate import predict

MB = 2**20
BASELINE = "start-up: partition ready"
"""The phase whose end is the baseline: the runtime (interpreter, torch, numba's kernels,
the process group) before the part is loaded."""
EPOCH = ("train:", "eval:")
"""The instrumented epoch's phases: its step, then its evaluation."""

GROUPS = {
    "features": ("features",),
    "part arrays": ("part arrays",),
    "matrices (every row's, the layers' cuts, transposes, ids)": ("matrix", "matrices'"),
    "index copies (input ids, layer rows, selections, transport ids)": (
        "global ids of the input rows",
        "rows (send list",
        "exchange selection",
        "transport: global ids",
    ),
    "parameters, Adam": ("parameters", "optimizer state"),
    "policy, buckets, other held": ("exchange policy", "gradient buckets", "anything else"),
}
"""Held storages by term: an owner of ``measure.held_owners`` goes to the first group one
of whose words its name contains."""

PREDICTED = {
    "baseline (runtime)": "runtime",
    "features": "features",
    "part arrays": "graph",
    "matrices (every row's, the layers' cuts, transposes, ids)": "adjacency",
    "parameters, Adam": "parameters",
}
"""The measured term each predicted term stands for. The prediction's ``activations`` (its
walk of a step and an evaluation, ``adaqp.memory.step``) stand for the saved tensors, the
exchange buffers, the tensors in hand and the rise together: a row of their own."""

WALKED = ("saved for backward", "exchange buffers", "other tensors in hand", "rise within")
"""The measured terms the prediction's ``activations`` stand for (their names' starts)."""


def rounded(obj):
    """``obj`` with its floats to two decimals (MiB, seconds): the JSON stays small."""
    if isinstance(obj, float):
        return round(obj, 2)
    if isinstance(obj, dict):
        return {k: rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v) for v in obj]
    return obj


def fmt(x: float) -> str:
    return f"{x:,.0f}"


def cell(text: str) -> str:
    """``text`` in a markdown table's cell (a phase's name may hold a ``|``)."""
    return text.replace("|", "\\|")


def group_of(owner: str) -> str:
    for group, words in GROUPS.items():
        if any(word in owner for word in words):
            return group
    return "policy, buckets, other held"


def label_of(rank: dict) -> str:
    label = f"P = {rank['world_size']}, {rank['mode']}"
    for key, value in sorted(rank.get("malloc_env", {}).items()):
        label += f", {key}={value}"
    return label + (", malloc_trim after each step" if rank.get("trim") else "")


def is_variant(rank: dict) -> bool:
    return bool(rank.get("malloc_env") or rank.get("trim"))


def peak_phase(rank: dict, passes: tuple[str, ...] = EPOCH) -> tuple[int, dict]:
    """The index and record of the phase (of ``passes``) with the highest peak."""
    phases = rank["phases"]
    index = max(
        (i for i, r in enumerate(phases) if r["phase"].startswith(passes)),
        key=lambda i: phases[i]["peak_mb"],
    )
    return index, phases[index]


def split(record: dict, base: dict) -> dict[str, float]:
    """A census record above the baseline's: the allocated bytes by kind, and the
    resident set outside tensors (code and files mapped, glibc's free chunks, the rest:
    Python's objects, malloc's chunks that are not tensors, thread stacks)."""
    owners = record["allocated_by_owner_mb"]
    kept = record["malloc_mb"]["kept_free"]
    base_kept = base["malloc_mb"]["kept_free"]
    outside = record["rss_mb"] - record["allocated_mb"] - record["file_mb"] - kept
    base_outside = base["rss_mb"] - base["allocated_mb"] - base["file_mb"] - base_kept
    in_hand = sum(owners.get(k, 0.0) for k in ("other", "gradients", "buckets"))
    return {
        "saved for backward": sum(v for k, v in owners.items() if k.startswith("saved")),
        "exchange buffers": owners.get("exchange", 0.0),
        "other tensors in hand (activations, gradients)": in_hand - base["allocated_mb"],
        "code and files paged in": record["file_mb"] - base["file_mb"],
        "glibc's free chunks kept": kept - base_kept,
        "other memory outside tensors": outside - base_outside,
    }


def held_terms(rank: dict) -> dict[str, float]:
    out = dict.fromkeys(GROUPS, 0.0)
    for owner, mb in rank["held_mb"].items():
        out[group_of(owner)] += mb
    return out


def terms(rank: dict, passes: tuple[str, ...] = EPOCH) -> dict[str, float | str]:
    """The peak of the phases ``passes``, MiB: the baseline, then where the peak phase
    begins what is held (by group) and the rest of ``split``, then the rise within it."""
    phases = {r["phase"]: r for r in rank["phases"]}
    base = phases[BASELINE]
    index, peak = peak_phase(rank, passes)
    start = rank["phases"][index - 1]
    out: dict[str, float | str] = {"peak phase": peak["phase"]}
    out["baseline (runtime)"] = base["rss_mb"]
    out.update(held_terms(rank))
    out.update(split(start, base))
    out["rise within the peak phase"] = peak["peak_mb"] - start["rss_mb"]
    out["peak"] = peak["peak_mb"]
    return out


def largest_terms(rank: dict) -> dict[str, float]:
    """Each term at its largest over the instrumented epoch's records, above the
    baseline; and the epoch's peak above the baseline."""
    phases = {r["phase"]: r for r in rank["phases"]}
    base = phases[BASELINE]
    records = [r for r in rank["phases"] if r["phase"].startswith(EPOCH)]
    out = held_terms(rank)
    for record in records:
        for name, mb in split(record, base).items():
            out[name] = max(out.get(name, 0.0), mb)
    out["the epoch's peak"] = peak_phase(rank)[1]["peak_mb"] - base["rss_mb"]
    return out


def phase_table(rank: dict) -> list[str]:
    lines = [
        "| phase | RSS | peak | allocated | held | saved | exchange | in hand | glibc free |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rank["phases"]:
        if r["phase"].startswith("warm-up"):
            continue  # the epochs' table has them
        owners = r.get("allocated_by_owner_mb", {})
        saved = sum(v for k, v in owners.items() if k.startswith("saved"))
        in_hand = sum(owners.get(k, 0.0) for k in ("other", "gradients", "buckets"))
        census = [r.get("allocated_mb", 0), owners.get("held", 0), saved]
        census += [owners.get("exchange", 0), in_hand]
        cells = [fmt(r["rss_mb"]), fmt(r.get("peak_mb", r["rss_mb"]))]
        cells += [fmt(x) if "allocated_mb" in r else "" for x in census]
        cells.append(fmt(r.get("malloc_mb", {}).get("kept_free", 0)))
        lines.append(f"| {cell(r['phase'])} | " + " | ".join(cells) + " |")
    return lines


def print_terms(out: dict, labels: list[str], key: str) -> None:
    print("| term | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for name in out[labels[0]][key][0]:
        cells = []
        for label in labels:
            run = out[label]
            rank = run["largest_rank"]
            measured = run[key][rank][name]
            predicted = run["prediction"]["terms_per_worker"][rank]
            if isinstance(measured, str):
                cells.append(cell(measured))
            elif name == "peak":
                peak = run["prediction"]["peak_memory_bytes_per_worker"][rank]
                cells.append(f"{fmt(measured)} ({fmt(peak / MB)})")
            elif name in PREDICTED:
                cells.append(f"{fmt(measured)} ({fmt(predicted[PREDICTED[name]] / MB)})")
            else:
                cells.append(fmt(measured))
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for label in labels:
        run = out[label]
        rank = run["largest_rank"]
        walked = sum(
            v for k, v in run[key][rank].items() if k.startswith(WALKED) and not isinstance(v, str)
        )
        predicted = run["prediction"]["terms_per_worker"][rank]["activations"] / MB
        where = run["prediction"].get("peak_phase_per_worker", [""] * (rank + 1))[rank]
        cells.append(f"{fmt(walked)} ({fmt(predicted)}: {cell(where)})")
    print("| the step's tensors (saved, exchange, in hand, rise) | " + " | ".join(cells) + " |")


def print_ratios(out: dict, labels: list[str]) -> None:
    """Each term at its largest, P = 4 against P = 1 of the same mode."""
    pairs = []
    for label in labels:
        if label.startswith("P = 1,"):
            other = "P = 4," + label.removeprefix("P = 1,")
            if other in out:
                pairs.append((label, other))
    header = [f"{a} | {b} | P = 4 / P = 1" for a, b in pairs]
    print("| term | " + " | ".join(header) + " |")
    print("|---|" + "---|---|---|" * len(pairs))
    first = out[pairs[0][0]]
    for name in largest_terms(first["ranks"][first["largest_rank"]]):
        cells = []
        for a, b in pairs:
            x, y = (out[r]["largest_terms_mb"][name] for r in (a, b))
            ratio = f"{y / x:.2f}" if x >= 1 else "new" if y >= 1 else ""
            cells += [fmt(x), fmt(y), ratio]
        print(f"| {name} | " + " | ".join(cells) + " |")


def print_epochs(out: dict) -> None:
    """Every run's peaks epoch by epoch (the largest over ranks)."""
    any_run = next(iter(out.values()))["ranks"][0]
    epochs = [
        r["phase"].split("(epoch ")[1].rstrip(")")
        for r in any_run["phases"]
        if r["phase"].startswith("warm-up: step")
    ]
    last = str(int(epochs[-1]) + 1)
    print("| run | " + " | ".join(epochs + [f"{last} (instrumented)"]) + " | evaluations |")
    print("|---|" + "---|" * (len(epochs) + 2))
    for label, run in out.items():
        peaks = []
        for epoch in epochs:
            name = f"warm-up: step (epoch {epoch})"
            peaks.append(
                max(p["peak_mb"] for r in run["ranks"] for p in r["phases"] if p["phase"] == name)
            )
        peaks.append(max(peak_phase(r, ("train:",))[1]["peak_mb"] for r in run["ranks"]))
        evals = [
            p["peak_mb"]
            for r in run["ranks"]
            for p in r["phases"]
            if p["phase"].startswith("warm-up: evaluation")
        ]
        evals.append(max(peak_phase(r, ("eval:",))[1]["peak_mb"] for r in run["ranks"]))
        cells = [fmt(x) for x in peaks] + [f"{fmt(min(evals))}-{fmt(max(evals))}"]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\n| run | glibc's free chunks after a step, MiB | step wall time, s (median) |")
    print("|---|---|---|")
    for label, run in out.items():
        kept, seconds = [], []
        for r in run["ranks"]:
            for p in r["phases"]:
                if p["phase"].startswith("warm-up: step") and not p["phase"].endswith("(epoch 1)"):
                    kept.append(p["malloc_mb"]["kept_free"])
                    seconds.append(p["seconds"])
        print(f"| {label} | {fmt(min(kept))}-{fmt(max(kept))} | {statistics.median(seconds):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = {}
    for path in args.runs:
        ranks = [json.loads(p.read_text()) for p in sorted(path.glob("rank*.json"))]
        first = ranks[0]
        overrides = list(first["set"]) + [f"comm.mode={first['mode']}"]
        config = load_config(first["config"], overrides)
        prediction = predict(config, first["world_size"], None, first["config"]).as_json()
        largest = max(ranks, key=lambda r: peak_phase(r)[1]["peak_mb"])
        out[label_of(first)] = {
            "dir": str(path),
            "variant": is_variant(first),
            "largest_rank": largest["rank"],
            "terms_mb_per_rank": [terms(r) for r in ranks],
            "training_terms_mb_per_rank": [terms(r, ("train:",)) for r in ranks],
            "largest_terms_mb": largest_terms(largest),
            "prediction": prediction,
            "ranks": ranks,
        }
    main_runs = [label for label, run in out.items() if not run["variant"]]
    for label in main_runs:
        run = out[label]
        largest = run["ranks"][run["largest_rank"]]
        print(f"\n### {label}: rank {largest['rank']} (the largest peak), MiB\n")
        print("\n".join(phase_table(largest)))
        print("\nsaved by layer:", {k: round(v) for k, v in largest["saved_mb"].items()})
        print("held by owner:", {k: round(v, 1) for k, v in largest["held_mb"].items() if v})
    print("\n### each term at its largest over the instrumented epoch, above the baseline\n")
    print_ratios(out, main_runs)
    for key, title in (
        ("terms_mb_per_rank", "the instrumented epoch's peak (step and evaluation)"),
        ("training_terms_mb_per_rank", "the instrumented training step's peak"),
    ):
        print(f"\n### terms at {title}, largest rank, MiB (predicted in brackets)\n")
        print_terms(out, main_runs, key)
    print("\n### every run's peaks epoch by epoch, largest rank, MiB\n")
    print_epochs(out)
    if args.json:
        args.json.write_text(json.dumps(rounded(out), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
