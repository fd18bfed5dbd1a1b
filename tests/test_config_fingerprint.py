"""A checkpoint's fingerprint covers what the run's mode reads, and nothing else: a
setting the mode ignores cannot change its trajectory, so changing it (or its default)
must not make a checkpoint unresumable."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaqp.config import load_config
from adaqp.run.checkpoint import CheckpointError, check_fits

# A changed value for every key of the two exchange sections a mode may ignore.
QUANT_CHANGES = [
    "quant.scheme=adaptive",
    "quant.bits=4",
    "quant.initial_bits=4",
    "quant.allowed_bits=[2,4]",
    "quant.group_size=7",
    "quant.variance_budget=0.1",
    "quant.assign_cycle=9",
    "quant.first_cycle=3",
    "quant.solver=milp",
    "quant.resolve_budget_s=2",
    "quant.cost_model=shared",
    "quant.seed=5",
    "quant.kernels=torch",
    "quant.time_limit_s=3",
    "quant.profile_every=2",
    "quant.full_precision=never",
    "quant.full_precision=profile",
]
STALENESS_CHANGES = [
    "staleness.bound=2",
    "staleness.bits=2",
    "staleness.sync_every=3",
    "staleness.warmup_epochs=2",
    "staleness.smoothing=0.5",
    "staleness.fresh_last_layer=true",
    "staleness.min_hidden_fraction=0.5",
    "staleness.max_drift=0.5",
    "staleness.choose_every=8",
    "staleness.landing=fixed",
]


def _fingerprint(mode: str, *overrides: str) -> dict:
    return load_config(None, [f"comm.mode={mode}", *overrides]).fingerprint()


@pytest.mark.parametrize("mode", ["vanilla", "adaqp-p", "nocomm"])
@pytest.mark.parametrize("change", QUANT_CHANGES + STALENESS_CHANGES)
def test_a_float32_mode_does_not_fingerprint_quant_or_staleness(mode, change):
    assert _fingerprint(mode, change) == _fingerprint(mode)
    # The model's default width (quant.bits = 0) differs between models: not a difference.
    assert not any(k.startswith(("quant.", "staleness.")) for k in _fingerprint(mode))


@pytest.mark.parametrize("mode", ["adaqp-q", "adaqp", "adaqp-s"])
@pytest.mark.parametrize("change", [c for c in QUANT_CHANGES if c != "quant.kernels=torch"])
def test_a_quantized_mode_fingerprints_quant(mode, change):
    key = change.partition("=")[0]
    before, after = _fingerprint(mode), _fingerprint(mode, change)
    assert before[key] != after[key]


def test_quant_kernels_is_fingerprinted_nowhere():
    """Both paths write the same bits: the path changes the speed, not the trajectory."""
    for mode in ("vanilla", "adaqp", "onebit", "adaqp-s"):
        assert _fingerprint(mode, "quant.kernels=torch") == _fingerprint(mode)


@pytest.mark.parametrize("change", STALENESS_CHANGES)
def test_the_stale_modes_fingerprint_what_they_read_of_staleness(change):
    key = change.partition("=")[0]
    assert _fingerprint("adaqp-s", change)[key] != _fingerprint("adaqp-s")[key]
    onebit, changed = _fingerprint("onebit"), _fingerprint("onebit", change)
    if key.rpartition(".")[2] in ("min_hidden_fraction", "max_drift", "choose_every"):
        assert changed == onebit  # adaqp-s's choice only
    else:
        assert changed[key] != onebit[key]


def test_onebit_fingerprints_the_rounding_seed_and_not_the_planner():
    assert _fingerprint("onebit", "quant.seed=5")["quant.seed"] == 5
    for change in QUANT_CHANGES:
        if not change.startswith("quant.seed"):
            assert _fingerprint("onebit", change) == _fingerprint("onebit"), change


def test_a_vanilla_checkpoint_written_before_a_quant_default_changed_resumes():
    """Checkpoints written before the fingerprint covered only what the mode reads hold
    every quant and staleness key; the ones this run does not read are not compared."""
    run = _fingerprint("vanilla")
    old = {**run, "quant.bits": 2, "quant.scheme": "uniform", "staleness.bound": 1}
    check_fits({"world_size": 2, "fingerprint": old}, 2, run, Path("ckpt"))
    # What the run does read is still compared.
    with pytest.raises(CheckpointError, match="train.lr"):
        check_fits({"world_size": 2, "fingerprint": {**old, "train.lr": 1.0}}, 2, run, Path("c"))
    adaqp = _fingerprint("adaqp")
    with pytest.raises(CheckpointError, match="quant.bits"):
        check_fits(
            {"world_size": 2, "fingerprint": {**adaqp, "quant.bits": 8}}, 2, adaqp, Path("c")
        )


def test_a_checkpoint_that_names_a_renamed_key_is_compared_under_its_new_name():
    adaptive = _fingerprint("adaqp", "quant.scheme=adaptive", "quant.variance_budget=0.5")
    old = dict(adaptive)
    old["quant.lam"] = old.pop("quant.variance_budget")
    check_fits({"world_size": 1, "fingerprint": old}, 1, adaptive, Path("ckpt"))
    with pytest.raises(CheckpointError, match=r"quant\.variance_budget: checkpoint 0\.9"):
        check_fits(
            {"world_size": 1, "fingerprint": {**old, "quant.lam": 0.9}}, 1, adaptive, Path("c")
        )
