"""Mixed-width messages: rows at per-row bit widths in one flat uint8 buffer for one peer.

Flat buffer layout for R rows with per-row widths bits_R (all offsets in bytes, no padding,
no header)::

    [ float32 minimum, R values, original row order ]   4R bytes
    [ float32 maximum, R values, original row order ]   4R bytes
    for b in SUPPORTED_BITS ascending:
    [ packed codes of the rows with bits_R == b, in original relative order ]
                                                         n_b * packed_row_bytes(D, b) bytes

The buffer may start at any byte offset (a slice of an all_to_all buffer), so float32 data is
moved through byte copies, never through a float view of the buffer itself.

Each row is quantized as :mod:`adaqp.quant.rows` quantizes a row (same rounding, same
unbiasedness, same metadata, same draws) and packed as :mod:`adaqp.quant.pack` packs one. This
module is the torch path; on CPU tensors the entry points hand over to the compiled kernels,
which write the same layout (:mod:`adaqp.quant.kernels`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.draws import RowKeys, row_keys
from adaqp.quant.kernels import dequantize_mixed as compiled_dequantize_mixed
from adaqp.quant.kernels import quantize_mixed as compiled_quantize_mixed
from adaqp.quant.kernels import use_compiled
from adaqp.quant.pack import METADATA_BYTES_PER_ROW, pack_words_, packed_row_bytes
from adaqp.quant.rows import (
    as_float32_rows,
    code_blocks,
    decode_,
    output_buffer,
    row_range,
)


def _levels(bits_R: Tensor) -> Tensor:
    """float32 ``[R]`` per-row ``2**bits - 1`` (integer power, so exact)."""
    return (2 ** bits_R.to(torch.int32) - 1).to(torch.float32)


def _width_counts(bits_R: Tensor) -> list[int]:
    """Rows at each width of :data:`SUPPORTED_BITS`, in that order (one host sync).

    Raises:
        ValueError: ``bits_R`` is not a 1-D integer tensor, or holds an unsupported width.
    """
    if bits_R.dim() != 1 or bits_R.is_floating_point() or bits_R.is_complex():
        raise ValueError(f"bits_R must be a 1-D integer tensor, got {bits_R.dtype} {bits_R.shape}")
    counts = torch.stack([(bits_R == bits).sum() for bits in SUPPORTED_BITS]).tolist()
    if sum(counts) != bits_R.shape[0]:  # some row has a width outside SUPPORTED_BITS
        raise ValueError(f"bits_R holds unsupported widths; expected values in {SUPPORTED_BITS}")
    return counts


def _buffer_bytes(counts: list[int], dim: int) -> int:
    """Size of a mixed buffer holding ``counts[i]`` rows at width ``SUPPORTED_BITS[i]``."""
    total = METADATA_BYTES_PER_ROW * sum(counts)
    for bits, count in zip(SUPPORTED_BITS, counts, strict=True):
        total += count * packed_row_bytes(dim, bits)
    return total


def mixed_buffer_bytes(bits_R: Tensor, dim: int) -> int:
    """Exact byte size of the :func:`quantize_mixed` buffer for widths ``bits_R`` and ``dim``.

    Args:
        bits_R: integer ``[R]`` per-row widths, each in :data:`SUPPORTED_BITS`.
        dim: features per row ``D``.
    """
    return _buffer_bytes(_width_counts(bits_R), dim)


def _float32_to_bytes(values: Tensor) -> Tensor:
    return values.contiguous().view(torch.uint8)


def _bytes_to_float32(buf: Tensor) -> Tensor:
    # clone() gives fresh, aligned storage; viewing the buffer slice itself would fail at
    # offsets that are not multiples of 4.
    return buf.clone().view(torch.float32)


def quantize_mixed(
    x_RD: Tensor,
    bits_R: Tensor,
    *,
    out: Tensor | None = None,
    kernels: str | None = None,
    keys: RowKeys | None = None,
) -> Tensor:
    """Quantize rows at per-row widths into one flat uint8 buffer (one message to one peer).

    Layout: float32 minima of all R rows, float32 maxima of all R rows (both in original row
    order), then for each width in :data:`SUPPORTED_BITS` ascending the packed codes of the rows
    with that width, in their original relative order. There is no header: sender and receiver
    both know ``bits_R`` and ``D``, so both get the size from :func:`mixed_buffer_bytes` and the
    offsets from the layout.

    Args:
        x_RD: ``[R, D]`` floating tensor (computed in float32).
        bits_R: integer ``[R]`` per-row widths, each in :data:`SUPPORTED_BITS`.
        out: optional 1-D uint8 tensor of ``mixed_buffer_bytes(bits_R, D)`` bytes to fill (e.g.
            a slice of an all_to_all send buffer).
        kernels: ``auto``, ``torch`` or ``compiled`` (:mod:`adaqp.quant.kernels`); None: the
            process default.
        keys: the rows' keys (:mod:`adaqp.quant.draws`): the same keys give the same bytes,
            on either path. None: :func:`~adaqp.quant.draws.fresh_keys`.

    Returns:
        uint8 ``[mixed_buffer_bytes(bits_R, D)]``: ``out`` when given.

    Raises:
        ValueError: bad shapes or widths, NaN/Inf input, or a range overflowing float32.
    """
    x_RD = as_float32_rows(x_RD)
    if use_compiled(kernels, x_RD.device):
        return compiled_quantize_mixed(x_RD, bits_R, out, keys)
    rows, dim = x_RD.shape
    keys = row_keys(keys, rows)
    bits_R = bits_R.to(x_RD.device)
    counts = _width_counts(bits_R)
    if bits_R.shape[0] != rows:
        raise ValueError(f"bits_R has {bits_R.shape[0]} entries for {rows} rows")
    size = _buffer_bytes(counts, dim)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=x_RD.device)
    elif out.dim() != 1 or out.dtype != torch.uint8 or out.shape[0] != size:
        raise ValueError(f"out must be uint8 [{size}], got {tuple(out.shape)} {out.dtype}")

    minimum, maximum = row_range(x_RD)
    out[: 4 * rows] = _float32_to_bytes(minimum)
    out[4 * rows : 8 * rows] = _float32_to_bytes(maximum)
    sections, offset = {}, 8 * rows
    for bits, count in zip(SUPPORTED_BITS, counts, strict=True):
        width = packed_row_bytes(dim, bits)
        if count:
            sections[bits] = out[offset : offset + count * width].view(count, width)
        offset += count * width
    # A single-width message (the common case) packs each block straight into its rows.
    single = next(iter(sections)) if len(sections) == 1 else None
    filled = dict.fromkeys(sections, 0)
    # Blocks run over all rows in order with per-row L; a row's draws are its keys', whatever
    # width its neighbours have.
    for start, codes in code_blocks(x_RD, minimum, maximum, _levels(bits_R), keys):
        stop = start + codes.shape[0]
        if single is not None:
            pack_words_(codes, single, sections[single][start:stop])
            continue
        for bits in sections:  # at most 4 widths, not rows
            index = (bits_R[start:stop] == bits).nonzero().squeeze(1)
            num = index.numel()
            if num:
                group = codes if num == stop - start else codes.index_select(0, index)
                pack_words_(group, bits, sections[bits][filled[bits] : filled[bits] + num])
                filled[bits] += num
    return out


def dequantize_mixed(
    buf: Tensor,
    bits_R: Tensor,
    dim: int,
    out: Tensor | None = None,
    kernels: str | None = None,
    blend: float | None = None,
) -> Tensor:
    """Reconstruct rows from a :func:`quantize_mixed` buffer, in their original order.

    Args:
        buf: uint8 ``[mixed_buffer_bytes(bits_R, dim)]``, at any byte offset of its storage.
        bits_R: integer ``[R]`` per-row widths the sender used.
        dim: features per row ``D``.
        out: optional float32 ``[R, D]`` tensor to write into (e.g. a halo buffer slice).
        kernels: as for :func:`quantize_mixed`; both paths decode the same bytes to the same
            floats.
        blend: a weight ``w``: ``out`` (required) keeps its values and becomes
            ``blend_(out, rows, w)``; the compiled path does it in the decoding pass.

    Returns:
        float32 ``[R, D]``: ``out`` when given.
    """
    if blend is not None:
        if out is None:
            raise ValueError("blend needs out: the tensor the rows are blended into")
        if use_compiled(kernels, buf.device):
            return compiled_dequantize_mixed(buf, bits_R, dim, out, float(blend))
        return blend_(out, dequantize_mixed(buf, bits_R, dim, kernels=kernels), blend)
    if use_compiled(kernels, buf.device):
        return compiled_dequantize_mixed(buf, bits_R, dim, out)
    bits_R = bits_R.to(buf.device)
    counts = _width_counts(bits_R)
    rows = bits_R.shape[0]
    size = _buffer_bytes(counts, dim)
    if buf.dim() != 1 or buf.dtype != torch.uint8 or buf.shape[0] != size:
        raise ValueError(
            f"buf must be uint8 [{size}] for these widths, got {tuple(buf.shape)} {buf.dtype}"
        )
    out = output_buffer(out, rows, dim, buf.device)

    minimum = _bytes_to_float32(buf[: 4 * rows])
    maximum = _bytes_to_float32(buf[4 * rows : 8 * rows])
    offset = 8 * rows
    for bits, count in zip(SUPPORTED_BITS, counts, strict=True):
        if count == 0:
            continue
        width = packed_row_bytes(dim, bits)
        packed = buf[offset : offset + count * width].view(count, width)
        offset += count * width
        if count == rows:  # single-width message: decode straight into out
            decode_(out, packed, bits, minimum, maximum)
            continue
        index = (bits_R == bits).nonzero().squeeze(1)
        group = torch.empty(count, dim, dtype=torch.float32, device=buf.device)
        decode_(group, packed, bits, minimum[index], maximum[index])
        out.index_copy_(0, index, group)
    return out


def blend_(average: Tensor, rows: Tensor, weight: float) -> Tensor:
    """In place: ``average + weight·(rows - average)``, each operation rounded to float32 in
    turn (no fused multiply-add), as the compiled decoder blends (a moving average of received
    rows with ``weight = 1 - smoothing``). Returns ``average``."""
    step = rows.to(average.dtype) - average
    step.mul_(float(torch.tensor(weight, dtype=torch.float32)))
    return average.add_(step)
