"""The benchmark variants (uniform widths, nocomm) and the tables that show them."""

from __future__ import annotations

import pytest

from adaqp.bench import NOCOMM_ACC_NOTE, UNIFORM_VARIANTS, cluster, cluster_table, modes
from adaqp.bench.cluster_plot import pareto_points
from adaqp.config import load_config
from tests.bench.test_bench import _run as bench_run


def _flags(variant: tuple[str, ...]) -> tuple[str, list[str]]:
    """The ``--mode`` and the ``--set`` overrides of a variant's train flags."""
    mode = variant[variant.index("--mode") + 1]
    sets = [variant[i + 1] for i, flag in enumerate(variant) if flag == "--set"]
    return mode, sets


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_uniform_variants_are_adaqp_at_one_width(bits):
    name = f"uniform-{bits}"
    assert cluster.VARIANTS[name] == modes.VARIANTS[name] == UNIFORM_VARIANTS[name]
    mode, sets = _flags(UNIFORM_VARIANTS[name])
    # adaqp's exchange with overlap: only how the widths are chosen differs from adaqp.
    assert mode == "adaqp" == _flags(cluster.VARIANTS["adaqp"])[0]
    quant = load_config(None, sets).quant
    assert (quant.scheme, quant.bits) == ("uniform", bits)
    assert load_config(None, sets).comm == load_config(None, []).comm


def test_every_uniform_width_and_nocomm_is_a_variant_of_both_benchmarks():
    uniform = {"uniform-1", "uniform-2", "uniform-4", "uniform-8"}
    assert set(UNIFORM_VARIANTS) == uniform
    for variants in (cluster.VARIANTS, modes.VARIANTS):
        assert uniform | {"nocomm"} <= set(variants)
        assert _flags(variants["nocomm"]) == ("nocomm", [])
    assert uniform | {"nocomm"} <= set(modes.DEFAULT_VARIANTS)


def _run(test_acc, nbytes, epoch_s, val_curve):
    """A run's saved results as the tables read them (``test_bench._run``'s, half waiting)."""
    return bench_run(epoch_s, epoch_s / 2, val_curve, test_acc, nbytes)


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


@pytest.mark.parametrize("lam", [0.1, 0.9])
def test_lambda_variants_are_adaqp_at_another_trade_off(lam):
    name = f"adaqp-lam{lam}"
    assert cluster.VARIANTS[name] == modes.VARIANTS[name]
    mode, sets = _flags(cluster.VARIANTS[name])
    assert mode == "adaqp"
    config = load_config(None, sets)
    assert config.quant.lam == lam
    assert config.quant.scheme == "adaptive" != load_config(None, []).quant.scheme


def test_adaqp_is_uniform_1_and_the_solver_is_a_named_variant():
    """Default ``adaqp`` on the benchmarks' GCN sends every message at 1 bit
    (docs/bit-widths.md); the solver's variants differ from it only in ``quant.scheme``
    and the solver's own settings."""
    default = load_config(None, _flags(cluster.VARIANTS["adaqp"])[1]).quant
    uniform = load_config(None, _flags(cluster.VARIANTS["uniform-1"])[1]).quant
    assert (default.scheme, default.bits) == ("uniform", 1) == (uniform.scheme, uniform.bits)
    adaptive = load_config(None, _flags(cluster.VARIANTS["adaqp-adaptive"])[1]).quant
    assert adaptive.scheme == "adaptive" and adaptive.lam == default.lam
    bits12 = load_config(None, _flags(cluster.VARIANTS["adaqp-bits12"])[1]).quant
    assert bits12.scheme == "adaptive" and bits12.allowed_bits == (1, 2)
    for name in ("adaqp-adaptive", "adaqp-bits12", "adaqp-shared", "adaqp-host"):
        assert cluster.VARIANTS[name] == modes.VARIANTS[name]
        assert load_config(None, _flags(cluster.VARIANTS[name])[1]).quant.scheme == "adaptive"
