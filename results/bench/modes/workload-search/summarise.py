"""Tabulates the workload search: python results/bench/modes/workload-search/summarise.py
(reads results/runs/workload-search/, prints one Markdown row per setting and seed set)."""

import json
import statistics
from collections import defaultdict
from pathlib import Path

runs = Path("results/runs/workload-search")
found: dict[str, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
for summary_path in sorted(runs.glob("*/summary.json")):
    name, mode, seed = summary_path.parent.name.rsplit("-", 2)
    found[name][mode][int(seed.removeprefix("seed"))] = json.loads(summary_path.read_text())
print(
    "| setting | synthetic params changed | model | epochs | seeds | Vanilla test acc | nocomm "
    "test acc | gap (points) | METIS edge cut | halo MB/epoch | Vanilla epoch s (loopback) |"
)
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name, modes in found.items():
    seeds = sorted(set(modes["vanilla"]) & set(modes.get("nocomm", {})))
    if not seeds:
        continue
    v = [modes["vanilla"][s]["test_acc"] for s in seeds]
    n = [modes["nocomm"][s]["test_acc"] for s in seeds]
    first = modes["vanilla"][seeds[0]]
    meta = json.loads((Path(first["partition_dir"]) / "metadata.json").read_text())
    config = json.loads((runs / f"{name}-vanilla-seed{seeds[0]}" / "config.json").read_text())
    syn = config["data"]["synthetic"]
    params = (
        f"inter_community {syn['inter_community']}, feature_noise {syn['feature_noise']}, "
        f"homophily {syn['homophily']}, communities {syn['communities']}"
    )
    model = f"{config['model']['layers']} x {config['model']['hidden']}"

    def fmt(xs):
        return f"{statistics.fmean(xs):.4f}" + (
            f" ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else ""
        )

    gap = 100 * (statistics.fmean(v) - statistics.fmean(n))
    print(
        f"| {name} | {params} | {model} | {config['train']['epochs']} "
        f"| {','.join(map(str, seeds))} | {fmt(v)} | {fmt(n)} | {gap:+.1f} "
        f"| {meta['stats']['edge_cut_fraction']:.1%} | {first['halo_bytes_per_epoch'] / 1e6:.1f} "
        f"| {statistics.fmean(modes['vanilla'][s]['epoch_time_s'] for s in seeds):.3f} |"
    )
