"""Run outputs: resolved config, one JSON line per epoch, and a summary.

Files written by rank 0 into the run's output directory:

- ``config.json``: the fully resolved configuration (plus world size and partition dir).
- ``metrics.jsonl``: one object per epoch (see ``EpochRecord``).
- ``summary.json``: the fields in ``Summary``; checks outside the test suite read them,
  so fields are only ever added, never renamed.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class EpochRecord:
    epoch: int
    train_loss: float
    """Global mean training loss of this epoch's forward pass."""
    epoch_time_s: float
    """Wall time of the training step (forward, backward, all-reduce, optimiser)."""
    comm_time_s: float
    """Halo exchange time in this epoch, mean over ranks (start to landing)."""
    comm_wait_s: float
    """Time blocked waiting for the exchange, mean over ranks."""
    allreduce_time_s: float
    """Gradient all-reduce time not hidden behind backward (blocked after it), mean over
    ranks."""
    halo_bytes: int
    """Bytes all ranks sent in halo exchanges during this epoch."""
    train_acc: float | None = None
    val_acc: float | None = None
    test_acc: float | None = None
    bytes_by_tag: dict[str, int] = field(default_factory=dict)
    """Halo bytes of all ranks by layer and direction (e.g. "layer1/forward")."""
    quant_time_s: float = 0.0
    """Time spent quantizing outgoing messages, mean over ranks."""
    dequant_time_s: float = 0.0
    """Time spent dequantizing received messages, mean over ranks."""
    avg_bits: float = 32.0
    """Bits per transmitted value in this epoch (32 for float32)."""
    values_by_bits: dict[str, int] = field(default_factory=dict)
    """Transmitted values (rows x width) of all ranks by bit width."""
    assign_time_s: float = 0.0
    """Bit-width re-assignment after this epoch (tracing exchange + solver), 0 if none."""
    wall_time_s: float = 0.0
    """Seconds since training started, at the end of this epoch's step."""
    staleness_by_tag: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per exchange: how many times halo rows (or gradients) s epochs old were used."""
    max_staleness: int = 0
    """Largest staleness used in this epoch (0: every exchange was waited for)."""
    hidden_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange: the share of its exchange time hidden behind compute."""
    exchange_span_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange: quantization + exchange + dequantization seconds, slowest rank."""
    exchange_after_arrival_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange: seconds from the last rank reaching it to the last rank's rows
    dequantized (the span without waiting for late peers; wall clocks must agree)."""

    @classmethod
    def from_counters(cls, epoch: int, train_loss: float, epoch_time_s: float, c, **extra):
        """A record from an epoch's reduced ``EpochCounters``."""
        return cls(
            epoch,
            train_loss,
            epoch_time_s,
            comm_time_s=c.comm_time_s,
            comm_wait_s=c.comm_wait_s,
            allreduce_time_s=c.allreduce_time_s,
            halo_bytes=c.halo_bytes,
            bytes_by_tag=dict(c.bytes_by_tag),
            quant_time_s=c.quant_time_s,
            dequant_time_s=c.dequant_time_s,
            avg_bits=c.avg_bits,
            values_by_bits={str(b): v for b, v in sorted(c.values_by_bits.items())},
            staleness_by_tag={
                t: {str(s): v for s, v in sorted(h.items())} for t, h in c.staleness_by_tag.items()
            },
            max_staleness=c.max_staleness,
            hidden_by_tag=hidden_fractions(c.comm_time_by_tag, c.comm_wait_by_tag),
            exchange_span_by_tag=dict(c.exchange_span_by_tag),
            exchange_after_arrival_by_tag=c.exchange_after_arrival_by_tag,
            **extra,
        )


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
    test_acc: float
    """Test accuracy at the epoch with the best validation accuracy."""
    epoch_time_s: float
    """Median epoch time after warm-up."""
    comm_time_s: float
    """Median per-epoch halo exchange time."""
    halo_bytes_per_epoch: int
    """Payload plus metadata bytes sent by all ranks in one training epoch."""
    avg_bits: float
    """Average bits per transmitted value (32 for full precision)."""
    max_staleness: int
    """Largest halo staleness used, in epochs (0 for synchronous modes)."""
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
    quant_scheme: str = ""
    """Bit-width scheme of quantized modes (adaptive, uniform, random); empty otherwise."""
    peak_memory_mb: float = 0.0
    """Largest peak memory of any rank (resident set on CPU, allocated memory on CUDA)."""
    staleness_bound: int = 0
    """Mode onebit: the configured bound S (0 for synchronous modes)."""
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
    host_of_rank: list[int] = field(default_factory=list)
    """Adaptive widths: the host index of each rank (torchrun node or hostname)."""
    plan_bits_by_pair: dict[str, float] = field(default_factory=dict)
    """Adaptive widths: "src->dst" -> mean planned width of the messages src sends dst
    under the last solve (all exchanges; 32 is full precision)."""
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
    exchange_after_arrival_s_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange, over the same epochs: from the last rank reaching the exchange to
    the last rank's rows dequantized (wall clocks; hosts must keep them in sync)."""


def hidden_fractions(time_by_tag: dict[str, float], wait_by_tag: dict[str, float]):
    """1 - wait / exchange time, per exchange (exchanges with a time only)."""
    return {
        tag: max(0.0, 1.0 - wait_by_tag.get(tag, 0.0) / t)
        for tag, t in sorted(time_by_tag.items())
        if t > 0
    }


def median_after_warmup(values: list[float], warmup: int) -> float:
    """Median of ``values[warmup:]`` (all values if fewer remain)."""
    tail = values[warmup:] or values
    return float(statistics.median(tail)) if tail else 0.0


class RunWriter:
    """Writes a run's files; a no-op on ranks other than 0."""

    def __init__(self, out_dir: str | Path, enabled: bool, history: dict[str, Any] | None = None):
        """``history``: a resumed checkpoint's; its records start ``metrics.jsonl`` (lines
        a failed run logged after that checkpoint are dropped: those epochs are redone)."""
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self._jsonl = None
        if enabled:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.out_dir / "metrics.jsonl", "w")  # noqa: SIM115
            for record in (history or {}).get("records", []):
                self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()

    def write_config(self, config: dict[str, Any]) -> None:
        if self.enabled:
            _write_json(self.out_dir / "config.json", config)

    def log_epoch(self, record: EpochRecord) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(dataclasses.asdict(record)) + "\n")
            self._jsonl.flush()

    def write_summary(self, summary: Summary) -> None:
        if self.enabled:
            _write_json(self.out_dir / "summary.json", dataclasses.asdict(summary))

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
