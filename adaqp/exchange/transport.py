"""Halo exchange transport: one uneven ``all_to_all_single`` per exchange.

The transport only moves rows. ``start(rows, key, plan)`` launches an exchange
asynchronously and returns a handle; ``handle.wait()`` blocks until the rows land (and
dequantizes them), ``handle.blend_into(average, w)`` folds them into a moving average.
The handle carries its own bytes and timings; nothing else writes them. Which plan a key
gets, what is traced, and whether a layer waits at all is decided by an exchange policy
(``adaqp/exchange/policy.py``), not here.

A forward exchange sends the inner rows listed in ``send_idx`` (already gathered by the
caller, ``[S, D]``) and receives the halo rows ``[H, D]``; a backward exchange returns the
halo rows' gradients ``[H, D]`` to their owners and receives ``[S, D]`` gradient rows
aligned with ``send_idx``. Every rank joins every exchange, also one with nothing to send
or receive: a collective that one rank skipped would leave its peers waiting.

With a ``BitPlan`` every row travels at its planned width: each peer gets one uint8
buffer laid out by ``quant.quantize_mixed`` (float32 row min/max, then packed codes),
followed by the plain float32 rows of any row planned at full precision (32); sender
and receiver know the widths, so no header travels (``adaqp/quant/segment.py``; the
whole buffer: ``adaqp/exchange/message.py``). The quantizer's path (compiled CPU kernels
or torch operators, same bytes) is chosen per transport. Without a plan, rows travel as
float32. Every wait is bounded by ``timeout_s`` and fails naming the rank and the step.

Where a training step computes only the rows its loss reads (``adaqp/graph/loss_rows.py``),
``select`` gives a layer's training exchanges a subset of the send list and halo, which
an exchange moves where its caller says so (``start(..., selected=True)``: the layer
computes only the rows the loss reads): counts, sources, rounding keys and the plan
(cut) are then the subset's.

Shapes: S rows sent in forward, H halo rows, D features, R rows in one direction.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from adaqp.exchange import message
from adaqp.exchange.message import BitPlan
from adaqp.exchange.selection import Selection
from adaqp.quant import kernels as quant_kernels
from adaqp.quant.bits import FULL_PRECISION_BITS
from adaqp.quant.draws import Draw, RowKeys, draw_key
from adaqp.quant.mixed import blend_

logger = logging.getLogger(__name__)


class ExchangeError(RuntimeError):
    """A halo exchange failed or timed out; names the rank and the step."""


class Direction(enum.Enum):
    FORWARD = "forward"
    """Inner rows to the peers that hold them as halo."""
    BACKWARD = "backward"
    """Halo rows' gradients back to their owners."""
    INPUT_CACHE = "input-cache"
    """Layer-0 input rows, fetched once at start-up (forward layout)."""
    SETUP = "set-up"
    """Start-up statistics from receivers to senders (backward layout)."""

    @property
    def sends_inner(self) -> bool:
        """True when the rows sent are inner rows (forward layout)."""
        return self in (Direction.FORWARD, Direction.INPUT_CACHE)


@dataclass(frozen=True)
class ExchangeKey:
    """Names one exchange: a layer and a direction."""

    layer: int
    direction: Direction

    def __str__(self) -> str:
        """The name used in metrics (``layer1/forward``)."""
        return f"layer{self.layer}/{self.direction.value}"

    @classmethod
    def parse(cls, name: str) -> ExchangeKey:
        """The inverse of ``str(key)``, for reading saved state."""
        layer, _, direction = name.partition("/")
        if not layer.startswith("layer") or not layer[5:].isdigit():
            raise ValueError(f"not an exchange name: {name!r}")
        return cls(int(layer[5:]), Direction(direction))

    @classmethod
    def forward(cls, layer: int) -> ExchangeKey:
        return cls(layer, Direction.FORWARD)

    @classmethod
    def backward(cls, layer: int) -> ExchangeKey:
        return cls(layer, Direction.BACKWARD)


INPUT_CACHE_KEY = ExchangeKey(0, Direction.INPUT_CACHE)
SETUP_KEY = ExchangeKey(0, Direction.SETUP)


