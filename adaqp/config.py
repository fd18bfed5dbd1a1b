"""Typed run configuration: TOML files plus ``--set section.key=value`` overrides.

Each section is a frozen dataclass; every field carries a one-line docstring and is
checked in ``__post_init__``. Unknown sections or keys and values of the wrong type are
errors that name the offending key, never silently ignored (:mod:`adaqp.typed_toml`
reads the file and the overrides). Example files: ``configs/*.toml``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaqp.bits import SUPPORTED_BITS, planner_bits, uniform_bits
from adaqp.data import FEATURE_NORMS, SyntheticSpec
from adaqp.typed_toml import ConfigError as ConfigError  # raised for every bad key here
from adaqp.typed_toml import build, check, read_tree

MODES = ("vanilla", "adaqp-q", "adaqp-p", "adaqp", "adaqp-s", "onebit", "nocomm")
"""Training modes: full precision and synchronous (vanilla), quantized messages (adaqp-q),
central/marginal overlap (adaqp-p), or both (adaqp); adaqp whose planner also chooses
per exchange between fresh rows and stale ones (adaqp-s); one-bit messages under bounded
staleness (onebit, see the staleness section). ``nocomm`` is benchmark-only: it skips the
halo exchange (halo rows are zeros) to measure the compute-only epoch time."""

QUANTIZED_MODES = ("adaqp-q", "adaqp", "adaqp-s")  # halo messages at quant's widths
OVERLAP_MODES = ("adaqp-p", "adaqp", "adaqp-s", "onebit")
"""Modes that may aggregate central rows while the exchange is in flight (``comm.overlap``)."""
STALE_MODES = ("onebit", "adaqp-s")
"""Modes that may use halo rows (and gradients) from earlier epochs: [staleness]."""
KERNELS = ("auto", "torch", "compiled")  # quantizer and dropout mask: adaqp/quant/kernels.py
MODELS = ("gcn", "sage", "gat")
PARTITION_METHODS = ("metis", "random", "contiguous")
METIS_OBJECTIVES = ("cut", "volume")
STALE_BITS = (1, 2, 4, 8, 32)  # 32: full precision (PipeGCN's stale exchange)
LANDINGS = ("newest", "fixed")


def _check_choice(value: str, choices: tuple[str, ...], key: str) -> None:
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
        _check_choice(self.feature_norm, FEATURE_NORMS, "data.feature_norm")
        check(
            self.dataset != "npz" or bool(self.path),
            "data.path",
            'required when data.dataset = "npz"',
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
    """How nodes are assigned to parts: metis, random or contiguous."""
    dir: str = ""
    """Partition directory; empty means partitions/<dataset>-<method>-p<P>."""
    seed: int = 0
    """Seed for METIS and the random method."""
    balance_train: bool = True
    """Balance training nodes across parts as well as nodes (METIS multi-constraint)."""
    objective: str = "cut"
    """METIS objective: cut (edge cut) or volume (communication volume, k-way)."""

    def __post_init__(self) -> None:
        _check_choice(self.method, PARTITION_METHODS, "partition.method")
        _check_choice(self.objective, METIS_OBJECTIVES, "partition.objective")


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
        _check_choice(self.name, MODELS, "model.name")
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


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 200
    """Number of training epochs (one full-graph step each)."""
    lr: float = 0.01
    """Adam learning rate."""
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

    def __post_init__(self) -> None:
        check(self.epochs >= 1, "train.epochs", f"must be at least 1, got {self.epochs}")
        check(self.lr > 0, "train.lr", f"must be positive, got {self.lr}")
        check(self.weight_decay >= 0, "train.weight_decay", "must be non-negative")
        check(self.eval_every >= 0, "train.eval_every", "must be non-negative")
        check(self.warmup_epochs >= 0, "train.warmup_epochs", "must be non-negative")


@dataclass(frozen=True)
class CommConfig:
    mode: str = "vanilla"
    """Halo exchange mode (see MODES)."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl with CUDA, else gloo), gloo or nccl."""
    device: str = "auto"
    """Compute device: auto (CUDA when available), cpu or cuda."""
    timeout_s: float = 600.0
    """Seconds any collective may wait before the run fails naming the rank and step."""
    stall_warn_s: float = 60.0
    """Warn while an epoch runs past this (and 10x the longest so far); 0: never."""
    threads: int = 0
    """Intra-op threads per worker; 0: OMP_NUM_THREADS if set, else the usable cores (affinity,
    cgroup quota) shared out."""
    cache_input_halo: bool = True
    """Fetch layer-0 halo features once at start-up (they never change; exact). With
    input dropout each worker then draws its own mask for those rows."""
    transform_first: bool = True
    """GCN: exchange h·W instead of h when that narrows the rows (exact)."""
    overlap: str = "auto"
    """Central/marginal overlap in OVERLAP_MODES: auto (on, except where every rank shares
    one host's CPU cores with more threads than cores: an exchange there is a copy by those
    cores and a wait is a peer computing, so splitting a layer only adds work), on or off."""
    overlap_allreduce: bool = True
    """Start each layer's gradient all-reduce as soon as backward has finished that layer
    (DDP-style buckets); false: one flat all-reduce after backward."""

    def __post_init__(self) -> None:
        _check_choice(self.mode, MODES, "comm.mode")
        check(
            self.backend in ("auto", "gloo", "nccl"), "comm.backend", "must be auto, gloo or nccl"
        )
        check(self.device in ("auto", "cpu", "cuda"), "comm.device", "must be auto, cpu or cuda")
        check(self.timeout_s > 0, "comm.timeout_s", "must be positive")
        check(self.stall_warn_s >= 0, "comm.stall_warn_s", "must be non-negative")
        check(self.threads >= 0, "comm.threads", "must be non-negative")
        _check_choice(self.overlap, ("auto", "on", "off"), "comm.overlap")


