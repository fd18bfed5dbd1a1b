"""What a checkpoint must agree on to be resumed: every setting that changes the numbers a
run computes, derived from the config's dataclasses.

The fingerprint holds every field of every section (a nested one as
``data.synthetic.seed``), so a key added later is covered without a change here. Two kinds
of key are left out, both named here:

- :data:`RESUMABLE`, the keys a resume may change: where the run ends, how often it
  evaluates, checkpoints and reports, how long it waits, where its files go, and on what
  hardware the same recipe runs. Each entry says why it cannot change the recipe.
- Settings the run does not read (:func:`reads`): ``[quant]`` outside the quantized modes
  (but its rounding seed in the stale modes), ``[staleness]`` outside the stale modes (and
  adaqp-s's choice in onebit), GAT's fields in other models, the generator's parameters of
  a graph that is not synthetic, the file of one that is not npz, and the overlap in the
  modes that never overlap (:mod:`adaqp.config.modes`). A setting the run ignores cannot
  change its trajectory, so a Vanilla checkpoint stays resumable when, say,
  ``quant.bits``' default changes.

Everything else, the recipe, is compared at a resume, and a difference is refused naming
the key (:func:`adaqp.run.checkpoint.check_fits`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from adaqp.config.exchange import StalenessConfig
from adaqp.config.modes import OVERLAP_MODES, reads_quant, reads_staleness
from adaqp.config.sections import ModelConfig

_HARDWARE = (
    "where the same recipe runs: sums may round differently on other hardware (the resumed "
    "run is then not bitwise the uninterrupted one), but what is computed is the same"
)

RESUMABLE: dict[str, str] = {
    "data.root": "where datasets are stored; training reads the partition, whose checksum "
    "(partition.metadata_sha256) stays in the fingerprint",
    "partition.dir": "where the partition is; its checksum (partition.metadata_sha256) "
    "stays in the fingerprint",
    "train.epochs": "where the run ends: a larger value extends it",
    "train.eval_every": "evaluation is a forward pass of its own, fresh and in full "
    "precision, that changes no training state",
    "train.warmup_epochs": "which epochs the median epoch time leaves out",
    "train.allocator": "where freed memory goes, not what is computed",
    "train.stop_on_nonfinite": "whether a NaN or infinite loss ends the run; the epochs "
    "before it are the same",
    "comm.backend": _HARDWARE,
    "comm.device": _HARDWARE,
    "comm.threads": _HARDWARE,
    "comm.timeout_s": "how long a collective may wait before the run fails",
    "comm.stall_warn_s": "when a slow epoch is warned about",
    "quant.kernels": "both paths write the same bits (docs/kernels.md)",
    "checkpoint.every": "how often checkpoints are written",
    "checkpoint.keep": "how many checkpoints are kept",
    "checkpoint.dir": "where checkpoints are written",
    "metrics.out": "where the run's files go",
    "metrics.progress": "whether a progress bar shows",
}
"""The keys a resume may change, with why each cannot change the numbers a run computes.
Any other key is compared (docs/checkpoints-and-faults.md lists these for users)."""


def dotted_items(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every field of ``config`` (a tree of dataclasses) as ``(dotted key, value)``, in
    the order the dataclasses declare them, nested sections flattened."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        key = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            yield from dotted_items(value, f"{key}.")
        else:
            yield key, value


def reads(key: str, values: dict[str, Any]) -> bool:
    """Whether a run of the config whose ``values`` are given (every dotted key,
    :func:`dotted_items`) reads the setting ``key`` at all."""
    section, _, name = key.partition(".")
    mode = values["comm.mode"]
    if section == "quant":
        return reads_quant(mode) or (name == "seed" and reads_staleness(mode))
    if section == "staleness":
        choice_only = name in StalenessConfig.CHOICE_ONLY
        return reads_staleness(mode) and (mode == "adaqp-s" or not choice_only)
    if section == "model" and name in ModelConfig.GAT_ONLY:
        return values["model.name"] == "gat"
    if key.startswith("data.synthetic."):
        return values["data.dataset"] == "synthetic"
    if key == "data.path":
        return values["data.dataset"] == "npz"
    if key == "comm.overlap":
        return mode in OVERLAP_MODES
    return True


def fingerprint(values: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint must agree on to be resumed by the config whose ``values`` are
    given (every dotted key, :func:`dotted_items`): every key the run reads except
    :data:`RESUMABLE`, as ``{dotted key: JSON value}`` in the config's order (sections,
    then fields). An npz file is named by its absolute path."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if key in RESUMABLE or not reads(key, values):
            continue
        if key == "data.path":
            value = str(Path(value).resolve())
        flat[key] = list(value) if isinstance(value, tuple) else value
    return flat
