"""``summary.json``: the one place a run's summary is assembled.

The trainer hands over what training produced (``Outcome``: the epoch records, the
best validation epoch, the exchange policy's report of its plans, the peak memory), the
launcher what only it knows (``RunFacts``: the partition, restarts and the resumed
checkpoint), and ``summarize`` turns both into a ``Summary``. Checks outside the test
suite read its fields: they are only ever added, never renamed or removed.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

from adaqp.config import QUANTIZED_MODES, STALE_MODES, Config
from adaqp.run.metrics import EpochRecord, median_after_warmup


@dataclass(frozen=True)
class RunFacts:
    """What the launcher knows about a run that training does not."""

    partition_dir: str = ""
    restarts: int = 0
    """Times torchrun restarted the worker group during this run."""
    resumed_from_epoch: int = 0
    epochs_redone: int = 0
    threads: int = 0
    """Intra-op threads of each worker (``adaqp.runtime.thread_count``)."""


@dataclass(frozen=True)
class Outcome:
    """What one training run produced, the same on every rank."""

    records: list[EpochRecord]
    best_val_acc: float
    best_epoch: int
    test_acc_at_best_val: float
    total_time_s: float
    peak_memory_mb: float
    input_cache_bytes: int
    cache_input_halo: bool
    edge_cut: int
    metric: str
    overlap: bool = False
    """Whether layers were split into central and marginal rows (``comm.overlap``)."""
    plan_report: dict[str, Any] = field(default_factory=dict)
    """The exchange policy's figures of its last plans (``ExchangePolicy.report``)."""
    rows_by_layer: list[int] = field(default_factory=list)
    """Rows a training step computes in each layer, summed over ranks."""


