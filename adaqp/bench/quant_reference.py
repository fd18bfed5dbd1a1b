"""The quantizer the torch path replaced, frozen, for ``python -m adaqp.bench quant``.

A copy of the quantize_mixed / dequantize_mixed path of ``adaqp/quant.py`` at commit ef412a7,
code unchanged (one float draw per value from ``torch.rand``, a compare against the
fractional part, strided-slice packing, shift unpacking, whole-message passes). It repeats
what the quant package does today on purpose: it is the baseline the benchmark times, and
it must not change when the package does. Same wire format as the package.
"""

from __future__ import annotations

import torch
from torch import Tensor

from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.pack import packed_row_bytes
from adaqp.quant.rows import row_step

METADATA_BYTES_PER_ROW = 8  # float32 minimum + float32 maximum


# --------------------------------------------------------------------------- reference
# Frozen copy of the quantize_mixed / dequantize_mixed path of adaqp/quant.py at ef412a7, code
# unchanged (docstrings shortened; pack, unpack, mixed_buffer_bytes and the two entry points
# renamed). row_step and packed_row_bytes, unchanged since, are shared.


def check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bit width {bits!r}; expected one of {SUPPORTED_BITS}")


def _pack(codes_RD: Tensor, bits: int) -> Tensor:
    """Pack integer codes along the feature axis, ``8 // bits`` codes per byte."""
    check_bits(bits)
    if codes_RD.dim() != 2 or codes_RD.dtype != torch.uint8:
        raise ValueError(
            f"pack expects a 2-D uint8 tensor, got {tuple(codes_RD.shape)} {codes_RD.dtype}"
        )
    if bits == 8:
        return codes_RD.contiguous()
    per_byte = 8 // bits
    # Code slot j of every byte is the strided column slice j::per_byte; slot 0 always has the
    # full byte count, later slots may be one short (the padded tail), so OR them into a prefix.
    # The loop runs over at most 8 slots, never over rows.
    packed = codes_RD[:, 0::per_byte].clone()
    for slot in range(1, per_byte):
        column = codes_RD[:, slot::per_byte]
        packed[:, : column.shape[1]] |= column << (slot * bits)
    return packed


