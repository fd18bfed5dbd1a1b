"""A checkpoint's fingerprint covers every setting that changes the numerics: every key of
every section but the explicit list a resume may change (``RESUMABLE``, which
docs/checkpoints-and-faults.md lists), and but what the run's mode does not read: a
setting the mode ignores cannot change its trajectory, so changing it (or its default)
must not make a checkpoint unresumable. A change of any other key is refused in one line
that names it."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaqp.config import RESUMABLE, Config, load_config
from adaqp.run.checkpoint import CheckpointError, check_fits
from tests.test_docs import ROOT, section_text

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
    """A checkpoint that holds quant and staleness keys this run does not read (another
    version of the code read them, or they were renamed away) is not compared on them."""
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
    with pytest.raises(CheckpointError, match=r"quant\.variance_budget was 0\.9, now 0\.5"):
        check_fits(
            {"world_size": 1, "fingerprint": {**old, "quant.lam": 0.9}}, 1, adaptive, Path("c")
        )


# Every key of every section is either one a resume may change (one change each, below)
# or part of the recipe (one change each, under a config that reads it): a key added to a
# section fails test_every_key_is_either_resumable_or_fingerprinted until it is listed in
# one of the two, and so decided.
RESUMABLE_CHANGES = {
    "data.root": "elsewhere",
    "partition.dir": "parts",
    "train.epochs": "400",
    "train.eval_every": "5",
    "train.warmup_epochs": "2",
    "train.allocator": "glibc",
    "train.stop_on_nonfinite": "false",
    "comm.backend": "gloo",
    "comm.device": "cpu",
    "comm.threads": "3",
    "comm.timeout_s": "30",
    "comm.stall_warn_s": "5",
    "quant.kernels": "torch",
    "checkpoint.every": "3",
    "checkpoint.keep": "5",
    "checkpoint.dir": "ckpt",
    "metrics.out": "out",
    "metrics.progress": "false",
}
NUMERICS_CHANGES = {
    "data.dataset": "citeseer",
    "data.path": "b.npz",
    "data.split_seed": "1",
    "data.synthetic.num_nodes": "500",
    "data.synthetic.num_classes": "4",
    "data.synthetic.avg_degree": "10",
    "data.synthetic.homophily": "0.5",
    "data.synthetic.feature_dim": "32",
    "data.synthetic.feature_noise": "0.5",
    "data.synthetic.power_law": "2.5",
    "data.synthetic.communities": "4",
    "data.synthetic.inter_community": "0.1",
    "data.synthetic.seed": "1",
    "data.synthetic.train_fraction": "0.2",
    "data.synthetic.val_fraction": "0.2",
    "data.synthetic.test_fraction": "0.3",
    "data.feature_norm": "row",
    "partition.method": "random",
    "partition.seed": "1",
    "partition.balance_train": "false",
    "partition.objective": "volume",
    "model.name": "sage",
    "model.layers": "3",
    "model.hidden": "32",
    "model.dropout": "0.1",
    "model.layernorm": "true",
    "model.heads": "2",
    "model.output_heads": "2",
    "model.attn_dropout": "0.1",
    "train.lr": "0.02",
    "train.lr_warmup_epochs": "3",
    "train.weight_decay": "0",
    "train.seed": "1",
    "train.compute_rows": "all",
    "comm.mode": "adaqp",
    "comm.cache_input_halo": "false",
    "comm.transform_first": "false",
    "comm.overlap": "off",
    "comm.overlap_allreduce": "false",
    "quant.scheme": "adaptive",
    "quant.bits": "2",
    "quant.initial_bits": "8",
    "quant.allowed_bits": "[2,4]",
    "quant.group_size": "7",
    "quant.variance_budget": "0.5",
    "quant.assign_cycle": "9",
    "quant.first_cycle": "3",
    "quant.solver": "milp",
    "quant.resolve_budget_s": "2",
    "quant.full_precision": "never",
    "quant.cost_model": "shared",
    "quant.seed": "5",
    "quant.time_limit_s": "3",
    "quant.profile_every": "2",
    "staleness.bound": "2",
    "staleness.bits": "2",
    "staleness.sync_every": "3",
    "staleness.warmup_epochs": "2",
    "staleness.smoothing": "0.5",
    "staleness.fresh_last_layer": "true",
    "staleness.min_hidden_fraction": "0.5",
    "staleness.max_drift": "0.5",
    "staleness.choose_every": "8",
    "staleness.landing": "fixed",
}


def _section_keys(cls: type, prefix: str = "") -> Iterator[str]:
    """Every field of the dataclass ``cls`` as a dotted key, nested sections flattened."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            yield from _section_keys(kind, f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}"