@dataclass
class Summary:
    mode: str
    dataset: str
    model: str
    world_size: int
    epochs: int
    final_train_loss: float
    best_val_acc: float
    best_epoch: int
    test_acc_at_best_val: float
    """Test accuracy at the epoch with the best validation accuracy (``summary.json``
    also has it as ``test_acc``, its first name)."""
    epoch_time_s: float
    """Median epoch time after warm-up."""
    comm_time_s: float
    """Median per-epoch halo exchange time."""
    halo_bytes_per_epoch: int
    """Payload plus metadata bytes sent by all ranks in one training epoch."""
    avg_bits: float
    """Average bits per transmitted value (32 for full precision)."""
    max_staleness: int
    """Largest halo staleness used, in epochs (0 for synchronous modes): the age of the
    oldest buffer a read chose, which ``staleness.bound`` bounds."""
    comm_wait_s: float
    allreduce_time_s: float
    total_time_s: float
    partition_dir: str
    edge_cut: int
    split_seed: int
    seed: int
    metric: str = "acc"
    quant_time_s: float = 0.0
    """Median per-epoch quantization time (mean over ranks)."""
    dequant_time_s: float = 0.0
    """Median per-epoch dequantization time (mean over ranks)."""
    cpu_time_s: float = 0.0
    """Median per-epoch CPU time of a rank's process, all its threads (mean over ranks)."""
    hidden_comm_fraction: float = 0.0
    """Share of the exchange time hidden behind central compute: 1 - wait / exchange."""
    halo_bytes_by_tag: dict[str, int] = field(default_factory=dict)
    """Last epoch's halo bytes by layer and direction."""
    bits_histogram: dict[str, int] = field(default_factory=dict)
    """Last epoch's transmitted values by bit width."""
    solver_time_s: float = 0.0
    """Total time spent re-assigning bit widths."""
    input_cache_bytes: int = 0
    """Bytes sent once at start-up to cache the layer-0 halo inputs."""
    cache_input_halo: bool = False
    transform_first: bool = False
    overlap: bool = False
    """Whether layers aggregated their central rows while the exchange was in flight."""
    feature_norm: str = "none"
    """The input features' normalisation (``data.feature_norm``)."""
    quant_scheme: str = ""
    """Bit-width scheme of quantized modes (adaptive, uniform, random); empty otherwise."""
    peak_memory_mb: float = 0.0
    """Largest peak memory of any rank (resident set on CPU, allocated memory on CUDA)."""
    staleness_bound: int = 0
    """Modes onebit and adaqp-s: the configured bound S (0 for synchronous modes)."""
    staleness_histogram: dict[str, dict[str, int]] = field(default_factory=dict)
    """Whole run, per exchange: how many times halo rows s epochs old were used."""
    hidden_comm_fraction_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange, median over epochs after warm-up: the share of its time hidden."""
    restarts: int = 0
    """Times torchrun restarted the worker group (--max-restarts) during this run."""
    resumed_from_epoch: int = 0
    """The checkpoint's epoch this run continued from (0: started fresh)."""
    epochs_redone: int = 0
    """Epochs run past that checkpoint before the failure, and so trained again."""
    final_test_acc: float = 0.0
    """Test accuracy at the last evaluated epoch (beside ``test_acc_at_best_val``)."""
    effective_staleness: float = 0.0
    """Mean age in epochs of what the layers read, under the moving average's weights,
    over every training read of the run, synchronous ones at age 0 (0 for the modes that
    never read stale rows; the definition: docs/staleness.md#what-a-run-reports)."""
    threads: int = 0
    """Intra-op threads each worker trained with (torch's and the compiled kernels')."""
    host_of_rank: list[int] = field(default_factory=list)
    """Quantized modes: the host index of each rank (torchrun node or hostname), by which
    ``quant.full_precision = "auto"`` sends float32 within a host."""
    plan_bits_by_pair: dict[str, float] = field(default_factory=dict)
    """Quantized modes: "src->dst" -> mean planned width of the messages src sends dst
    (all exchanges; 32 is float32): under the last solve (adaptive widths), else the
    plans the run began with (the uniform scheme's throughout)."""
    predicted_exchange_s_by_tag: dict[str, float] = field(default_factory=dict)
    """Adaptive widths: per exchange, the cost model's time for the last solve's plan."""
    exchange_span_s_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange, median over the epochs after the last re-solve (after warm-up if
    none): quantization + exchange + dequantization, the slowest rank's."""
    calibrated_exchange_s_by_tag: dict[str, float] = field(default_factory=dict)
    """Adaptive widths: per exchange, the last solve's predicted time through the
    calibration (``cost_calibration``) fitted on the exchanges measured before it."""
    cost_calibration: dict[str, Any] = field(default_factory=dict)
    """Adaptive widths: the last solve's calibration, fitted on the exchange times
    measured (after the last arrival) under the plans before it: ``fixed_s`` and
    ``scale`` (one fixed cost for all exchanges), ``fixed_s_by_tag`` (each exchange's
    own; a plan's calibrated time is ``fixed_s_by_tag[t] + scale * predicted``). Empty
    until a re-solve follows another in the same process."""
    fabric_Bps: float | None = None
    """Host cost model: the aggregate rate the network carried between hosts when all
    sent at once, as profiled (None: not bounded below the hosts' own rates, or no host
    model)."""
    stale_exchanges: list[str] = field(default_factory=list)
    """Mode adaqp-s: the exchanges the planner made stale at its last choice."""
    drift_by_tag: dict[str, float] = field(default_factory=dict)
    """Mode adaqp-s: per exchange, the relative drift per epoch of its rows at the last
    choice (``|x_t - x_t-1| / |x_t|``, the largest over ranks)."""
    fresh_wait_s_by_tag: dict[str, float] = field(default_factory=dict)
    """Mode adaqp-s: per exchange, the wait per epoch last measured while it was fresh."""
    exchange_after_arrival_s_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange, over the same epochs: from the last rank reaching the exchange to
    the last rank's rows dequantized (wall clocks; hosts must keep them in sync)."""
    compute_rows: str = "all"
    """``train.compute_rows``: ``loss`` where a training step computed only the rows its
    loss reads, ``all`` where it computed every row."""
    rows_by_layer: list[int] = field(default_factory=list)
    """Rows a training step computed in each layer, summed over ranks (every layer the
    graph's nodes under ``compute_rows = "all"``)."""

    @property
    def test_acc(self) -> float:
        """``test_acc_at_best_val`` under its first name."""
        return self.test_acc_at_best_val

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` object: every field, plus ``test_acc``."""
        return {**dataclasses.asdict(self), "test_acc": self.test_acc_at_best_val}


def summarize(config: Config, world_size: int, outcome: Outcome, facts: RunFacts) -> Summary:
    """The run's summary from its configuration, what training produced and the facts
    the launcher adds."""
    records = outcome.records
    warmup = config.train.warmup_epochs
    mode = config.comm.mode

    def median(name: str) -> float:
        return median_after_warmup([getattr(r, name) for r in records], warmup)

    last = records[-1]
    exchange, wait = median("comm_time_s"), median("comm_wait_s")
    settled = settled_records(records, warmup)

    def settled_median(name: str) -> dict[str, float]:
        by_tag = [getattr(r, name) for r in settled]
        return {
            tag: float(statistics.median(d.get(tag, 0.0) for d in by_tag))
            for tag in sorted({t for d in by_tag for t in d})
        }

    return Summary(
        mode=mode,
        dataset=config.data.dataset,
        model=config.model.name,
        world_size=world_size,
        epochs=config.train.epochs,
        final_train_loss=last.train_loss,
        best_val_acc=outcome.best_val_acc,
        best_epoch=outcome.best_epoch,
        test_acc_at_best_val=outcome.test_acc_at_best_val,
        final_test_acc=next((r.test_acc for r in reversed(records) if r.test_acc is not None), 0.0),
        epoch_time_s=median("epoch_time_s"),
        comm_time_s=exchange,
        halo_bytes_per_epoch=last.halo_bytes_per_epoch,
        avg_bits=last.avg_bits,
        max_staleness=max(r.max_staleness for r in records),
        effective_staleness=_per_read(records),
        comm_wait_s=wait,
        allreduce_time_s=median("allreduce_time_s"),
        total_time_s=outcome.total_time_s,
        partition_dir=facts.partition_dir,
        edge_cut=outcome.edge_cut,
        split_seed=config.data.split_seed,
        feature_norm=config.data.feature_norm,
        seed=config.train.seed,
        metric=outcome.metric,
        quant_time_s=median("quant_time_s"),
        dequant_time_s=median("dequant_time_s"),
        cpu_time_s=median("cpu_time_s"),
        hidden_comm_fraction=_hidden(exchange, wait),
        halo_bytes_by_tag=last.bytes_by_tag,
        bits_histogram=last.bits_histogram,
        solver_time_s=sum(r.solver_time_s for r in records),
        input_cache_bytes=outcome.input_cache_bytes,
        cache_input_halo=outcome.cache_input_halo,
        transform_first=config.comm.transform_first,
        overlap=outcome.overlap,
        quant_scheme=config.quant.scheme if mode in QUANTIZED_MODES else "",
        peak_memory_mb=outcome.peak_memory_mb,
        staleness_bound=config.staleness.bound if mode in STALE_MODES else 0,
        staleness_histogram=_sum_histograms(r.staleness_by_tag for r in records),
        hidden_comm_fraction_by_tag={
            tag: median_after_warmup([r.hidden_by_tag.get(tag, 0.0) for r in records], warmup)
            for tag in sorted({t for r in records for t in r.hidden_by_tag})
        },
        exchange_span_s_by_tag=settled_median("exchange_span_by_tag"),
        exchange_after_arrival_s_by_tag=settled_median("exchange_after_arrival_by_tag"),
        restarts=facts.restarts,
        resumed_from_epoch=facts.resumed_from_epoch,
        epochs_redone=facts.epochs_redone,
        threads=facts.threads,
        compute_rows=config.train.compute_rows,
        rows_by_layer=list(outcome.rows_by_layer),
        **outcome.plan_report,
    )


def _hidden(exchange_s: float, wait_s: float) -> float:
    """The share of the exchange hidden behind compute, 1 - wait / exchange, in [0, 1]:
    the blocked wait is measured apart from the exchange and can exceed it by a little
    (a synchronous exchange hides nothing)."""
    return min(1.0, max(0.0, 1.0 - wait_s / exchange_s)) if exchange_s > 0 else 0.0


def last_solve(records: list[EpochRecord]) -> int:
    """The epoch after which the plans that ran last were solved (0: none was): the last
    re-solve before the final epoch (one after it plans epochs never run)."""
    solved = [r.epoch for r in records if r.solver_time_s > 0 and r.epoch < records[-1].epoch]
    return solved[-1] if solved else 0


def settled_records(records: list[EpochRecord], warmup: int) -> list[EpochRecord]:
    """The epochs under the last plans that ran (after warm-up where nothing was solved)."""
    solved_at = last_solve(records)
    return [r for r in records if r.epoch > solved_at] if solved_at else records[warmup:]


def _per_read(records: list[EpochRecord]) -> float:
    """``effective_staleness`` over the run: the epochs' figures weighted by their reads."""
    reads = [sum(n for h in r.staleness_by_tag.values() for n in h.values()) for r in records]
    total = sum(reads)
    weighted = sum(r.effective_staleness * n for r, n in zip(records, reads, strict=True))
    return weighted / total if total else 0.0


def _sum_histograms(histograms) -> dict[str, dict[str, int]]:
    total: dict[str, dict[str, int]] = {}
    for by_tag in histograms:
        for tag, hist in by_tag.items():
            into = total.setdefault(tag, {})
            for s, n in hist.items():
                into[s] = into.get(s, 0) + n
    return {t: dict(sorted(h.items(), key=lambda kv: int(kv[0]))) for t, h in sorted(total.items())}