class PendingExchange:
    """Handle of one exchange in flight; ``wait()`` returns the received rows [R_in, D].

    Read-only figures: ``bytes_sent`` and ``bits_histogram`` (known at launch),
    ``quant_s`` and ``launch_s`` (time to quantize and to launch), ``squared_ranges``
    (float64 ``[R_out]``: each sent row's ``(max - min)²`` where it was asked for and the
    quantizer took the rows' minima and maxima, else None), and once waited
    ``wait_s`` (blocked in ``wait``), ``exchange_s`` (payload ready to landing) and
    ``dequant_s``. ``arrived_at`` and ``done_at`` date, on the wall clock that ranks
    compare, when this rank reached the exchange (before quantizing) and when its
    received rows were ready (after dequantizing).
    """

    def __init__(
        self,
        transport: HaloTransport,
        key: ExchangeKey,
        work,
        recv: torch.Tensor,
        *,
        bytes_sent: int,
        bits_histogram: dict[int, int],
        quant_s: float = 0.0,
        launch_s: float = 0.0,
        decode: Callable[..., torch.Tensor] | None = None,
        squared_ranges: torch.Tensor | None = None,
    ):
        self._transport = transport
        self.squared_ranges = squared_ranges
        self._key = key
        self._work = work
        self._recv = recv
        self._decode = decode
        self._bytes_sent = bytes_sent
        self._values_by_bits = bits_histogram
        self._quant_s = quant_s
        self._launch_s = launch_s
        self._started = time.perf_counter() - launch_s
        self._arrived_at = time.time() - launch_s - quant_s
        self._done_at: float | None = None
        self._rows: torch.Tensor | None = None
        self._landed: float | None = None  # dated by the landing callback
        self._landed_at: float | None = None  # dated once waited
        self._wait_s = self._exchange_s = self._dequant_s = 0.0
        if work is not None:
            # Dates the landing of an exchange that is waited for much later (buffered).
            work.get_future().add_done_callback(self._on_landed)

    def _on_landed(self, _future) -> None:
        if self._landed is None:
            self._landed = time.perf_counter()

    key = property(lambda self: self._key)
    bytes_sent = property(lambda self: self._bytes_sent)
    bits_histogram = property(lambda self: dict(self._values_by_bits))
    quant_s = property(lambda self: self._quant_s)
    launch_s = property(lambda self: self._launch_s)
    wait_s = property(lambda self: self._wait_s)
    exchange_s = property(lambda self: self._exchange_s)
    dequant_s = property(lambda self: self._dequant_s)
    arrived_at = property(lambda self: self._arrived_at)
    done_at = property(lambda self: self._done_at)

    @property
    def waited(self) -> bool:
        """Whether the rows have been taken (by ``wait`` or ``blend_into``)."""
        return self._landed_at is not None

    def is_completed(self) -> bool:
        """True once the rows have landed (``wait`` would not block)."""
        if self._landed_at is not None:
            return True
        return self._work is None or self._work.is_completed()

    def wait(self) -> torch.Tensor:
        """Blocks until the rows land; returns them (the same tensor on every call)."""
        if self._rows is None:
            self._land()
            self._rows = self._decoded()
            self._recv = self._decode = None
        return self._rows

    def blend_into(self, average: torch.Tensor, weight: float) -> torch.Tensor:
        """``average`` becomes ``blend_(average, rows, weight)`` with the rows ``wait``
        returns; quantized rows not decoded yet are decoded straight into it (one pass, not
        two). Returns ``average``."""
        if self._rows is not None or self._decode is None:
            return blend_(average, self.wait(), weight)
        self._land()
        self._decoded(average, weight)  # the bytes stay: a wait decodes them again
        return average

    def _land(self) -> None:
        """Blocks until the payload has landed (once), timing the wait."""
        if self._landed_at is not None:
            return
        began = time.perf_counter()
        self._finish()
        landed = time.perf_counter()
        self._wait_s = landed - began
        self._landed_at = self._landed or landed  # maybe long before this wait
        self._exchange_s = self._landed_at - self._started

    def _decoded(self, *into) -> torch.Tensor:
        """The landed rows, decoded (and timed) where they are quantized; ``into``: an
        average and a weight to blend them into. The rows are ready when it ends."""
        began = time.perf_counter()
        rows = self._recv if self._decode is None else self._decode(self._recv, *into)
        self._dequant_s = time.perf_counter() - began if self._decode is not None else 0.0
        self._done_at = time.time() - (time.perf_counter() - self._landed_at - self._dequant_s)
        return rows

    def release(self) -> None:
        """Blocks until the exchange has landed and drops its rows unread."""
        if self._rows is None:
            self._finish()
            self._recv = self._decode = None

    def release_if_landed(self) -> bool:
        """``release()`` if that would not block; returns whether it did."""
        if not self.is_completed():
            return False
        self.release()
        return True

    def _finish(self) -> None:
        if self._work is None:
            return
        t = self._transport
        try:
            self._work.wait(timeout=timedelta(seconds=t.timeout_s))
        except Exception as exc:  # gloo/nccl raise RuntimeError subclasses
            raise ExchangeError(
                f"rank {t.rank}: halo exchange {self._key} at {t.step} failed or timed "
                f"out after {t.timeout_s:.0f}s (is a peer dead?): {exc}"
            ) from exc
        self._work = None  # no collective handle may outlive the process group


