"""The run's sections that do not concern the halo exchange: the graph (``[data]``), its
partition, the model, training, checkpoints and metrics.

Each section is a frozen dataclass whose fields carry a one-line docstring and are checked
in ``__post_init__`` (:func:`adaqp.config.typed_toml.check`, a ``ConfigError`` naming the key).
The exchange's sections (``[comm]``, ``[quant]``, ``[staleness]``) are in
:mod:`adaqp.config.exchange`; :mod:`adaqp.config` assembles them all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaqp.config.typed_toml import check
from adaqp.data import FEATURE_NORMS, GraphData, SyntheticSpec, load_dataset
from adaqp.process.allocator import ALLOCATORS

MODELS = ("gcn", "sage", "gat")
PARTITION_METHODS = ("metis", "kaminpar", "random", "contiguous")
METIS_OBJECTIVES = ("cut", "volume")


def check_choice(value: str, choices: tuple[str, ...], key: str) -> None:
    """Raises ``ConfigError("key: must be one of ...")`` unless ``value`` is in ``choices``."""
    check(value in choices, key, f"must be one of {', '.join(choices)}, not {value!r}")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "cora"
    """Dataset name: cora, citeseer, synthetic, npz, or an OGB node dataset (ogbn-arxiv...)."""
    root: str = "data"
    """Directory holding downloaded datasets (OGB's on-disk layout lives below it)."""
    path: str = ""
    """File for the ``npz`` dataset (see adaqp/data/ for its format)."""
    split_seed: int = 0
    """Seed of the train/val/test split for datasets that ship without one."""
    synthetic: SyntheticSpec = field(default_factory=SyntheticSpec)
    """Generator parameters for ``dataset = "synthetic"``."""
    feature_norm: str = "none"
    """none: the features as stored; row: each node's divided by their L1 norm (Kipf &
    Welling's row normalisation of bag-of-words; rows of zeros stay zero)."""

    def __post_init__(self) -> None:
        check(bool(self.dataset), "data.dataset", "must not be empty")
        check_choice(self.feature_norm, FEATURE_NORMS, "data.feature_norm")
        check(
            self.dataset != "npz" or bool(self.path),
            "data.path",
            'required when data.dataset = "npz"',
        )

    def load(self) -> GraphData:
        """Loads (or generates) the graph this section names (``load_dataset``)."""
        return load_dataset(
            self.dataset,
            root=self.root,
            split_seed=self.split_seed,
            synthetic=self.synthetic if self.dataset == "synthetic" else None,
            path=self.path or None,
            feature_norm=self.feature_norm,
        )

    def spec(self) -> dict[str, Any]:
        """What identifies the graph (not where it is stored): used to match partitions."""
        spec: dict[str, Any] = {"name": self.dataset, "split_seed": self.split_seed}
        if self.dataset == "synthetic":
            spec["synthetic"] = dataclasses.asdict(self.synthetic)
        if self.dataset == "npz":
            spec["path"] = str(Path(self.path).resolve())
        if self.feature_norm != "none":  # absent when off: earlier partitions still match
            spec["feature_norm"] = self.feature_norm
        return spec


@dataclass(frozen=True)
class PartitionConfig:
    method: str = "metis"
    """How nodes are assigned to parts: metis (pymetis), kaminpar, random or contiguous."""
    dir: str = ""
    """Partition directory; empty means partitions/<dataset>-<method>-p<P>."""
    seed: int = 0
    """Seed for METIS, KaMinPar and the random method."""
    balance_train: bool = True
    """Balance training nodes across parts as well as nodes (METIS multi-constraint)."""
    objective: str = "cut"
    """METIS objective: cut (edge cut) or volume (communication volume, k-way); kaminpar
    minimises the edge cut only."""

    def __post_init__(self) -> None:
        check_choice(self.method, PARTITION_METHODS, "partition.method")
        check_choice(self.objective, METIS_OBJECTIVES, "partition.objective")
        check(
            self.method != "kaminpar" or self.objective == "cut",
            "partition.objective",
            f"kaminpar minimises the edge cut only, so it must be cut, not {self.objective!r} "
            "(or use partition.method = metis)",
        )


@dataclass(frozen=True)
class ModelConfig:
    name: str = "gcn"
    """Architecture: gcn (symmetric normalisation), sage (mean aggregator, root weight) or
    gat (attention over in-edges and a self-loop)."""
    layers: int = 2
    """Number of graph convolution layers."""
    hidden: int = 64
    """Width of the hidden layers (gat: per head, so a hidden layer is heads x hidden)."""
    dropout: float = 0.5
    """Dropout probability before every layer."""
    layernorm: bool = False
    """Apply LayerNorm after every hidden layer."""
    heads: int = 4
    """gat: attention heads of every hidden layer (their outputs concatenated)."""
    output_heads: int = 1
    """gat: attention heads of the output layer (their outputs averaged)."""
    attn_dropout: float = 0.0
    """gat: dropout probability of the attention weights (after the softmax)."""

    GAT_ONLY = ("heads", "output_heads", "attn_dropout")
    """Fields that shape only a gat model (left out of other models' fingerprints)."""

    def __post_init__(self) -> None:
        check_choice(self.name, MODELS, "model.name")
        check(self.layers >= 1, "model.layers", f"must be at least 1, got {self.layers}")
        check(self.hidden >= 1, "model.hidden", f"must be at least 1, got {self.hidden}")
        check(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")
        check(self.heads >= 1, "model.heads", f"must be at least 1, got {self.heads}")
        check(
            self.output_heads >= 1,
            "model.output_heads",
            f"must be at least 1, got {self.output_heads}",
        )
        check(
            0.0 <= self.attn_dropout < 1.0,
            "model.attn_dropout",
            f"must be in [0, 1), got {self.attn_dropout}",
        )
        if self.name != "gat":  # a GAT key set for another model would do nothing
            defaults = ModelConfig.__dataclass_fields__
            for key in self.GAT_ONLY:
                value = getattr(self, key)
                check(
                    value == defaults[key].default,
                    f"model.{key}",
                    f"applies to model.name = gat only (this model is {self.name}), got {value}",
                )


COMPUTE_ROWS = ("loss", "all")
"""``train.compute_rows``: only the rows the loss reads (the default), or every row."""


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 200
    """Number of training epochs (one full-graph step each)."""
    lr: float = 0.01
    """Adam learning rate (after the warm-up, if any)."""
    lr_warmup_epochs: int = 0
    """Epochs over which the learning rate rises linearly to ``lr`` (epoch e of them runs at
    lr x e / lr_warmup_epochs; 0: ``lr`` from the first epoch), adaqp/run/schedule.py."""
    weight_decay: float = 5e-4
    """Adam weight decay (L2)."""
    seed: int = 0
    """Seed for weights and dropout; every rank starts from the same weights."""
    eval_every: int = 1
    """Evaluate validation and test accuracy every this many epochs (0 = only at the end)."""
    warmup_epochs: int = 5
    """Epochs left out of the median epoch time."""
    stop_on_nonfinite: bool = True
    """Stop with an error naming the epoch when the training loss is NaN or infinite."""
    compute_rows: str = "loss"
    """Rows a training step computes: ``loss``, only those its loss reads (each layer the
    rows within reach of a training node, each exchange their halo rows: the same values,
    less work; adaqp/graph/loss_rows.py), or ``all``. Evaluation computes every row."""
    allocator: str = "release"
    """How freed tensors go back to the system: ``release``, every tensor over 1 MiB mapped
    on its own and unmapped when freed (on huge pages where the kernel offers them), so a
    worker holds what it uses; or ``glibc``, glibc's defaults, which keep freed memory for
    reuse (at several workers, hundreds of MiB more at the peak). adaqp/process/allocator.py."""

    def __post_init__(self) -> None:
        check(self.epochs >= 1, "train.epochs", f"must be at least 1, got {self.epochs}")
        check(self.lr > 0, "train.lr", f"must be positive, got {self.lr}")
        check(
            self.lr_warmup_epochs >= 0,
            "train.lr_warmup_epochs",
            f"must be non-negative, got {self.lr_warmup_epochs}",
        )
        check(self.weight_decay >= 0, "train.weight_decay", "must be non-negative")
        check(self.eval_every >= 0, "train.eval_every", "must be non-negative")
        check(self.warmup_epochs >= 0, "train.warmup_epochs", "must be non-negative")
        check_choice(self.compute_rows, COMPUTE_ROWS, "train.compute_rows")
        check_choice(self.allocator, ALLOCATORS, "train.allocator")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10
    """Write a checkpoint every this many epochs, and after the last (0 = never)."""
    keep: int = 2
    """Complete checkpoints kept; older ones are removed once a newer one is complete."""
    dir: str = ""
    """Checkpoint directory; empty means <out>/checkpoints. Set, each run keeps its own
    checkpoints in <dir>/<out's folder name>/, marked by an owner.json, so runs sharing it
    never read or remove each other's (adaqp/run/placement.py)."""

    def __post_init__(self) -> None:
        check(self.every >= 0, "checkpoint.every", f"must be non-negative, got {self.every}")
        check(self.keep >= 1, "checkpoint.keep", f"must be at least 1, got {self.keep}")


@dataclass(frozen=True)
class MetricsConfig:
    out: str = ""
    """Output directory; empty means results/runs/<config stem>-<mode>-p<P>."""
    progress: bool = True
    """Show a progress bar on rank 0 when writing to a terminal."""