def _unpack(packed_RB: Tensor, bits: int, dim: int) -> Tensor:
    """Inverse of :func:`_pack`."""
    row_bytes = packed_row_bytes(dim, bits)
    if packed_RB.dim() != 2 or packed_RB.dtype != torch.uint8 or packed_RB.shape[1] != row_bytes:
        raise ValueError(
            f"unpack expects uint8 [R, {row_bytes}] for dim={dim}, bits={bits}; "
            f"got {tuple(packed_RB.shape)} {packed_RB.dtype}"
        )
    if bits == 8:
        return packed_RB
    per_byte = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed_RB.device)
    # One broadcast pass: [R, B, 1] >> [per_byte] -> [R, B, per_byte], slot order = code order.
    codes = (packed_RB.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(packed_RB.shape[0], row_bytes * per_byte)[:, :dim]


def as_float32_rows(x_RD: Tensor) -> Tensor:
    if x_RD.dim() != 2:
        raise ValueError(f"expected a 2-D [rows, dim] tensor, got shape {tuple(x_RD.shape)}")
    if not x_RD.is_floating_point():
        raise ValueError(f"expected a floating-point tensor, got {x_RD.dtype}")
    return x_RD.to(torch.float32)


def row_range(x_RD: Tensor) -> tuple[Tensor, Tensor]:
    """Row minima and maxima of float32 ``x_RD``; raises on NaN/Inf or an overflowing range."""
    rows, dim = x_RD.shape
    if dim == 0:
        zeros = torch.zeros(rows, dtype=torch.float32, device=x_RD.device)
        return zeros, zeros.clone()
    # Separate amin/amax: torch.aminmax is several times slower on CPU for this reduction.
    minimum, maximum = x_RD.amin(dim=1), x_RD.amax(dim=1)
    # amin/amax propagate NaN and a row holding ±Inf has an infinite extreme, so one [R]-sized
    # check on the range covers non-finite input without another full pass over x.
    if not bool(torch.isfinite(maximum - minimum).all()):
        if not (bool(torch.isfinite(minimum).all()) and bool(torch.isfinite(maximum).all())):
            raise ValueError("cannot quantize: input contains NaN or Inf (checked in float32)")
        raise ValueError("cannot quantize: a row's range max - min overflows float32")
    return minimum, maximum


def _stochastic_codes(
    x_RD: Tensor,
    minimum: Tensor,
    step: Tensor,
    levels: int | Tensor,
    generator: torch.Generator | None,
) -> Tensor:
    """Stochastically rounded codes ``q`` in ``[0, levels]`` as uint8 ``[R, D]``."""
    # Constant rows (and steps that underflow to 0) divide by 1 instead: x - m is 0 there (or
    # subnormal), so t rounds to code 0 and the receiver reconstructs m.
    safe_step = torch.where(step > 0, step, torch.ones_like(step))
    t = (x_RD - minimum[:, None]).div_(safe_step[:, None])  # >= 0: x >= m is exact in floats
    # t can exceed L by an ulp after rounding, and a code of L + 1 would spill into the
    # neighbouring packed code (or wrap to 0 at 8 bits). Clamping t to L before rounding is the
    # same as clamping q: it maps t in (L, L + 1) to q = L, and t = L never rounds up.
    if isinstance(levels, Tensor):
        torch.minimum(t, levels[:, None], out=t)
    else:
        t.clamp_(max=levels)
    codes = t.to(torch.uint8)  # truncation == floor, as t >= 0
    frac = t.frac_()  # exact: t - floor(t)
    # floor(t) + [u < frac] with u ~ U[0, 1) is floor(t) + Bernoulli(frac): unbiased up to the
    # 2**-24 resolution of u, where rounding floor(t + u) would add a bias of half an ulp of t.
    noise = torch.rand(x_RD.shape, generator=generator, dtype=torch.float32, device=x_RD.device)
    return codes.add_(noise < frac)


def _reconstruct_(out_RD: Tensor, minimum: Tensor, maximum: Tensor, step: Tensor) -> Tensor:
    """In place: codes held in float32 ``out_RD`` become ``min(m + q·Δ, M)``."""
    out_RD.mul_(step[:, None]).add_(minimum[:, None])
    # m + L·Δ can round one ulp above M; clamping keeps every value inside [m, M] exactly.
    return torch.minimum(out_RD, maximum[:, None], out=out_RD)


def output_buffer(out: Tensor | None, rows: int, dim: int, device: torch.device) -> Tensor:
    if out is None:
        return torch.empty(rows, dim, dtype=torch.float32, device=device)
    if tuple(out.shape) != (rows, dim) or out.dtype != torch.float32:
        raise ValueError(
            f"out must be float32 of shape ({rows}, {dim}), got {tuple(out.shape)} {out.dtype}"
        )
    return out


def _levels(bits_R: Tensor) -> Tensor:
    """float32 ``[R]`` per-row ``2**bits - 1`` (integer power, so exact)."""
    return (2 ** bits_R.to(torch.int32) - 1).to(torch.float32)


def _mixed_widths(bits_R: Tensor) -> Tensor:
    if bits_R.dim() != 1 or bits_R.is_floating_point() or bits_R.is_complex():
        raise ValueError(f"bits_R must be a 1-D integer tensor, got {bits_R.dtype} {bits_R.shape}")
    supported = torch.tensor(SUPPORTED_BITS, dtype=bits_R.dtype, device=bits_R.device)
    if not bool(torch.isin(bits_R, supported).all()):
        raise ValueError(f"bits_R holds unsupported widths; expected values in {SUPPORTED_BITS}")
    return bits_R


def _mixed_buffer_bytes(bits_R: Tensor, dim: int) -> int:
    """Exact byte size of the :func:`reference_quantize_mixed` buffer."""
    bits_R = _mixed_widths(bits_R)
    total = METADATA_BYTES_PER_ROW * bits_R.shape[0]
    counts = torch.stack([(bits_R == b).sum() for b in SUPPORTED_BITS]).tolist()
    for bits, count in zip(SUPPORTED_BITS, counts, strict=True):
        total += count * packed_row_bytes(dim, bits)
    return total


def _float32_to_bytes(values: Tensor) -> Tensor:
    return values.contiguous().view(torch.uint8)


def _bytes_to_float32(buf: Tensor) -> Tensor:
    # clone() gives fresh, aligned storage; viewing the buffer slice itself would fail at
    # offsets that are not multiples of 4.
    return buf.clone().view(torch.float32)


def reference_quantize_mixed(
    x_RD: Tensor,
    bits_R: Tensor,
    generator: torch.Generator | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """Quantize rows at per-row widths into one flat uint8 buffer (one message to one peer)."""
    x_RD = as_float32_rows(x_RD)
    rows, dim = x_RD.shape
    bits_R = _mixed_widths(bits_R.to(x_RD.device))
    if bits_R.shape[0] != rows:
        raise ValueError(f"bits_R has {bits_R.shape[0]} entries for {rows} rows")
    size = _mixed_buffer_bytes(bits_R, dim)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=x_RD.device)
    elif out.dim() != 1 or out.dtype != torch.uint8 or out.shape[0] != size:
        raise ValueError(f"out must be uint8 [{size}], got {tuple(out.shape)} {out.dtype}")

    minimum, maximum = row_range(x_RD)
    levels = _levels(bits_R)
    step = row_step(minimum, maximum, levels)
    # One rounding pass over all rows with per-row L, so the random stream does not depend on
    # how rows split into widths.
    codes = _stochastic_codes(x_RD, minimum, step, levels, generator)

    out[: 4 * rows] = _float32_to_bytes(minimum)
    out[4 * rows : 8 * rows] = _float32_to_bytes(maximum)
    offset = 8 * rows
    for bits in SUPPORTED_BITS:  # 4 widths, not rows
        index = (bits_R == bits).nonzero().squeeze(1)
        if index.numel() == 0:
            continue
        # A single-width message (the common case) skips the row gather.
        group = codes if index.numel() == rows else codes.index_select(0, index)
        packed = _pack(group, bits)
        out[offset : offset + packed.numel()] = packed.view(-1)
        offset += packed.numel()
    return out


def reference_dequantize_mixed(
    buf: Tensor,
    bits_R: Tensor,
    dim: int,
    out: Tensor | None = None,
) -> Tensor:
    """Reconstruct rows from a quantize_mixed buffer, in their original order."""
    bits_R = _mixed_widths(bits_R.to(buf.device))
    rows = bits_R.shape[0]
    size = _mixed_buffer_bytes(bits_R, dim)
    if buf.dim() != 1 or buf.dtype != torch.uint8 or buf.shape[0] != size:
        raise ValueError(
            f"buf must be uint8 [{size}] for these widths, got {tuple(buf.shape)} {buf.dtype}"
        )
    out = output_buffer(out, rows, dim, buf.device)

    minimum = _bytes_to_float32(buf[: 4 * rows])
    maximum = _bytes_to_float32(buf[4 * rows : 8 * rows])
    offset = 8 * rows
    # Gather every row's codes into out (as floats), then reconstruct all rows in one pass.
    for bits in SUPPORTED_BITS:
        index = (bits_R == bits).nonzero().squeeze(1)
        if index.numel() == 0:
            continue
        width = packed_row_bytes(dim, bits)
        nbytes = index.numel() * width
        packed = buf[offset : offset + nbytes].view(index.numel(), width)
        group = _unpack(packed, bits, dim)
        if index.numel() == rows:  # single-width message: no scatter needed
            out.copy_(group)
        else:
            out.index_copy_(0, index, group.to(torch.float32))
        offset += nbytes
    levels = _levels(bits_R)
    return _reconstruct_(out, minimum, maximum, row_step(minimum, maximum, levels))
