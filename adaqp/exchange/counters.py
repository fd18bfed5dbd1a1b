"""Per-epoch exchange counters: what one training step's halo exchanges and all-reduces
cost on one rank, and how the ranks combine them (``EpochCounters.reduced``).

The transport and the exchange policies record into an ``EpochCounters``; the trainer
reduces it over the ranks and turns it into a ``metrics.jsonl`` line
(``adaqp.run.metrics.EpochRecord``). Field names are the names in ``metrics.jsonl``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from adaqp.quant.bits import BIT_WIDTHS, FULL_PRECISION_BITS


def _reduced(how: str, default_factory=None, default=0.0, values: type = int):
    """A counter field and how ranks combine it: sum, mean, max, or ``per_read`` (a mean
    over the reads in ``staleness_by_tag``, every rank's). ``values``: the type of a dict
    field's values after a sum or max (a mean is always a float)."""
    metadata = {"reduce": how, "values": values}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class EpochCounters:
    """Exchange and all-reduce figures of one training step on one rank.

    Field names are the names in ``metrics.jsonl``. Components record into it through
    the ``record_*`` methods; ``reduced`` combines the ranks field by field (times are
    means over ranks, bytes and counts sums, staleness the maximum, the effective
    staleness a mean over every rank's reads).
    """

    comm_time_s: float = _reduced("mean")
    """Exchange time: payload ready to landing, summed over this step's exchanges."""
    comm_wait_s: float = _reduced("mean")
    """Time blocked launching and waiting for exchanges: exchange time not hidden."""
    quant_time_s: float = _reduced("mean")
    dequant_time_s: float = _reduced("mean")
    allreduce_time_s: float = _reduced("mean")
    cpu_time_s: float = _reduced("mean")
    """CPU seconds the rank's process used in the step, all its threads (set by the
    trainer)."""
    halo_bytes_per_epoch: int = _reduced("sum", default=0)
    """Payload plus metadata bytes sent."""
    bits_histogram: dict[int, int] = _reduced("sum", dict)
    """Transmitted values (rows x width) by bit width."""
    bytes_by_tag: dict[str, int] = _reduced("sum", dict)
    """Halo bytes by exchange (``layer1/forward``)."""
    staleness_by_tag: dict[str, dict[int, int]] = _reduced("sum", dict)
    """Per exchange: how many times halo rows (or gradients) s epochs old were used. In
    the modes that may read stale rows (onebit, adaqp-s) every training read counts, one
    that waited for its own epoch's exchange at age 0; the other modes count none."""
    max_staleness: int = _reduced("max", default=0)
    """The oldest buffer a read chose, in epochs (what ``staleness.bound`` bounds)."""
    effective_staleness: float = _reduced("per_read")
    """Mean over the reads counted in ``staleness_by_tag`` (every training read of a
    stale mode, the synchronous ones at age 0) of the age of what the layer read, in
    epochs, under the moving average's weights (with ``staleness.smoothing`` it keeps
    older buffers: a read one epoch old at every epoch settles at 1 / (1 - g)); 0 where
    no read was stale. One read history gives one figure in either stale mode
    (docs/staleness.md#what-a-run-reports)."""
    comm_time_by_tag: dict[str, float] = _reduced("mean", dict)
    """``comm_time_s`` by exchange."""
    comm_wait_by_tag: dict[str, float] = _reduced("mean", dict)
    """``comm_wait_s`` by exchange (launch and wait)."""
    exchange_span_by_tag: dict[str, float] = _reduced("max", dict, values=float)
    """Per exchange: quantization + exchange + dequantization, the slowest rank's: what
    the bit-width planner's cost model predicts."""
    exchange_arrived_at_by_tag: dict[str, float] = _reduced("max", dict, values=float)
    """Per exchange: wall clock when the last rank reached it."""
    exchange_done_at_by_tag: dict[str, float] = _reduced("max", dict, values=float)
    """Per exchange: wall clock when the last rank had its rows dequantized."""

    def record_launch(self, handle) -> None:
        """Bytes and launch-side times of an exchange (a ``comm.PendingExchange``)."""
        tag = str(handle.key)
        self.halo_bytes_per_epoch += handle.bytes_sent
        self.bytes_by_tag[tag] = self.bytes_by_tag.get(tag, 0) + handle.bytes_sent
        for bits, count in handle.bits_histogram.items():
            self.bits_histogram[bits] = self.bits_histogram.get(bits, 0) + count
        self.quant_time_s += handle.quant_s
        # Launching may block (copies, connection set-up): that is not hidden either.
        self.comm_wait_s += handle.launch_s
        self.comm_wait_by_tag[tag] = self.comm_wait_by_tag.get(tag, 0.0) + handle.launch_s

    def record_landing(self, handle, blocked_s: float) -> None:
        """Landing-side times of an exchange once waited; ``blocked_s`` is the time the
        caller was actually held up (a buffered exchange may land unobserved)."""
        tag = str(handle.key)
        self.comm_time_s += handle.exchange_s
        self.dequant_time_s += handle.dequant_s
        self.comm_wait_s += blocked_s
        self.comm_time_by_tag[tag] = self.comm_time_by_tag.get(tag, 0.0) + handle.exchange_s
        self.comm_wait_by_tag[tag] = self.comm_wait_by_tag.get(tag, 0.0) + blocked_s
        span = handle.quant_s + handle.exchange_s + handle.dequant_s
        self.exchange_span_by_tag[tag] = self.exchange_span_by_tag.get(tag, 0.0) + span
        arrived = self.exchange_arrived_at_by_tag
        done = self.exchange_done_at_by_tag
        arrived[tag] = max(arrived.get(tag, 0.0), handle.arrived_at)
        done[tag] = max(done.get(tag, 0.0), handle.done_at)

    @property
    def exchange_after_arrival_by_tag(self) -> dict[str, float]:
        """Per exchange (reduced counters): seconds from the last rank's arrival to the
        last rank's dequantized rows, the exchange's own time without the ranks' skew."""
        return {
            tag: max(0.0, self.exchange_done_at_by_tag.get(tag, arrived) - arrived)
            for tag, arrived in sorted(self.exchange_arrived_at_by_tag.items())
        }

    @property
    def stale_reads(self) -> int:
        """Reads counted in ``staleness_by_tag`` (those ``effective_staleness`` averages)."""
        return sum(n for hist in self.staleness_by_tag.values() for n in hist.values())

    def record_staleness(self, tag: str, staleness: int, effective: float | None = None) -> None:
        """One read of exchange ``tag``: the chosen buffer is ``staleness`` epochs old, and
        what the layer read ``effective`` epochs under the average's weights (default: the
        buffer's own age, as without smoothing)."""
        hist = self.staleness_by_tag.setdefault(tag, {})
        hist[staleness] = hist.get(staleness, 0) + 1
        self.max_staleness = max(self.max_staleness, staleness)
        effective = float(staleness if effective is None else effective)
        self.effective_staleness += (effective - self.effective_staleness) / self.stale_reads

    def record_allreduce(self, seconds: float) -> None:
        self.allreduce_time_s += seconds

    @property
    def avg_bits(self) -> float:
        sent = sum(self.bits_histogram.values())
        if not sent:
            return float(FULL_PRECISION_BITS)
        return sum(b * v for b, v in self.bits_histogram.items()) / sent

    def reduced(
        self,
        all_reduce: Callable[[torch.Tensor, str], torch.Tensor],
        world_size: int,
        tags: Sequence[str],
        staleness_bound: int = 0,
    ) -> EpochCounters:
        """The counters of all ranks combined, field by field.

        Args:
            all_reduce: ``(tensor, "sum" | "max") -> tensor`` over the ranks.
            world_size: number of ranks (for means).
            tags: every exchange name any rank may have recorded (the same on all ranks).
            staleness_bound: the largest staleness any rank may have recorded.
        """
        staleness = range(staleness_bound + 1)
        values, layout = [], []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "bits_histogram":
                keys = list(BIT_WIDTHS)
            elif f.name.endswith("_by_tag") and f.name != "staleness_by_tag":
                keys = list(tags)
            elif f.name == "staleness_by_tag":
                keys = [(t, s) for t in tags for s in staleness]
                # Flattened as it is, so that an age above the bound is an error, not lost.
                value = {(t, s): n for t, hist in value.items() for s, n in hist.items()}
            else:
                keys = None
            if f.name == "effective_staleness":
                value *= self.stale_reads  # summed over ranks, then per read
            if keys is None:
                layout.append((f, None, len(values)))
                values.append(float(value))
            else:
                unknown = set(value) - set(keys)
                if unknown:
                    raise ValueError(f"{f.name}: keys {sorted(map(str, unknown))} not expected")
                layout.append((f, keys, len(values)))
                values += [float(value.get(k, 0)) for k in keys]
        flat = torch.tensor(values, dtype=torch.float64)
        summed = all_reduce(flat.clone(), "sum").tolist()
        maxed = all_reduce(flat.clone(), "max").tolist()
        out = EpochCounters()
        for f, keys, start in layout:
            how = f.metadata["reduce"]
            source = maxed if how == "max" else summed
            if keys is None:
                total = source[start] / world_size if how == "mean" else source[start]
                if how == "per_read":  # staleness_by_tag, before it, is reduced already
                    total = total / out.stale_reads if out.stale_reads else 0.0
                setattr(out, f.name, type(getattr(self, f.name))(total))
                continue
            kind = float if how == "mean" else f.metadata["values"]
            scale = world_size if how == "mean" else 1
            entries = {k: kind(source[start + i] / scale) for i, k in enumerate(keys)}
            entries = {k: v for k, v in entries.items() if v}
            if f.name == "staleness_by_tag":
                nested: dict[str, dict[int, int]] = {}
                for (t, s), v in entries.items():
                    nested.setdefault(t, {})[s] = v
                entries = nested
            setattr(out, f.name, entries)
        return out