class HaloTransport:
    """Moves halo rows between the ranks of ``group`` according to a partition's lists.

    Args:
        rank: this worker's rank (for messages).
        send_counts: forward rows sent to each peer, length P.
        recv_counts: halo rows received from each peer, length P.
        timeout_s: bound on every wait.
        group: process group (default: the world).
        seed: seed of the stochastic rounding, keyed (``adaqp/quant/draws.py``) by it, the
            epoch, the layer, the direction and the global id of the node each row is.
        device: where quantization buffers live.
        kernels: the quantizer's path, ``auto``, ``torch`` or ``compiled`` (None: the process
            default; see adaqp/quant/kernels.py), resolved here for ``device``.
        send_idx: the inner row each forward row is (``[S]``), if forward rows are always
            ``rows.index_select(0, send_idx)``: a row sent to several peers is then
            quantized once (``adaqp/exchange/message.py``).
        send_ids, halo_ids: the global ids of the nodes of the forward rows sent (``[S]``)
            and of the halo rows (``[H]``, the backward rows sent); None: the row index.
    """

    def __init__(
        self,
        rank: int,
        send_counts: list[int],
        recv_counts: list[int],
        timeout_s: float = 600.0,
        group: dist.ProcessGroup | None = None,
        seed: int = 0,
        device: torch.device | str = "cpu",
        kernels: str | None = None,
        send_idx: torch.Tensor | None = None,
        send_ids: np.ndarray | None = None,
        halo_ids: np.ndarray | None = None,
    ):
        self.rank = rank
        self.send_idx = send_idx
        self.send_counts = list(send_counts)
        self.recv_counts = list(recv_counts)
        self.timeout_s = timeout_s
        self.group = group
        self.step = "set-up"
        """Where training is (e.g. "epoch 3"), quoted in errors; set through ``at``."""
        self.seed = seed
        self.send_ids, self.halo_ids = send_ids, halo_ids
        self.epoch = 0
        """The epoch the rounding is keyed by; set by the trainer (``begin_epoch``)."""
        self.kernels = "compiled" if quant_kernels.use_compiled(kernels, device) else "torch"
        """The quantizer's path for this transport's device: compiled or torch."""
        self.selections: dict[int, Selection] = {}
        """By layer: the rows its exchanges move when they send fewer than all (``select``)."""

    def select(
        self, layer: int, send_keep: np.ndarray, halo_keep: np.ndarray, send_idx: torch.Tensor
    ) -> None:
        """Training exchanges of ``layer`` move only the rows ``send_keep`` of the send list
        (forward rows ``rows.index_select(0, send_idx)``) and ``halo_keep`` of the halo,
        ascending positions, which peers agree on (``adaqp/graph/loss_rows.py``)."""
        counts, ids = (self.send_counts, self.recv_counts), (self.send_ids, self.halo_ids)
        self.selections[layer] = Selection.of(send_keep, halo_keep, *counts, send_idx, *ids)

    def selection(self, key: ExchangeKey, selected: bool) -> Selection | None:
        """The rows an exchange of ``key`` moves when they are fewer than the whole
        exchange's: where the caller computes only its layer's training rows
        (``selected``), the layer's selection (if ``select`` gave one); else None (every
        row: evaluation, set-up, a step that computes every row).

        Said by the caller, never inferred from the number of rows sent: a rank may send
        its whole send list while reading only part of its halo, or the reverse."""
        if not selected or key.direction not in (Direction.FORWARD, Direction.BACKWARD):
            return None
        return self.selections.get(key.layer)

    def warm_up(self) -> None:
        """Loads (or compiles once per machine) the compiled quantizer now, before any timed
        exchange; a no-op on the torch path. Called by the policies that quantize."""
        if self.kernels == "compiled":
            quant_kernels.warm_up()

    def at(self, step: str) -> None:
        """Names the step that errors quote from now on."""
        self.step = step

    def begin_epoch(self, epoch: int) -> None:
        """Exchanges from now on round with the draws of ``epoch``."""
        self.epoch = epoch

    def draw_keys(self, key: ExchangeKey, rows: int, selection: Selection | None = None) -> RowKeys:
        """The keys of an exchange's rounding: its base key hashes (seed, epoch, layer,
        direction; the sending rank too for gradients, partial sums that the owner adds, so
        that their rounding errors are independent), each row's key is its node's global id.
        A node's row is thus rounded alike whichever rank sends it to whichever peer, and
        whichever rows travel with it (``selection``)."""
        owner = selection or self
        send_ids, halo_ids = owner.send_ids, owner.halo_ids
        if key.direction.sends_inner:
            base = draw_key(self.seed, self.epoch, key.layer, Draw.FORWARD)
            return RowKeys.of(base, send_ids, rows)
        base = draw_key(self.seed, self.epoch, key.layer, Draw.BACKWARD, self.rank)
        return RowKeys.of(base, halo_ids, rows)

    def counts(
        self, key: ExchangeKey, selection: Selection | None = None
    ) -> tuple[list[int], list[int]]:
        """(rows out per peer, rows in per peer) of an exchange in ``key``'s direction, of
        the whole exchange or of the rows ``selection`` moves."""
        owner = selection or self
        send, recv = owner.send_counts, owner.recv_counts
        return (send, recv) if key.direction.sends_inner else (recv, send)

    def start(
        self,
        rows_RD: torch.Tensor,
        key: ExchangeKey,
        plan: BitPlan | None = None,
        ranges: bool = False,
        *,
        selected: bool = False,
    ) -> PendingExchange:
        """Sends ``rows_RD`` (peer segments in rank order) and returns the handle; with
        ``ranges``, the handle's ``squared_ranges`` where the quantizer reads them. A
        ``selected`` exchange moves the rows ``select`` chose for its layer, if any
        (``plan``, the whole exchange's, is then cut to them); any other, every row."""
        selection = self.selection(key, selected)
        out_counts, in_counts = self.counts(key, selection)
        if plan is not None and selection is not None:
            plan = selection.cut(plan, key.direction.sends_inner)
        if rows_RD.shape[0] != sum(out_counts):
            raise ValueError(
                f"rank {self.rank}: {key} sends {sum(out_counts)} rows, got {rows_RD.shape[0]}"
            )
        rows_RD = rows_RD.contiguous()
        dim, in_rows = rows_RD.shape[1], sum(in_counts)
        if plan is None or plan.all_full:
            # Float32 rows go as they are: no copy into a byte buffer and back (the
            # layout of a plan's float32 rows is exactly theirs).
            recv = rows_RD.new_empty((in_rows, dim))
            began = time.perf_counter()
            work = self._launch(recv, rows_RD, in_counts, out_counts, key)
            return PendingExchange(
                self,
                key,
                work,
                recv,
                bytes_sent=rows_RD.numel() * rows_RD.element_size(),
                bits_histogram={FULL_PRECISION_BITS: rows_RD.numel()} if rows_RD.numel() else {},
                launch_s=time.perf_counter() - began,
            )

        began = time.perf_counter()
        sources = (selection or self).send_idx if key.direction is Direction.FORWARD else None
        sent, received = plan.layouts(dim, out_counts, in_counts, sources)
        send = torch.empty(sum(sent.segment_bytes), dtype=torch.uint8, device=rows_RD.device)
        keys = self.draw_keys(key, rows_RD.shape[0], selection)
        squared = torch.empty(rows_RD.shape[0], dtype=torch.float64) if ranges else None
        if not message.encode(rows_RD, sent, send, plan.has_full, self.kernels, keys, squared):
            squared = None
        # The exchange clock starts once the payload is ready: quantization is counted
        # apart and is not communication that compute could hide.
        quantized = time.perf_counter()
        recv = torch.empty(sum(received.segment_bytes), dtype=torch.uint8, device=rows_RD.device)
        work = self._launch(recv, send, received.segment_bytes, sent.segment_bytes, key)

        # The float rows are not needed once encoded: the decoder keeps only their dtype,
        # so they go as soon as the caller lets them go (not when the exchange lands).
        dtype = rows_RD.dtype

        def decode(buf: torch.Tensor, out: torch.Tensor | None = None, blend: float | None = None):
            if out is None:
                out = torch.empty((in_rows, dim), dtype=dtype, device=buf.device)
            return message.decode(buf, received, out, plan.has_full, self.kernels, blend)

        return PendingExchange(
            self,
            key,
            work,
            recv,
            bytes_sent=send.numel(),
            bits_histogram=plan.bits_histogram(dim),
            quant_s=quantized - began,
            launch_s=time.perf_counter() - quantized,
            decode=decode,
            squared_ranges=squared,
        )

    def _launch(self, recv, send, in_splits, out_splits, key: ExchangeKey):
        try:
            return dist.all_to_all_single(
                recv, send, in_splits, out_splits, group=self.group, async_op=True
            )
        except Exception as exc:
            raise ExchangeError(
                f"rank {self.rank}: could not start halo exchange {key} at {self.step}: {exc}"
            ) from exc
