"""Halo exchange transport: one uneven ``all_to_all_single`` per layer and direction.

``start`` launches an exchange asynchronously and returns a handle; ``wait`` on the
handle blocks until the rows land (and dequantizes them). Forward sends inner rows to
the peers that hold them as halo; backward returns the halo rows' gradients to their
owners. Every wait is bounded by ``timeout_s`` and fails with the rank and the step.

Each exchange is named by a tag (``"layer1/forward"``). When quantization is on and a
``BitPlan`` exists for the tag, every row travels at its planned width: each peer gets one
uint8 buffer laid out by ``quant.quantize_mixed`` (float32 row min/max, then packed codes);
sender and receiver know the widths, so no header travels. Without a plan, rows travel
as float32.

Shapes: I inner rows, H halo rows, S rows sent, D features, R rows in one direction.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from adaqp.quant import dequantize_mixed, mixed_buffer_bytes, quantize_mixed

logger = logging.getLogger(__name__)

FULL_PRECISION_BITS = 32


class ExchangeError(RuntimeError):
    """A halo exchange failed or timed out; names the rank and the step."""


@dataclass
class ExchangeStats:
    """Counters for one epoch (reset by the trainer)."""

    bytes_sent: int = 0
    """Payload plus metadata bytes this rank sent."""
    exchange_s: float = 0.0
    """Wall time from each launch (payload ready) to the end of its wait."""
    wait_s: float = 0.0
    """Time blocked in the collective calls, launch and wait: exchange time not hidden."""
    quant_s: float = 0.0
    dequant_s: float = 0.0
    calls: int = 0
    bytes_by_tag: dict[str, int] = field(default_factory=dict)
    values_by_bits: Counter = field(default_factory=Counter)
    """Transmitted values (rows x D) by width; 32 for float32 rows."""

    def reset(self) -> None:
        self.bytes_sent, self.exchange_s, self.wait_s, self.calls = 0, 0.0, 0.0, 0
        self.quant_s, self.dequant_s = 0.0, 0.0
        self.bytes_by_tag = {}
        self.values_by_bits = Counter()


@dataclass
class BitPlan:
    """Per-row widths of one tagged exchange, in this rank's send and receive order."""

    out_bits: torch.Tensor
    """int8 [R_out]: width of each row this rank sends (peer segments in rank order)."""
    in_bits: torch.Tensor
    """int8 [R_in]: width of each row this rank receives (peer segments in rank order)."""
    _splits: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)

    def byte_splits(self, dim: int, out_counts: list[int], in_counts: list[int]):
        """Bytes sent to and received from each peer for rows of width ``dim`` (cached)."""
        if dim not in self._splits:
            self._splits[dim] = (
                _segment_bytes(self.out_bits, out_counts, dim),
                _segment_bytes(self.in_bits, in_counts, dim),
            )
        return self._splits[dim]


def _segment_bytes(bits: torch.Tensor, counts: list[int], dim: int) -> list[int]:
    return [mixed_buffer_bytes(seg, dim) for seg in torch.split(bits, counts)]


class PendingExchange:
    """Handle of an exchange in flight; ``wait()`` returns the received rows [R_in, D]."""

    def __init__(
        self,
        exchanger: HaloExchanger,
        work,
        recv: torch.Tensor,
        tag: str,
        start: float,
        decode=None,
    ):
        self._exchanger = exchanger
        self._work = work
        self._recv = recv
        self._tag = tag
        self._start = start
        self._decode = decode

    def wait(self) -> torch.Tensor:
        ex = self._exchanger
        began = time.perf_counter()
        if self._work is not None:
            try:
                self._work.wait(timeout=timedelta(seconds=ex.timeout_s))
            except Exception as exc:  # gloo/nccl raise RuntimeError subclasses
                raise ExchangeError(
                    f"rank {ex.rank}: halo exchange {self._tag} at {ex.step} failed or timed "
                    f"out after {ex.timeout_s:.0f}s (is a peer dead?): {exc}"
                ) from exc
            self._work = None  # no collective handle may outlive the process group
        landed = time.perf_counter()
        ex.stats.wait_s += landed - began
        ex.stats.exchange_s += landed - self._start
        if self._decode is None:
            return self._recv
        rows = self._decode(self._recv)
        ex.stats.dequant_s += time.perf_counter() - landed
        return rows


