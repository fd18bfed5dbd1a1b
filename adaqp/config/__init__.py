"""Typed run configuration: TOML files plus ``--set section.key=value`` overrides.

Each section is a frozen dataclass; every field carries a one-line docstring and is
checked in ``__post_init__``. Unknown sections or keys and values of the wrong type are
errors that name the offending key, never silently ignored (:mod:`adaqp.config.typed_toml`
reads the file and the overrides). Example files: ``configs/*.toml``, such as::

    [data]
    dataset = "cora"

    [model]
    name = "gcn"
    layers = 2
    hidden = 64

Every key is documented where its section is defined:

- :mod:`adaqp.config.sections`: ``[data]``, ``[partition]``, ``[model]``, ``[train]``,
  ``[checkpoint]``, ``[metrics]``;
- :mod:`adaqp.config.exchange`: the halo exchange's ``[comm]``, ``[quant]`` and
  ``[staleness]``, each with its benchmark-only settings listed last (docs/benchmarks.md);
- :mod:`adaqp.config.modes`: the modes, and which of those sections each one reads.

This module assembles them into :class:`Config`; :mod:`adaqp.config.resume` says what
a checkpoint must agree on (:meth:`Config.fingerprint`) and which keys a resume may change
(``RESUMABLE``). Every name the sections define is importable from here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaqp.config.exchange import (
    COST_MODELS,
    FULL_PRECISION_CHOICES,
    KERNELS,
    LANDINGS,
    SCHEMES,
    STALE_BITS,
    CommConfig,
    QuantConfig,
    StalenessConfig,
)
from adaqp.config.modes import (
    MODES,
    OVERLAP_MODES,
    QUANTIZED_MODES,
    STALE_MODES,
)
from adaqp.config.resume import RESUMABLE, dotted_items, fingerprint
from adaqp.config.sections import (
    METIS_OBJECTIVES,
    MODELS,
    PARTITION_METHODS,
    CheckpointConfig,
    DataConfig,
    MetricsConfig,
    ModelConfig,
    PartitionConfig,
    TrainConfig,
)
from adaqp.config.typed_toml import ConfigError as ConfigError  # raised for every bad key here
from adaqp.config.typed_toml import build, read_tree
from adaqp.quant.bits import planner_bits, uniform_bits

__all__ = [
    "COST_MODELS",
    "FULL_PRECISION_CHOICES",
    "KERNELS",
    "LANDINGS",
    "METIS_OBJECTIVES",
    "MODELS",
    "MODES",
    "OVERLAP_MODES",
    "PARTITION_METHODS",
    "QUANTIZED_MODES",
    "RENAMED_KEYS",
    "RESUMABLE",
    "SCHEMES",
    "STALE_BITS",
    "STALE_MODES",
    "CheckpointConfig",
    "CommConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "MetricsConfig",
    "ModelConfig",
    "PartitionConfig",
    "QuantConfig",
    "StalenessConfig",
    "TrainConfig",
    "load_config",
]


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self) -> None:
        quant = self.quant  # the model's defaults, stated in the config the run records
        if not quant.allowed_bits:
            quant = dataclasses.replace(quant, allowed_bits=planner_bits(self.model.name))
        if not quant.bits:
            quant = dataclasses.replace(quant, bits=uniform_bits(self.model.name))
        object.__setattr__(self, "quant", quant)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must agree on to be resumed by this config, as dotted keys:
        every setting the run reads except the few a resume may change
        (:data:`adaqp.config.resume.RESUMABLE`: epochs, evaluation and output cadence,
        timeouts, where files go, the hardware). Derived from the dataclasses, so a new
        key is covered unless it is added there (:mod:`adaqp.config.resume`)."""
        return fingerprint(dict(dotted_items(self)))


RENAMED_KEYS: dict[str, str] = {"quant.lam": "quant.variance_budget"}
"""Keys renamed since a config could name them, old -> new: a file or ``--set`` that names
the old key is refused with the new one (:func:`load_config`)."""


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Reads a TOML file (optional) and applies ``section.key=value`` overrides.

    Raises:
        ConfigError: a missing file, bad TOML, an unknown or renamed key (``RENAMED_KEYS``)
            or a value of the wrong type.
    """
    return build(Config, read_tree(path, overrides), "", RENAMED_KEYS)
