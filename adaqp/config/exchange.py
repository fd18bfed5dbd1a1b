"""The halo exchange's sections: ``[comm]`` (how ranks talk), ``[quant]`` (the widths of
quantized messages) and ``[staleness]`` (how old a halo row may be).

Each section is a frozen dataclass whose fields carry a one-line docstring and are checked
in ``__post_init__``. Which modes read which section, and so which settings a checkpoint
must agree on, is :mod:`adaqp.config.modes`'s.

**Benchmark-only settings.** Some settings exist so that the benchmarks can measure what a
choice the code made is worth (``python -m adaqp.bench``;
docs/benchmarks.md#benchmark-only-settings), not for training: ``quant.scheme =
"random"``, the cost models ``shared``, ``sender`` and ``link``, ``quant.time_limit_s``,
``quant.profile_every``, ``comm.overlap_allreduce = false`` and ``staleness.landing =
"fixed"``. Each section lists its benchmark-only fields last, under a comment that says
so, and a field's docstring names a benchmark-only value after the values a user chooses
from. They are checked like any other key; the user's documentation (README,
docs/training.md, docs/staleness.md) leaves them out, so that a reader does not take them
for knobs worth turning.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaqp.config.modes import MODES
from adaqp.config.sections import check_choice
from adaqp.config.typed_toml import check
from adaqp.quant.bits import SUPPORTED_BITS

KERNELS = ("auto", "torch", "compiled")  # quantizer and dropout mask: adaqp/quant/kernels.py
SCHEMES = ("uniform", "adaptive", "random")
"""``quant.scheme``'s values; ``random`` is benchmark-only."""
COST_MODELS = ("host", "shared", "sender", "link")
"""``quant.cost_model``'s values; all but ``host`` are benchmark-only."""
FULL_PRECISION_CHOICES = ("auto", "never", "profile")
"""``quant.full_precision``'s values."""
STALE_BITS = (1, 2, 4, 8, 32)  # 32: full precision (PipeGCN's stale exchange)
LANDINGS = ("newest", "fixed")
"""``staleness.landing``'s values; ``fixed`` is benchmark-only (and the tests')."""


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
    """GCN and SAGE: exchange h·W instead of h where that does not widen the rows (exact;
    the layer then keeps only its input for backward, adaqp/model/transform.py)."""
    overlap: str = "auto"
    """Central/marginal overlap in OVERLAP_MODES: auto (on, except where every rank shares
    one host's CPU cores with more threads than cores: an exchange there is a copy by those
    cores and a wait is a peer computing, so splitting a layer only adds work), on or off."""

    # Benchmark-only (docs/benchmarks.md#benchmark-only-settings).
    overlap_allreduce: bool = True
    """Benchmark-only when false. Start each layer's gradient all-reduce as soon as
    backward has finished that layer (DDP-style buckets); false: one flat all-reduce after
    backward, to measure what the buckets hide."""

    def __post_init__(self) -> None:
        check_choice(self.mode, MODES, "comm.mode")
        check(
            self.backend in ("auto", "gloo", "nccl"), "comm.backend", "must be auto, gloo or nccl"
        )
        check(self.device in ("auto", "cpu", "cuda"), "comm.device", "must be auto, cpu or cuda")
        check(self.timeout_s > 0, "comm.timeout_s", "must be positive")
        check(self.stall_warn_s >= 0, "comm.stall_warn_s", "must be non-negative")
        check(self.threads >= 0, "comm.threads", "must be non-negative")
        check_choice(self.overlap, ("auto", "on", "off"), "comm.overlap")