@dataclass(frozen=True)
class QuantConfig:
    scheme: str = "uniform"
    """Bit-width scheme in quantized modes: uniform (every message at ``bits``), adaptive
    (a solver trades variance against predicted time; docs/bit-widths.md) or random."""
    bits: int = 0
    """Width of every uniform message; 0: the model's (1 gcn, 2 sage, 4 gat: adaqp/bits.py)."""
    initial_bits: int = 8
    """Width used during the first assignment cycle of adaptive/random, while tracing."""
    allowed_bits: tuple[int, ...] = ()
    """Widths the adaptive and random schemes choose from; empty: 1, 2, 4, 8 (2, 4, 8 for
    gat: adaqp/bits.py planner_bits)."""
    group_size: int = 100
    """Messages per group that share one width (per channel, sorted by weight)."""
    lam: float = 0.5
    """Trade-off: 1 minimises variance only, 0 minimises predicted exchange time only."""
    assign_cycle: int = 20
    """Re-solve the bit widths every this many epochs (after the first cycle)."""
    first_cycle: int = 5
    """Epochs of the first cycle, traced at ``initial_bits`` before the first solve (at
    most ``assign_cycle``): solves follow epochs first_cycle, first_cycle + assign_cycle..."""
    solver: str = "milp"
    """Adaptive solver: milp (exact, SciPy HiGHS) or greedy."""
    time_limit_s: float = 1.0
    """Time limit of one MILP solve (per exchange); at the limit the better of HiGHS's
    incumbent and the greedy is kept (within 1e-3 of the optimal objective in the tests).
    The host model's solves of planner-sized exchanges often reach any limit."""
    resolve_budget_s: float = 1.0
    """Wall-clock budget of one re-solve, all its exchanges together (the ranks wait for
    it between epochs): each exchange's MILP stops at the smaller of time_limit_s and an
    equal share of what the re-solve has left, and keeps the greedy's answer where it
    has found nothing better."""
    cost_model: str = "host"
    """Exchange time model: host (the default: hosts with full-duplex NICs, the busiest
    host's send or receive time, copies within a host, the measured (de)quantization
    cost, and full precision as a choice, so a fast network gets float32 rows; see
    adaqp/assign/profile.py), shared (all transfers' bytes add up, as if through one
    pipe), sender (a rank's outgoing channels share its link) or link (every pair has
    its own link and the slowest sets the time). docs/cost-models.md compares them."""
    profile_every: int = 0
    """Adaptive scheme: profile the links (and, for the host model, the (de)quantization
    cost) again before every this many re-solves; 0 profiles once, at start-up."""
    seed: int = 0
    """Seed of the stochastic rounding and of the random scheme."""
    kernels: str = "auto"
    """(De)quantization and dropout-mask code: auto (compiled on CPU), torch or compiled."""

    def __post_init__(self) -> None:
        widths = SUPPORTED_BITS
        check(
            self.scheme in ("adaptive", "uniform", "random"),
            "quant.scheme",
            f"must be adaptive, uniform or random, not {self.scheme!r}",
        )
        listed = ", ".join(map(str, widths))
        good_bits = self.bits == 0 or self.bits in widths
        check(good_bits, "quant.bits", f"must be one of {listed}, got {self.bits}")
        check(
            self.initial_bits in widths,
            "quant.initial_bits",
            f"must be one of {listed}, got {self.initial_bits}",
        )
        check(
            all(b in widths for b in self.allowed_bits),
            "quant.allowed_bits",
            f"must be drawn from {widths}",
        )
        check(self.group_size >= 1, "quant.group_size", "must be at least 1")
        check(0.0 <= self.lam <= 1.0, "quant.lam", f"must be in [0, 1], got {self.lam}")
        check(self.assign_cycle >= 1, "quant.assign_cycle", "must be at least 1")
        check(self.first_cycle >= 1, "quant.first_cycle", "must be at least 1")
        check(self.solver in ("milp", "greedy"), "quant.solver", "must be milp or greedy")
        check(self.time_limit_s > 0, "quant.time_limit_s", "must be positive")
        check(self.resolve_budget_s > 0, "quant.resolve_budget_s", "must be positive")
        check(self.profile_every >= 0, "quant.profile_every", "must be non-negative")
        check(
            self.cost_model in ("shared", "sender", "link", "host"),
            "quant.cost_model",
            f"must be shared, sender, link or host, not {self.cost_model!r}",
        )
        _check_choice(self.kernels, KERNELS, "quant.kernels")


