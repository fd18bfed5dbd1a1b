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

from adaqp.process.atomic import write_json

LEGACY_RECORD_NAMES = {
    "halo_bytes_per_epoch": "halo_bytes",
    "bits_histogram": "values_by_bits",
    "solver_time_s": "assign_time_s",
}
"""Fields ``metrics.jsonl`` also carries under the name they had before they were given
the name the summary uses (readers outside the project use both)."""


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
    halo_bytes_per_epoch: int
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
    bits_histogram: dict[str, int] = field(default_factory=dict)
    """Transmitted values (rows x width) of all ranks by bit width."""
    solver_time_s: float = 0.0
    """Bit-width re-assignment after this epoch (tracing exchange + solver), 0 if none."""
    wall_time_s: float = 0.0
    """Seconds since training started, at the end of this epoch's step and of the
    bit-width re-solve after it (the next epoch waits for it), before its evaluation."""
    staleness_by_tag: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per exchange: how many times halo rows (or gradients) s epochs old were used (in
    onebit and adaqp-s every training read, the synchronous ones at age 0; empty in the
    modes that never read stale rows)."""
    max_staleness: int = 0
    """Largest staleness used in this epoch (0: every exchange was waited for): the age of
    the oldest buffer a read chose, which ``staleness.bound`` bounds."""
    hidden_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange: the share of its exchange time hidden behind compute."""
    exchange_span_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange: quantization + exchange + dequantization seconds, slowest rank."""
    exchange_after_arrival_by_tag: dict[str, float] = field(default_factory=dict)
    """Per exchange: seconds from the last rank reaching it to the last rank's rows
    dequantized (the span without waiting for late peers; wall clocks must agree)."""
    cpu_time_s: float = 0.0
    """CPU seconds each rank's process used in the training step (all its threads: compute,
    (de)quantization, the communication library's), mean over ranks. Unlike the times
    above it does not grow while a process waits or is descheduled."""
    effective_staleness: float = 0.0
    """Mean age in epochs of what the layers read, under the moving average's weights
    (``staleness.smoothing`` keeps older buffers in it), over every rank's reads in
    ``staleness_by_tag``: every training read of a stale mode, a synchronous one (warm-up,
    ``sync_every``, ``fresh_last_layer``, an adaqp-s exchange left fresh) at age 0; 0
    where none was stale."""

    def to_json(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` object: every field, plus its older name where it has one."""
        out = dataclasses.asdict(self)
        out.update({old: out[new] for new, old in LEGACY_RECORD_NAMES.items()})
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> EpochRecord:
        """A record from ``to_json``'s object, or from one written before the renames."""
        obj = dict(obj)
        for new, old in LEGACY_RECORD_NAMES.items():
            value = obj.pop(old, None)
            if value is not None:
                obj.setdefault(new, value)
        return cls(**obj)

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
            halo_bytes_per_epoch=c.halo_bytes_per_epoch,
            bytes_by_tag=dict(c.bytes_by_tag),
            quant_time_s=c.quant_time_s,
            dequant_time_s=c.dequant_time_s,
            avg_bits=c.avg_bits,
            bits_histogram={str(b): v for b, v in sorted(c.bits_histogram.items())},
            staleness_by_tag={
                t: {str(s): v for s, v in sorted(h.items())} for t, h in c.staleness_by_tag.items()
            },
            max_staleness=c.max_staleness,
            effective_staleness=c.effective_staleness,
            hidden_by_tag=hidden_fractions(c.comm_time_by_tag, c.comm_wait_by_tag),
            exchange_span_by_tag=dict(c.exchange_span_by_tag),
            exchange_after_arrival_by_tag=c.exchange_after_arrival_by_tag,
            cpu_time_s=c.cpu_time_s,
            **extra,
        )


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
            write_json(self.out_dir / "config.json", config)

    def log_epoch(self, record: EpochRecord) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record.to_json()) + "\n")
            self._jsonl.flush()

    def write_summary(self, summary) -> None:
        """Writes ``summary.json`` from an ``adaqp.run.summary.Summary``."""
        if self.enabled:
            write_json(self.out_dir / "summary.json", summary.to_json())

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
