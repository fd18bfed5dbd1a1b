"""Collects the runs of run.sh into results.json and prints the README's table.

Usage: .venv/bin/python results/bench/partition/method-training/collect.py RUNS_DIR OUT_DIR [COMMIT]
(COMMIT: the commit the runs ran at; default ``git rev-parse HEAD`` here.)
Per run: the summary's epoch_time_s and comm_time_s (medians after the 5 warm-up epochs),
halo_bytes_per_epoch (all ranks, payload plus metadata), input_cache_bytes (the input
features' halo, sent once at start-up), avg_bits, final_test_acc and test_acc, and the
exchange's share of the epoch: the median over the same epochs of comm_time_s /
epoch_time_s in metrics.jsonl. Per configuration: mean, min and max over seeds.
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

WARMUP = 5
MODES = ["vanilla", "adaqp", "adaqp-quantized", "nocomm"]


def read_run(run: Path) -> dict:
    s = json.loads((run / "summary.json").read_text())
    cfg = json.loads((run / "config.json").read_text())
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    tail = epochs[WARMUP:] or epochs
    share = statistics.median(e["comm_time_s"] / e["epoch_time_s"] for e in tail)
    status = json.loads((run / "status.json").read_text())
    data, method, rest = run.name.split("-", 2)
    label, seed = rest.rsplit("-s", 1)
    return {
        "run": run.name,
        "dataset": data,
        "method": method,
        "mode": label,
        "seed": int(seed),
        "started_at": status["started_at"],
        "train_mode": s["mode"],
        "epochs": s["epochs"],
        "full_precision": cfg["quant"]["full_precision"],
        "partition_dir": s["partition_dir"],
        "edge_cut": s["edge_cut"],
        "epoch_time_s": s["epoch_time_s"],
        "comm_time_s": s["comm_time_s"],
        "comm_share": share,
        "cpu_time_s": s["cpu_time_s"],
        "allreduce_time_s": s["allreduce_time_s"],
        "halo_bytes_per_epoch": s["halo_bytes_per_epoch"],
        "halo_bytes_by_tag": s["halo_bytes_by_tag"],
        "input_cache_bytes": s["input_cache_bytes"],
        "avg_bits": s["avg_bits"],
        "final_test_acc": s["final_test_acc"],
        "test_acc_at_best_val": s["test_acc"],
    }


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def main() -> None:
    runs_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    runs = [read_run(p.parent) for p in sorted(runs_dir.glob("*/summary.json"))]
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["dataset"], r["method"], r["mode"]), []).append(r)
    table = []
    for data in ["cora", "citeseer"]:
        for mode in MODES:
            for method in ["metis", "kaminpar"]:
                g = groups.get((data, method, mode))
                if not g:
                    continue
                row = {
                    "dataset": data,
                    "mode": mode,
                    "method": method,
                    "seeds": sorted(r["seed"] for r in g),
                }
                for key in [
                    "epoch_time_s",
                    "comm_time_s",
                    "comm_share",
                    "cpu_time_s",
                    "halo_bytes_per_epoch",
                    "input_cache_bytes",
                    "avg_bits",
                    "final_test_acc",
                    "test_acc_at_best_val",
                ]:
                    row[key] = spread([r[key] for r in g])
                table.append(row)
    commit = (
        sys.argv[3]
        if len(sys.argv) > 3
        else subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    out = {"commit": commit, "runs": runs, "table": table}
    (out_dir / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    print(
        "| graph | mode | method | epoch ms (mean, min-max) | exchange ms | exchange share "
        "| CPU ms | halo kB / epoch | input halo kB, once | bits | final test acc |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in table:
        e, c, sh, cpu = (
            row[k] for k in ["epoch_time_s", "comm_time_s", "comm_share", "cpu_time_s"]
        )
        acc = row["final_test_acc"]
        hb = row["halo_bytes_per_epoch"]
        hb_s = (
            f"{hb['mean'] / 1e3:.1f}"
            if hb["min"] == hb["max"]
            else f"{hb['mean'] / 1e3:.1f} ({hb['min'] / 1e3:.1f}-{hb['max'] / 1e3:.1f})"
        )
        print(
            f"| {row['dataset']} | {row['mode']} | {row['method']} "
            f"| {e['mean'] * 1e3:.1f} ({e['min'] * 1e3:.1f}-{e['max'] * 1e3:.1f}) "
            f"| {c['mean'] * 1e3:.1f} ({c['min'] * 1e3:.1f}-{c['max'] * 1e3:.1f}) "
            f"| {sh['mean']:.0%} | {cpu['mean'] * 1e3:.1f} | {hb_s} "
            f"| {row['input_cache_bytes']['mean'] / 1e3:.0f} | {row['avg_bits']['mean']:g} "
            f"| {acc['mean']:.3f} ({acc['min']:.3f}-{acc['max']:.3f}) |"
        )


if __name__ == "__main__":
    main()