@dataclass(frozen=True)
class QuantConfig:
    scheme: str = "uniform"
    """Bit-width scheme in quantized modes: uniform (every message at ``bits``, the
    default) or adaptive (a solver picks each message group's width, trading variance
    against predicted time). Uniform is the default because the adaptive widths did not
    beat the best uniform width on the benchmark clusters (docs/bit-widths.md).
    Benchmark-only: random (each group's width drawn from ``allowed_bits``, the baseline
    that the solver's choice is measured against)."""
    bits: int = 0
    """Width of every message in the uniform scheme; 0: the model's default, the width
    measured best for it (1 bit for gcn, 2 for sage, 4 for gat: adaqp/quant/bits.py,
    uniform_bits, says what each rests on)."""
    initial_bits: int = 0
    """Width of the adaptive scheme's first cycle, while tracing; 0: ``bits`` (the run's
    uniform width), so that the first cycle costs what the uniform scheme costs (its trace
    reads the rows before quantization, so a wider first cycle buys the solver nothing)."""
    allowed_bits: tuple[int, ...] = ()
    """Widths the adaptive scheme may choose from; empty: the model's default, 1, 2, 4 and
    8 bits (2, 4 and 8 for gat: adaqp/quant/bits.py, planner_bits)."""
    group_size: int = 100
    """Messages per group that share one width (per channel, sorted by weight)."""
    variance_budget: float = 1.0
    """Adaptive scheme: the variance the widths may add, a multiple (> 0) of the variance of
    every message at ``bits`` (the uniform width). Within it the solver minimises the
    predicted exchange time the overlap window does not hide, then the variance; at 1 (the
    default) its plan is predicted no slower and no noisier than the uniform width's, above
    1 it may trade variance for time (docs/cost-models.md#the-objective)."""
    assign_cycle: int = 20
    """Re-solve the bit widths every this many epochs (after the first cycle)."""
    first_cycle: int = 5
    """Epochs of the first cycle, traced at ``initial_bits`` before the first solve (at
    most ``assign_cycle``): solves follow epochs first_cycle, first_cycle + assign_cycle..."""
    solver: str = "greedy"
    """Adaptive solver: greedy (the default: the LP relaxation rounded and polished, a few
    hundredths of a second an exchange) or milp (exact, SciPy HiGHS, up to its share of
    ``resolve_budget_s``). On the benchmark clusters the MILP ran to its limit in nearly
    every re-solve and mostly kept the greedy's answer while every host waited for it
    (docs/cost-models.md#bounding-the-re-solve)."""
    resolve_budget_s: float = 1.0
    """Wall-clock budget of one re-solve, all its exchanges together (the ranks wait for
    it between epochs): each exchange's MILP stops at an equal share of what the re-solve
    has left, and keeps the greedy's answer where it has found nothing better."""
    full_precision: str = "auto"
    """Which exchanges of a quantized mode travel as float32 instead of at the planned
    widths. auto (the default): by topology, the same on every run: messages between
    workers on one host (torchrun's node, else the hostname) travel as float32, messages
    between hosts at the planned widths. never: every message at the planned widths,
    e.g. to measure a width on one machine. profile: a start-up profile of the links
    and the quantizer decides, per exchange, where float32 is predicted no slower (the
    adaptive scheme then has float32 among its widths); its figures vary with the
    machine's load, and so may the numerics. Under the benchmark-only cost models only
    auto and never apply."""
    cost_model: str = "host"
    """Exchange time model of the adaptive scheme: host (hosts with full-duplex NICs, the
    busiest host's send or receive time, copies within a host, the measured
    (de)quantization cost, and full precision as a choice, so a fast network gets float32
    rows; see adaqp/assign/profile.py and docs/cost-models.md). Benchmark-only: shared
    (all transfers' bytes add up, as if through one pipe), sender (a rank's outgoing
    channels share its link) and link (every pair has its own link and the slowest sets
    the time), the models ``host`` was measured against."""
    seed: int = 0
    """Seed of the stochastic rounding (and of the benchmark-only random scheme)."""
    kernels: str = "auto"
    """(De)quantization and dropout-mask code: auto (compiled on CPU), torch or compiled.
    Both paths write the same bits, so the choice changes speed only."""

    # Benchmark-only (docs/benchmarks.md#benchmark-only-settings).
    time_limit_s: float = 1.0
    """Benchmark-only. Time limit of one exchange's MILP solve, below its share of
    ``resolve_budget_s`` (which bounds the re-solve a run waits for); at the limit the
    better of HiGHS's incumbent and the greedy is kept (within 1.2e-2 of the optimum in
    the tests: docs/cost-models.md#bounding-the-re-solve). The host model's solves of
    planner-sized exchanges often reach any limit."""
    profile_every: int = 0
    """Benchmark-only. Adaptive scheme: profile the links (and, for the host model, the
    (de)quantization cost) again before every this many re-solves; 0 profiles once, at
    start-up."""

    def __post_init__(self) -> None:
        widths = SUPPORTED_BITS
        check(
            self.scheme in SCHEMES,
            "quant.scheme",
            f"must be adaptive, uniform or random, not {self.scheme!r}",
        )
        listed = ", ".join(map(str, widths))
        check(
            self.bits == 0 or self.bits in widths,
            "quant.bits",
            f"must be one of {listed}, got {self.bits}",
        )
        check(
            self.initial_bits == 0 or self.initial_bits in widths,
            "quant.initial_bits",
            f"must be one of {listed}, got {self.initial_bits}",
        )
        check(
            all(b in widths for b in self.allowed_bits),
            "quant.allowed_bits",
            f"must be drawn from {widths}",
        )
        check(self.group_size >= 1, "quant.group_size", "must be at least 1")
        check(
            0.0 < self.variance_budget < float("inf"),
            "quant.variance_budget",
            "is a multiple of the uniform width's variance: must be > 0, got "
            f"{self.variance_budget}",
        )
        check(self.assign_cycle >= 1, "quant.assign_cycle", "must be at least 1")
        check(self.first_cycle >= 1, "quant.first_cycle", "must be at least 1")
        check(self.solver in ("milp", "greedy"), "quant.solver", "must be milp or greedy")
        check(self.time_limit_s > 0, "quant.time_limit_s", "must be positive")
        check(self.resolve_budget_s > 0, "quant.resolve_budget_s", "must be positive")
        check(self.profile_every >= 0, "quant.profile_every", "must be non-negative")
        check(
            self.cost_model in COST_MODELS,
            "quant.cost_model",
            f"must be shared, sender, link or host, not {self.cost_model!r}",
        )
        check_choice(self.kernels, KERNELS, "quant.kernels")
        check_choice(self.full_precision, FULL_PRECISION_CHOICES, "quant.full_precision")


