"""The benchmark variants: what each one runs (its resolved config against what its name
promises), and the tables that show them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from adaqp import train
from adaqp.bench import (
    ADAPTIVE_VARIANTS,
    NOCOMM_ACC_NOTE,
    UNIFORM_VARIANTS,
    cluster,
    cluster_table,
    modes,
)
from adaqp.bench.cluster_plot import pareto_points
from adaqp.config import QuantConfig
from adaqp.quant.bits import planner_bits, uniform_bits
from tests.bench.cluster_runs import cluster_run

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = {
    "cluster": (cluster.VARIANTS, cluster.WORKLOADS),
    "modes": (modes.VARIANTS, modes.DATASETS),
}
"""Each benchmark's variants and the configs (file, overrides) it runs them on."""

_STALE_SUFFIXES = {
    "plain": {},
    "smooth": {"staleness.smoothing": 0.9},
    "warmup": {"staleness.warmup_epochs": 10},
    "fresh_last": {"staleness.fresh_last_layer": True},
    "sync4": {"staleness.sync_every": 4},
}
"""What each part of a stale variant's name after ``onebit-sN-`` turns on (``fresh-last``
with an underscore, so that the name splits at its dashes)."""


def promised(name: str, model: str) -> dict[str, object]:
    """What a variant's name promises it runs, as dotted config keys (``model``: the
    benchmark config's model, whose default width ``adaqp`` uses). Raises KeyError for a
    name with no rule here: a new variant needs its promise written down."""
    adaptive = {"comm.mode": "adaqp", "quant.scheme": "adaptive"}
    if name in ("vanilla", "adaqp-q", "adaqp-p", "adaqp-s", "nocomm"):
        return {"comm.mode": name}
    if name == "adaqp":  # the default: uniform at the model's width
        return {"comm.mode": "adaqp", "quant.scheme": "uniform", "quant.bits": uniform_bits(model)}
    if m := re.fullmatch(r"uniform-(\d+)", name):  # at that width on any network
        return {
            "comm.mode": "adaqp",
            "quant.scheme": "uniform",
            "quant.bits": int(m[1]),
            "quant.full_precision": "never",
        }
    if name == "adaqp-adaptive":  # the solver at its defaults
        defaults = QuantConfig()
        return {
            **adaptive,
            "quant.cost_model": defaults.cost_model,
            "quant.variance_budget": defaults.variance_budget,
            "quant.allowed_bits": planner_bits(model),
        }
    if m := re.fullmatch(r"adaqp-budget([0-9.]+)", name):
        return {**adaptive, "quant.variance_budget": float(m[1])}
    if name == "adaqp-adaptive-2b":
        return {**adaptive, "quant.bits": 2, "quant.allowed_bits": (1, 2, 4, 8)}
    if name == "adaqp-bits12":
        return {**adaptive, "quant.allowed_bits": (1, 2)}
    if m := re.fullmatch(r"adaqp-(shared|host)", name):
        return {**adaptive, "quant.cost_model": m[1]}
    if m := re.fullmatch(r"onebit-s(\d)", name):  # the staleness section's defaults
        return {"comm.mode": "onebit", "staleness.bound": int(m[1])}
    if m := re.fullmatch(r"onebit-s(\d)-(.+)", name):
        parts = m[2].replace("fresh-last", "fresh_last").split("-")
        keys = {  # plain: every compensation off
            "comm.mode": "onebit",
            "staleness.bound": int(m[1]),
            "staleness.smoothing": 0.0,
            "staleness.warmup_epochs": 0,
            "staleness.fresh_last_layer": False,
            "staleness.sync_every": 0,
        }
        if parts == ["combined"]:
            parts = ["smooth", "fresh_last", "warmup"]
        for part in parts:
            keys.update(_STALE_SUFFIXES[part])
        return keys
    raise KeyError(f"no promise written for variant {name!r}")


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def resolved(config_file: str, overrides: tuple[str, ...], flags: tuple[str, ...]) -> dict:
    """The config a benchmark's run resolves to, through ``adaqp.train``'s own flag
    parsing, as dotted keys (the run's output and seed left out)."""
    sets = [item for o in overrides for item in ("--set", o)]
    args = train.parse_args(["--config", str(ROOT / config_file), *sets, *flags])
    return _flat(train.config_from_args(args).to_dict())


def check_variant(name: str, flags, config_file: str, overrides) -> None:
    """A variant runs what its name promises, and differs from its benchmark's config
    only there."""
    base = resolved(config_file, overrides, ())
    runs = resolved(config_file, overrides, tuple(flags))
    promise = promised(name, runs["model.name"])
    wrong = {k: (runs[k], v) for k, v in promise.items() if runs[k] != v}
    assert not wrong, f"{name}: (runs, promised) {wrong}"
    changed = {k for k in runs if runs[k] != base[k]}
    assert changed <= set(promise), f"{name} also changes {sorted(changed - set(promise))}"


@pytest.mark.parametrize("benchmark", sorted(BENCHMARKS))
def test_every_variant_runs_what_its_name_promises(benchmark):
    variants, configs = BENCHMARKS[benchmark]
    for config_file, overrides in configs.values():
        for name, flags in variants.items():
            check_variant(name, flags, config_file, overrides)