@dataclass(frozen=True)
class StalenessConfig:
    bound: int = 1
    """Mode onebit: a layer may aggregate halo rows (or return gradients) whose exchange
    started up to this many epochs ago; 0 is synchronous."""
    bits: int = 1
    """Mode onebit: width of every halo message (1, 2, 4, 8, or 32: full precision)."""
    sync_every: int = 0
    """Mode onebit: every this many epochs is fully synchronous (0 = never)."""
    landing: str = "newest"
    """Mode onebit: which exchange a layer uses. newest: the newest that has landed within
    the bound (waits only when none has); fixed: always the one started exactly ``bound``
    epochs ago (epoch 1's in the first epochs), waiting for it if need be, so that a run
    does not depend on timing: two runs with one seed are bitwise equal."""
    warmup_epochs: int = 0
    """Mode onebit: the first this many epochs are synchronous (staleness 0)."""
    smoothing: float = 0.9
    """Modes onebit and adaqp-s: stale halo rows and gradients enter as a per-exchange
    moving average, ``avg = smoothing * avg + (1 - smoothing) * received`` (0 = off;
    PipeGCN uses 0.9-0.95); a synchronous read uses what it received and restarts the
    average. The default is the staleness ablation's best (docs/staleness.md)."""
    fresh_last_layer: bool = False
    """Mode onebit: the last layer exchanges synchronously (its rows are narrow: cheap)."""
    min_hidden_fraction: float = 0.02
    """Mode adaqp-s: an exchange goes stale only if its fresh wait (what overlap did not
    hide) was at least this fraction of the epoch time."""
    max_drift: float = 0.15
    """Mode adaqp-s: after the first choice, an exchange goes stale only if its rows moved
    by at most this much per epoch (``|x_t - x_t-1| / |x_t|`` over the rows sent)."""
    choose_every: int = 4
    """Mode adaqp-s: after the first choice (after epoch 1), the choice between fresh and
    stale is made every this many epochs, from their waits and the drift between their
    two halves (at least 4: two epochs per half)."""

    def __post_init__(self) -> None:
        check(self.bound >= 0, "staleness.bound", f"must be non-negative, got {self.bound}")
        check(
            self.bits in STALE_BITS,
            "staleness.bits",
            f"must be one of {', '.join(map(str, STALE_BITS))}, got {self.bits}",
        )
        check(self.sync_every >= 0, "staleness.sync_every", "must be non-negative")
        _check_choice(self.landing, LANDINGS, "staleness.landing")
        check(self.warmup_epochs >= 0, "staleness.warmup_epochs", "must be non-negative")
        check(
            0.0 <= self.min_hidden_fraction <= 1.0,
            "staleness.min_hidden_fraction",
            f"must be in [0, 1], got {self.min_hidden_fraction}",
        )
        check(self.max_drift >= 0, "staleness.max_drift", f"must be >= 0, got {self.max_drift}")
        check(
            self.choose_every >= 4,
            "staleness.choose_every",
            "must be at least 4 (the choice compares the mean rows of two halves of at least "
            f"2 epochs each), got {self.choose_every}",
        )
        check(
            0.0 <= self.smoothing < 1.0,
            "staleness.smoothing",
            f"must be in [0, 1), got {self.smoothing}",
        )


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10
    """Write a checkpoint every this many epochs, and after the last (0 = never)."""
    keep: int = 2
    """Complete checkpoints kept; older ones are removed once a newer one is complete."""
    dir: str = ""
    """Checkpoint directory; empty means <out>/checkpoints."""

    def __post_init__(self) -> None:
        check(self.every >= 0, "checkpoint.every", f"must be non-negative, got {self.every}")
        check(self.keep >= 1, "checkpoint.keep", f"must be at least 1, got {self.keep}")


