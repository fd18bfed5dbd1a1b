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
    """Gradient all-reduce time, mean over ranks."""
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


def median_after_warmup(values: list[float], warmup: int) -> float:
    """Median of ``values[warmup:]`` (all values if fewer remain)."""
    tail = values[warmup:] or values
    return float(statistics.median(tail)) if tail else 0.0


class RunWriter:
    """Writes a run's files; a no-op on ranks other than 0."""

    def __init__(self, out_dir: str | Path, enabled: bool):
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self._jsonl = None
        if enabled:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.out_dir / "metrics.jsonl", "w")  # noqa: SIM115

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
