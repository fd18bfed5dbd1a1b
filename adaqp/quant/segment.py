"""One peer's segment of a planned exchange: its quantized rows, then its float32 rows.

A segment holds the rows sent to one peer, each at its planned width: the rows at a quantized
width in the :func:`~adaqp.quant.mixed.quantize_mixed` layout, followed by the plain float32
bytes of the rows planned at full precision (:data:`~adaqp.quant.bits.FULL_PRECISION_BITS`), both
in row order. Sender and receiver know the widths, so no header travels. The quantizer's path
(``kernels``: compiled or torch, :mod:`adaqp.quant.kernels`) is the caller's choice.
"""

from __future__ import annotations

import torch
from torch import Tensor

from adaqp.quant.bits import FULL_PRECISION_BITS
from adaqp.quant.draws import RowKeys
from adaqp.quant.mixed import blend_, dequantize_mixed, mixed_buffer_bytes, quantize_mixed


def segment_bytes(bits_R: Tensor, dim: int) -> int:
    """Bytes of one peer's segment of rows at widths ``bits_R`` (32: float32)."""
    full = bits_R == FULL_PRECISION_BITS
    num_full = int(full.sum())
    return mixed_buffer_bytes(bits_R[~full], dim) + 4 * dim * num_full


def encode_segment(
    rows_RD: Tensor,
    bits_R: Tensor,
    out: Tensor,
    has_full: bool,
    kernels: str | None,
    keys: RowKeys | None = None,
) -> None:
    """Fills uint8 ``out`` (``segment_bytes`` long) with the segment of ``rows_RD``;
    ``has_full``: whether any row of the exchange travels at full precision; ``keys``: the
    rows' keys, which the draws come from (:mod:`adaqp.quant.draws`; None: fresh ones)."""
    full = bits_R == FULL_PRECISION_BITS if has_full else None
    if full is None or not full.any():
        quantize_mixed(rows_RD, bits_R, out=out, kernels=kernels, keys=keys)
    elif full.all():  # a segment of float32 rows is their bytes: one copy
        out.copy_(rows_RD.to(torch.float32).contiguous().view(torch.uint8).reshape(-1))
    else:
        quantized = mixed_buffer_bytes(bits_R[~full], rows_RD.shape[1])
        keys = None if keys is None else keys.take((~full).cpu().numpy())
        quantized_rows = (rows_RD[~full], bits_R[~full])
        quantize_mixed(*quantized_rows, out=out[:quantized], kernels=kernels, keys=keys)
        out[quantized:].copy_(rows_RD[full].contiguous().view(torch.uint8).reshape(-1))


def decode_segment(
    buf: Tensor,
    bits_R: Tensor,
    dim: int,
    out_RD: Tensor,
    has_full: bool,
    kernels: str | None,
    blend: float | None = None,
) -> None:
    """Inverse of :func:`encode_segment` into ``out_RD``; with ``blend``, the rows are
    blended into ``out_RD`` instead (:func:`~adaqp.quant.mixed.blend_`)."""
    full = bits_R == FULL_PRECISION_BITS if has_full else None
    if full is None or not full.any():
        dequantize_mixed(buf, bits_R, dim, out=out_RD, kernels=kernels, blend=blend)
        return
    if blend is not None:  # float32 rows among them: decoded apart, then blended
        rows = torch.empty_like(out_RD)
        decode_segment(buf, bits_R, dim, rows, has_full, kernels)
        blend_(out_RD, rows, blend)
        return
    quantized = mixed_buffer_bytes(bits_R[~full], dim)
    exact = torch.empty((int(full.sum()), dim), dtype=torch.float32, device=buf.device)
    exact.view(torch.uint8).reshape(-1).copy_(buf[quantized:])  # the slice may be unaligned
    if quantized == 0:
        out_RD.copy_(exact)
    else:
        out_RD[~full] = dequantize_mixed(buf[:quantized], bits_R[~full], dim, kernels=kernels)
        out_RD[full] = exact.to(out_RD.dtype)