@dataclass(frozen=True)
class MetricsConfig:
    out: str = ""
    """Output directory; empty means results/runs/<config stem>-<mode>-p<P>."""
    progress: bool = True
    """Show a progress bar on rank 0 when writing to a terminal."""


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
        quant = self.quant  # the model's defaults, stated in the recorded config
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
        the graph, its partition, the model and everything that shapes the training
        trajectory. Epochs, evaluation, output and timeouts may change."""
        sections = {
            "data": self.data.spec(),
            "partition": {
                k: v for k, v in dataclasses.asdict(self.partition).items() if k != "dir"
            },
            "model": {
                k: v
                for k, v in dataclasses.asdict(self.model).items()
                if self.model.name == "gat" or k not in ModelConfig.GAT_ONLY
            },
            "train": {k: getattr(self.train, k) for k in ("lr", "weight_decay", "seed")},
            "comm": {
                k: getattr(self.comm, k) for k in ("mode", "cache_input_halo", "transform_first")
            },
            "quant": dataclasses.asdict(self.quant),
            "staleness": dataclasses.asdict(self.staleness),
        }
        flat: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                flat[prefix] = list(value) if isinstance(value, tuple) else value

        walk("", sections)
        return flat


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Reads a TOML file (optional) and applies ``section.key=value`` overrides.

    Raises:
        ConfigError: a missing file, bad TOML, an unknown key or a value of the wrong type.
    """
    return build(Config, read_tree(path, overrides), "")