def _value(config: Config, key: str) -> object:
    for name in key.split("."):
        config = getattr(config, name)
    return config


def _reading(key: str) -> list[str]:
    """Overrides under which a run reads ``key``: the mode that reads every exchange
    setting, the model that reads GAT's, and the dataset that reads the generator's or
    the file's."""
    base = ["comm.mode=adaqp-s", "model.name=gat"]
    if key.startswith("data.synthetic."):
        base.append("data.dataset=synthetic")
    if key == "data.path":
        base += ["data.dataset=npz", "data.path=a.npz"]
    return base


def _refusal(before: dict, after: dict) -> str:
    with pytest.raises(CheckpointError) as caught:
        check_fits({"world_size": 2, "fingerprint": before}, 2, after, Path("ckpt"))
    return str(caught.value)


def test_every_key_is_either_resumable_or_fingerprinted():
    every = list(_section_keys(Config))
    assert len(every) > 60 and "data.synthetic.seed" in every  # the walk reaches nested keys
    assert list(RESUMABLE_CHANGES) == list(RESUMABLE)
    assert not set(RESUMABLE) & set(NUMERICS_CHANGES)
    assert set(RESUMABLE) <= set(every), set(RESUMABLE) - set(every)
    undecided = set(every) - set(RESUMABLE) - set(NUMERICS_CHANGES)
    assert not undecided, f"add {sorted(undecided)} to NUMERICS_CHANGES, or to RESUMABLE"
    assert set(NUMERICS_CHANGES) <= set(every), set(NUMERICS_CHANGES) - set(every)


@pytest.mark.parametrize("key", list(RESUMABLE_CHANGES))
def test_a_resume_may_change_each_resumable_key(key):
    before = load_config(None, _reading(key))
    after = load_config(None, [*_reading(key), f"{key}={RESUMABLE_CHANGES[key]}"])
    assert _value(after, key) != _value(before, key)  # the change is one
    assert after.fingerprint() == before.fingerprint()
    check_fits({"world_size": 2, "fingerprint": before.fingerprint()}, 2, after.fingerprint(), "c")


@pytest.mark.parametrize("key", list(NUMERICS_CHANGES))
def test_a_resume_that_changes_any_other_key_is_refused_in_one_line_naming_it(key):
    before = load_config(None, _reading(key))
    after = load_config(None, [*_reading(key), f"{key}={NUMERICS_CHANGES[key]}"])
    assert key in before.fingerprint()
    message = _refusal(before.fingerprint(), after.fingerprint())
    assert "\n" not in message
    assert message.startswith(f"cannot resume from ckpt: {key} was "), message
    assert ", ".join(RESUMABLE) in message  # what a resume may change instead


def test_the_refusal_names_the_mode_before_the_settings_only_the_new_mode_reads():
    message = _refusal(_fingerprint("vanilla"), _fingerprint("adaqp"))
    assert message.startswith("cannot resume from ckpt: comm.mode was 'vanilla', now 'adaqp',")
    assert "and 16 more settings differ (comm.overlap, quant.scheme, quant.bits, ...)" in message


def test_the_issues_resumes_are_refused_naming_the_recipe_key():
    """Issue 59: a onebit run resumed with every row computed (its stale buffers hold
    the loss's rows) or another learning-rate warm-up."""
    onebit = _fingerprint("onebit")
    rows = _refusal(onebit, _fingerprint("onebit", "train.compute_rows=all"))
    assert "train.compute_rows was 'loss', now 'all';" in rows
    warmup = _refusal(onebit, _fingerprint("onebit", "train.lr_warmup_epochs=5"))
    assert "train.lr_warmup_epochs was 0, now 5;" in warmup


def test_settings_a_run_does_not_read_are_left_out():
    assert "comm.overlap" not in _fingerprint("vanilla") and "comm.overlap" in _fingerprint("adaqp")
    cora = _fingerprint("vanilla")
    assert not any(key.startswith(("data.synthetic.", "data.path")) for key in cora)
    assert _fingerprint("vanilla", "data.synthetic.seed=3") == cora
    npz = _fingerprint("vanilla", "data.dataset=npz", "data.path=g.npz")
    assert npz["data.path"] == str(Path("g.npz").resolve())  # named wherever run from


def test_the_documented_keys_are_the_resumable_ones():
    text = section_text(ROOT / "docs" / "checkpoints-and-faults.md", "What a resume may change")
    listed = re.findall(r"^\| `([\w.]+)` \|", text, re.MULTILINE)
    assert listed == list(RESUMABLE)