@dataclass(frozen=True)
class StalenessConfig:
    bound: int = 1
    """Mode onebit: a layer may aggregate halo rows (or return gradients) whose exchange
    started up to this many epochs ago; 0 is synchronous."""
    bits: int = 1
    """Mode onebit: width of every halo message (1, 2, 4, 8, or 32: full precision)."""
    sync_every: int = 0
    """Mode onebit: every this many epochs is fully synchronous (0 = never)."""
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
    by at most this much per epoch (``|x_t - x_t-1| / |x_t|`` over the rows sent). 0.15
    keeps the first epochs' fast movement fresh (docs/staleness.md)."""
    choose_every: int = 4
    """Mode adaqp-s: after the first choice (after epoch 1), the choice between fresh and
    stale is made every this many epochs, from their waits and the drift between their
    two halves (at least 4: two epochs per half)."""

    # Benchmark-only (docs/benchmarks.md#benchmark-only-settings).
    landing: str = "newest"
    """Which exchange a layer uses: newest (the default: the newest that has landed within
    the bound; waits only when none has). Benchmark-only: fixed (always the one started
    exactly ``bound`` epochs ago, epoch 1's in the first epochs, waiting for it if need
    be), so that a run does not depend on timing: two runs with one seed are bitwise
    equal, which the ablations and the tests need and training does not."""

    CHOICE_ONLY = ("min_hidden_fraction", "max_drift", "choose_every")
    """Fields only adaqp-s's choice reads (left out of onebit's fingerprints)."""

    def __post_init__(self) -> None:
        check(self.bound >= 0, "staleness.bound", f"must be non-negative, got {self.bound}")
        check(
            self.bits in STALE_BITS,
            "staleness.bits",
            f"must be one of {', '.join(map(str, STALE_BITS))}, got {self.bits}",
        )
        check(self.sync_every >= 0, "staleness.sync_every", "must be non-negative")
        check_choice(self.landing, LANDINGS, "staleness.landing")
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