def test_a_variant_that_runs_something_else_is_caught():
    """The check can fail: flags that run another width, or change a key the name does
    not promise."""
    config_file, overrides = cluster.WORKLOADS["synthetic-signal"]
    with pytest.raises(AssertionError, match="uniform-2"):
        check_variant("uniform-2", UNIFORM_VARIANTS["uniform-4"], config_file, overrides)
    sneaky = (*UNIFORM_VARIANTS["uniform-2"], "--set", "comm.overlap=off")
    with pytest.raises(AssertionError, match="also changes"):
        check_variant("uniform-2", sneaky, config_file, overrides)
    with pytest.raises(AssertionError, match="adaqp-budget0.9"):
        check_variant(
            "adaqp-budget0.9", ADAPTIVE_VARIANTS["adaqp-budget0.1"], config_file, overrides
        )


def test_every_uniform_width_and_nocomm_is_a_variant_of_both_benchmarks():
    uniform = {"uniform-1", "uniform-2", "uniform-4", "uniform-8"}
    assert set(UNIFORM_VARIANTS) == uniform
    for variants in (cluster.VARIANTS, modes.VARIANTS):
        assert uniform | {"nocomm"} <= set(variants)
    assert uniform | {"nocomm"} <= set(modes.DEFAULT_VARIANTS)


def _run(test_acc, nbytes, epoch_s, val_curve):
    """A run's saved results as the tables read them (``test_bench._run``'s, half waiting)."""
    return cluster_run(epoch_s, epoch_s / 2, val_curve, test_acc, nbytes)


@pytest.fixture
def cluster_runs():
    return {
        "vanilla": [_run(0.75, 1000, 1.0, [0.5, 0.6, 0.7])],
        "uniform-2": [_run(0.7412, 125, 0.4, [0.5, 0.7, 0.71])],
        "nocomm": [_run(0.6543, 0, 0.3, [0.4, 0.5, 0.6])],
    }


META = {
    "hosts": 4,
    "procs_per_host": 1,
    "bandwidth": "300mbit",
    "epochs": 3,
    "seeds": [0],
    "config": "c.toml",
    "overrides": [],
    "tta_tolerance": 0.0,
}


def test_cluster_table_shows_nocomm_accuracy_marked_and_names_uniform_rows(cluster_runs):
    agg = cluster._aggregate(cluster_runs, [0])
    rows = {
        line.split(" | ")[0]: line for line in cluster_table.render("t", META, agg).splitlines()
    }
    assert f"| 0.6543 ± 0.0000 ({NOCOMM_ACC_NOTE}) |" in rows["| nocomm"]
    assert "| 0.7412 ± 0.0000 |" in rows["| uniform-2"]  # unmarked
    assert NOCOMM_ACC_NOTE not in rows["| vanilla"] + rows["| uniform-2"]
    assert agg["uniform-2"]["time_to_accuracy_ratio"] == pytest.approx(0.8 / 3.0)


def test_pareto_points_put_modes_that_never_reach_vanilla_apart(cluster_runs):
    points, never = pareto_points(cluster._aggregate(cluster_runs, [0]))
    assert [(m, round(x, 4), acc) for m, x, acc, _ in points] == [
        ("vanilla", 1.0, 0.75),
        ("uniform-2", round(0.8 / 3.0, 4), 0.7412),
    ]
    assert never == ["nocomm"]


def test_modes_table_shows_nocomm_accuracy_and_no_byte_ratio():
    def entry(acc, nbytes):
        summary = {key: 1.0 for key in modes.SUMMARY_KEYS}
        summary.update(test_acc=acc, halo_bytes_per_epoch=nbytes)
        return {"runs": [summary], "aggregate": modes._aggregate([summary])}

    results = {
        "vanilla": entry(0.75, 8e6),
        "uniform-4": entry(0.7488, 1e6),
        "nocomm": entry(0.6543, 0.0),
    }
    meta = {"world_size": 4, "epochs": 2, "seeds": [0], "config": "c.toml", "overrides": []}
    rows = {
        line.split(" | ")[0]: line for line in modes._table("synthetic", results, meta).splitlines()
    }
    assert rows["| nocomm"].startswith(
        f"| nocomm | 0.6543 ± 0.0000 ({NOCOMM_ACC_NOTE}) | 0.000 | - |"
    )
    assert rows["| uniform-4"].startswith("| uniform-4 | 0.7488 ± 0.0000 | 1.000 | 1/8.0 |")


def test_time_to_accuracy_counts_the_solves_between_epochs(tmp_path):
    """The ranks wait for a re-solve before the next epoch: the adaptive scheme's solves
    count in its time to accuracy (a uniform width has none)."""
    (tmp_path / "summary.json").write_text(json.dumps({"test_acc": 0.7}))
    epochs = [
        {"epoch": 1, "epoch_time_s": 1.0, "solver_time_s": 0.0},
        {"epoch": 2, "epoch_time_s": 1.0, "solver_time_s": 0.5},
        {"epoch": 3, "epoch_time_s": 1.0, "assign_time_s": 0.25},  # the older name
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    run = cluster.read_run(tmp_path)
    assert [e["train_time_s"] for e in run["epochs"]] == [1.0, 2.5, 3.75]
