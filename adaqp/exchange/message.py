"""One direction of a planned exchange as one buffer: every peer's segment, in rank order.

A ``BitPlan`` gives each row its width; ``MessageLayout`` is where each peer's segment
(``adaqp/quant/segment.py``: quantized rows in the ``quantize_mixed`` layout, then any
float32 rows) sits in the buffer that ``all_to_all_single`` sends or receives. A plan's
layouts are computed once per row width and reused by every exchange that runs it.

``encode`` and ``decode`` fill and read such a buffer. On the compiled path, where no row
travels at full precision, the whole buffer is one kernel call (one base key for all
segments, each row keyed by the global id of the node it is, ``adaqp/quant/draws.py``):
per-segment calls would spend as much time in Python around the kernel as in the kernel
itself on narrow rows (docs/kernels.md).
Elsewhere (the torch path, float32 rows among them) each segment is encoded on its own.
Either way each segment is a valid message of its own, byte for byte in one format.

A forward exchange sends some inner rows to several peers (how many on the README
cluster workload: docs/kernels.md): given the rows' ``send_idx`` as ``sources``, the
compiled path quantizes each distinct row once per width and copies its codes, so those
peers receive the same codes (each still an unbiased estimate of the row).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from adaqp.quant import kernels as quant_kernels
from adaqp.quant.bits import FULL_PRECISION_BITS
from adaqp.quant.draws import RowKeys
from adaqp.quant.segment import decode_segment, encode_segment, segment_bytes


class MessageLayout:
    """The peer segments of one direction of an exchange: ``counts[s]`` rows of ``bits_R``
    each (rank order), ``dim`` values a row; ``segment_bytes[s]`` bytes each. ``sources``:
    where each row's values come from (a forward exchange's ``send_idx``), so that a row sent
    to several peers at one width is quantized once on the compiled path."""

    def __init__(
        self,
        bits_R: torch.Tensor,
        counts: list[int],
        dim: int,
        sources: torch.Tensor | None = None,
    ):
        self.bits_R = bits_R
        self.counts = list(counts)
        self.dim = dim
        self.sources = sources
        self.segment_bytes = [segment_bytes(seg, dim) for seg in torch.split(bits_R, counts)]
        self._compiled: quant_kernels.SegmentLayout | None = None

    def segments(self, rows_RD: torch.Tensor, buf: torch.Tensor):
        """``(rows, widths, bytes)`` of each segment with rows, in rank order."""
        for seg_rows, seg_bits, seg_buf in zip(
            torch.split(rows_RD, self.counts),
            torch.split(self.bits_R, self.counts),
            torch.split(buf, self.segment_bytes),
            strict=True,
        ):
            if seg_rows.shape[0]:
                yield seg_rows, seg_bits, seg_buf

    @property
    def compiled(self) -> quant_kernels.SegmentLayout:
        """The arrays of ``quant_kernels.segment_layout`` (computed on first use)."""
        if self._compiled is None:
            sources = None if self.sources is None else self.sources.cpu().numpy()
            args = (self.bits_R, self.counts, self.dim, sources)
            self._compiled = quant_kernels.segment_layout(*args)
        return self._compiled


def _one_call(has_full: bool, kernels: str | None, device) -> bool:
    return not has_full and quant_kernels.use_compiled(kernels, device)


def encode(
    rows_RD: torch.Tensor,
    layout: MessageLayout,
    out: torch.Tensor,
    has_full: bool,
    kernels: str | None,
    keys: RowKeys | None = None,
    squared_out: torch.Tensor | None = None,
) -> bool:
    """Fills uint8 ``out`` (``sum(layout.segment_bytes)`` bytes) with ``rows_RD``'s segments;
    ``has_full``: whether any row of the plan travels at full precision. ``keys``: one per
    row of ``rows_RD`` (``adaqp/quant/draws.py``), which the draws then come from on either
    path (None: fresh ones, ``adaqp.quant.draws.fresh_keys``). ``squared_out`` (float64
    ``[R]``): where the quantizer takes every row's minimum and maximum in its one call, it
    is filled with the rows' squared ranges from them (the planner's trace, without a pass
    of its own), the difference in float32 and squared in float64, bit for bit what
    ``adaqp.quant.kernels.squared_ranges`` takes from the rows. Returns whether it was."""
    if _one_call(has_full, kernels, rows_RD.device):
        rows = rows_RD if rows_RD.dtype == torch.float32 else rows_RD.to(torch.float32)
        mins, maxs = quant_kernels.quantize_segments(rows, layout.compiled, out, keys)
        if squared_out is None:
            return False
        span = (maxs - mins).astype(np.float64)
        np.multiply(span, span, out=squared_out.numpy())
        return True
    seg_keys = [None] * len(layout.counts) if keys is None else keys.split(layout.counts)
    seg_keys = [k for k, count in zip(seg_keys, layout.counts, strict=True) if count]
    for (seg_rows, seg_bits, seg_out), k in zip(
        layout.segments(rows_RD, out), seg_keys, strict=True
    ):
        encode_segment(seg_rows, seg_bits, seg_out, has_full, kernels, k)
    return False


def decode(
    buf: torch.Tensor,
    layout: MessageLayout,
    out_RD: torch.Tensor,
    has_full: bool,
    kernels: str | None,
    blend: float | None = None,
) -> torch.Tensor:
    """Inverse of :func:`encode` into float32 ``out_RD``; with ``blend``, the rows are
    blended into ``out_RD`` instead (``adaqp.quant.mixed.blend_``). Returns ``out_RD``."""
    if _one_call(has_full, kernels, buf.device):
        return quant_kernels.dequantize_segments(buf, layout.compiled, out_RD, blend)
    for seg_out, seg_bits, seg_buf in layout.segments(out_RD, buf):
        decode_segment(seg_buf, seg_bits, layout.dim, seg_out, has_full, kernels, blend)
    return out_RD


@dataclass(frozen=True)
class BitPlan:
    """Per-row widths of one exchange, in this rank's send and receive order."""

    out_bits: torch.Tensor
    """int8 [R_out]: width of each row this rank sends (peer segments in rank order)."""
    in_bits: torch.Tensor
    """int8 [R_in]: width of each row this rank receives (peer segments in rank order)."""
    _layouts: dict[int, tuple[MessageLayout, MessageLayout]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _histograms: dict[int, dict[int, int]] = field(default_factory=dict, compare=False, repr=False)
    has_full: bool = field(init=False, compare=False)
    """Whether any row travels at full precision (32) in either direction."""
    all_full: bool = field(init=False, compare=False)
    """Whether every row does, both ways: the exchange is then Vanilla's (same bytes)."""

    def __post_init__(self) -> None:
        out_full = self.out_bits == FULL_PRECISION_BITS
        in_full = self.in_bits == FULL_PRECISION_BITS
        # Frozen: set once, here.
        object.__setattr__(self, "has_full", bool(out_full.any()) or bool(in_full.any()))
        object.__setattr__(self, "all_full", bool(out_full.all()) and bool(in_full.all()))

    @classmethod
    def uniform(cls, bits: int, out_rows: int, in_rows: int, device) -> BitPlan:
        return cls(
            torch.full((out_rows,), bits, dtype=torch.int8, device=device),
            torch.full((in_rows,), bits, dtype=torch.int8, device=device),
        )

    def layouts(
        self,
        dim: int,
        out_counts: list[int],
        in_counts: list[int],
        sources: torch.Tensor | None = None,
    ) -> tuple[MessageLayout, MessageLayout]:
        """The send and receive layouts for rows of width ``dim`` (cached: one exchange key
        has one plan, fixed counts and fixed ``sources`` of the rows it sends)."""
        if dim not in self._layouts:
            self._layouts[dim] = (
                MessageLayout(self.out_bits, out_counts, dim, sources),
                MessageLayout(self.in_bits, in_counts, dim),
            )
        return self._layouts[dim]

    def byte_splits(self, dim: int, out_counts: list[int], in_counts: list[int]):
        """Bytes sent to and received from each peer for rows of width ``dim`` (cached)."""
        sent, received = self.layouts(dim, out_counts, in_counts)
        return sent.segment_bytes, received.segment_bytes

    def bits_histogram(self, dim: int) -> dict[int, int]:
        """Values this rank sends, by width (cached)."""
        if dim not in self._histograms:
            widths, counts = torch.unique(self.out_bits, return_counts=True)
            self._histograms[dim] = {
                int(b): int(c) * dim for b, c in zip(widths, counts, strict=True)
            }
        return dict(self._histograms[dim])