class HaloExchanger:
    """Moves halo rows between the ranks of ``group`` according to a partition's lists.

    Args:
        rank: this worker's rank (for messages).
        send_idx: int64 [S] local inner ids to send, peer by peer in rank order.
        send_counts: rows sent to each peer, length P.
        recv_counts: halo rows received from each peer, length P.
        timeout_s: bound on every wait.
        group: process group (default: the world).
        seed: seed of the stochastic rounding (offset by rank).
    """

    def __init__(
        self,
        rank: int,
        send_idx: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        timeout_s: float = 600.0,
        group: dist.ProcessGroup | None = None,
        seed: int = 0,
    ):
        self.rank = rank
        self.send_idx = send_idx
        self.send_counts = list(send_counts)
        self.recv_counts = list(recv_counts)
        self.num_halo = sum(self.recv_counts)
        self.timeout_s = timeout_s
        self.group = group
        self.stats = ExchangeStats()
        self.step = "set-up"
        """Where training is (e.g. "epoch 3"); set by the trainer, quoted in errors."""
        self.quantize = False
        """Use the bit plans (training steps of quantized modes); off = float32."""
        self.plans: dict[str, BitPlan] = {}
        self.default_plan = None
        """Callable (tag, out_rows, in_rows) -> BitPlan for tags without a plan, or None."""
        self.tracer = None
        """Callable (tag, rows_RD) seeing every outgoing row block while tracing, or None."""
        self.generator = torch.Generator(device=send_idx.device)
        self.generator.manual_seed(seed * 1_000_003 + rank)

    def start(self, h_ID: torch.Tensor, tag: str = "forward") -> PendingExchange:
        """Sends this rank's rows to the peers; ``wait()`` gives the halo rows [H, D]."""
        rows = h_ID.index_select(0, self.send_idx)
        return self._exchange(rows, self.send_counts, self.recv_counts, tag)

    def start_grad(self, grad_HD: torch.Tensor, tag: str = "backward") -> PendingExchange:
        """Returns halo gradients to their owners; ``wait()`` gives [S, D] gradient rows
        aligned with ``send_idx`` (to be summed into the inner rows)."""
        return self._exchange(grad_HD.contiguous(), self.recv_counts, self.send_counts, tag)

    def plan_for(self, tag: str, out_rows: int, in_rows: int) -> BitPlan | None:
        if not self.quantize:
            return None
        plan = self.plans.get(tag)
        if plan is None and self.default_plan is not None:
            plan = self.plans[tag] = self.default_plan(tag, out_rows, in_rows)
        return plan

    def _exchange(self, rows_RD, out_counts, in_counts, tag) -> PendingExchange:
        dim = rows_RD.shape[1]
        in_rows = sum(in_counts)
        if self.tracer is not None:
            self.tracer(tag, rows_RD)
        plan = self.plan_for(tag, rows_RD.shape[0], in_rows)
        start = time.perf_counter()
        if plan is None:
            recv = rows_RD.new_empty((in_rows, dim))
            self._count(
                tag,
                rows_RD.numel() * rows_RD.element_size(),
                {FULL_PRECISION_BITS: rows_RD.numel()},
            )
            work = self._launch(recv, rows_RD, in_counts, out_counts, tag)
            return PendingExchange(self, work, recv, tag, start)

        out_bytes, in_bytes = plan.byte_splits(dim, out_counts, in_counts)
        send = torch.empty(sum(out_bytes), dtype=torch.uint8, device=rows_RD.device)
        for seg_rows, seg_bits, seg_out in zip(
            torch.split(rows_RD, out_counts),
            torch.split(plan.out_bits, out_counts),
            torch.split(send, out_bytes),
            strict=True,
        ):
            if seg_rows.shape[0]:
                quantize_mixed(seg_rows, seg_bits, self.generator, out=seg_out)
        widths, counts = torch.unique(plan.out_bits, return_counts=True)
        self._count(
            tag, send.numel(), {int(b): int(c) * dim for b, c in zip(widths, counts, strict=True)}
        )
        # The exchange clock starts once the payload is ready: quantization is counted
        # apart and is not communication that compute could hide.
        quantized = time.perf_counter()
        self.stats.quant_s += quantized - start
        start = quantized
        recv = torch.empty(sum(in_bytes), dtype=torch.uint8, device=rows_RD.device)
        work = self._launch(recv, send, in_bytes, out_bytes, tag)

        def decode(buf: torch.Tensor) -> torch.Tensor:
            out = torch.empty((in_rows, dim), dtype=rows_RD.dtype, device=buf.device)
            for seg_buf, seg_bits, seg_out in zip(
                torch.split(buf, in_bytes),
                torch.split(plan.in_bits, in_counts),
                torch.split(out, in_counts),
                strict=True,
            ):
                if seg_out.shape[0]:
                    dequantize_mixed(seg_buf, seg_bits, dim, out=seg_out)
            return out

        return PendingExchange(self, work, recv, tag, start, decode)

    def _count(self, tag: str, nbytes: int, values_by_bits: dict[int, int]) -> None:
        self.stats.bytes_sent += nbytes
        self.stats.calls += 1
        self.stats.bytes_by_tag[tag] = self.stats.bytes_by_tag.get(tag, 0) + nbytes
        self.stats.values_by_bits.update(values_by_bits)

    def _launch(self, recv, send, out_splits, in_splits, tag):
        began = time.perf_counter()
        try:
            work = dist.all_to_all_single(
                recv, send, out_splits, in_splits, group=self.group, async_op=True
            )
            # Launching may block (copies, connection set-up): that is not hidden either.
            self.stats.wait_s += time.perf_counter() - began
            return work
        except Exception as exc:
            raise ExchangeError(
                f"rank {self.rank}: could not start halo exchange {tag} at {self.step}: {exc}"
            ) from exc


class NoCommExchanger(HaloExchanger):
    """Benchmark-only stand-in that skips the exchange: halo rows and gradients arrive as
    zeros at once, nothing is sent. Training with it is *not* the same model; its epoch
    time is the lower bound that a perfectly hidden exchange could reach."""

    def _exchange(self, rows_RD, out_counts, in_counts, tag) -> PendingExchange:
        recv = rows_RD.new_zeros((sum(in_counts), rows_RD.shape[1]))
        self._count(tag, 0, {})
        return PendingExchange(self, None, recv, tag, time.perf_counter())
