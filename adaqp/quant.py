"""Per-row stochastic integer quantization of messages, with bit packing.

Each row ``x`` of a ``[R, D]`` tensor (one message: one node's embedding or gradient) is
quantized independently to ``b`` bits, ``b`` in :data:`SUPPORTED_BITS`:

* ``m = min(x)``, ``M = max(x)``, ``L = 2**b - 1``, step ``Δ = (M - m) / L``;
* ``t = (x - m) / Δ`` in ``[0, L]``; code ``q = floor(t) + Bernoulli(t - floor(t))``,
  clamped to ``[0, L]`` (float rounding can give ``t`` just above ``L``);
* the receiver reconstructs ``x̂ = min(m + q·Δ, M)``.

``E[x̂] = x`` (unbiased, up to float32 rounding) and ``Var[x̂_j] = Δ²·f_j(1 - f_j) <= Δ²/4``
with ``f_j = t_j - floor(t_j)``, so a row's total variance is at most ``D·Δ²/4``.

Row metadata is ``(m, M)`` in exact float32 (8 bytes a row, the same as ``(m, Δ)``; 16-bit
metadata would bias the reconstruction). ``Δ`` is recomputed on the receiver by the same
expression as on the sender (:func:`row_step`), and knowing ``M`` lets the receiver clamp
reconstructions into ``[m, M]`` exactly (``m + L·Δ`` can round an ulp above ``M``).
Constant rows (``M == m``) send codes of 0 and reconstruct ``m`` exactly.

Codes are packed along the feature axis, ``8 // b`` codes per byte, the first code of a byte in
its least significant bits. Each row is padded to whole bytes, so a packed row has
:func:`packed_row_bytes` bytes and rows stay independently addressable.

All functions are pure tensor functions: they run unchanged on any device, allocate on the
input's device, and do not communicate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "SUPPORTED_BITS",
    "QuantizedRows",
    "dequantize",
    "dequantize_mixed",
    "message_bytes",
    "mixed_buffer_bytes",
    "pack",
    "packed_row_bytes",
    "quantize",
    "quantize_mixed",
    "row_step",
    "unpack",
]

SUPPORTED_BITS: tuple[int, ...] = (1, 2, 4, 8)
"""Bit widths a row can be quantized to; each divides 8, so codes never straddle bytes."""

_METADATA_BYTES_PER_ROW = 8  # float32 minimum + float32 maximum


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bit width {bits!r}; expected one of {SUPPORTED_BITS}")


def packed_row_bytes(dim: int, bits: int) -> int:
    """Bytes of one packed row of ``dim`` codes at ``bits`` bits: ``ceil(dim * bits / 8)``."""
    _check_bits(bits)
    if dim < 0:
        raise ValueError(f"dim must be non-negative, got {dim}")
    return (dim * bits + 7) // 8


def message_bytes(num_rows: int, dim: int, bits: int) -> int:
    """Exact wire size of ``num_rows`` rows at one width: packed payload + 8 metadata bytes/row."""
    if num_rows < 0:
        raise ValueError(f"num_rows must be non-negative, got {num_rows}")
    return num_rows * (packed_row_bytes(dim, bits) + _METADATA_BYTES_PER_ROW)


def row_step(minimum: Tensor, maximum: Tensor, levels: int | Tensor) -> Tensor:
    """Quantization step ``(maximum - minimum) / levels`` per row.

    Sender and receiver both call this, so they derive bit-identical steps from the same
    float32 metadata.

    Args:
        minimum: float32 ``[R]`` row minima.
        maximum: float32 ``[R]`` row maxima.
        levels: ``2**bits - 1``, an int or a float32 ``[R]`` tensor (mixed widths).

    Returns:
        float32 ``[R]`` steps; 0 for constant rows.
    """
    if not isinstance(levels, Tensor):
        # Divide by a full tensor, never a scalar: CUDA turns division by a scalar into
        # multiplication by its reciprocal, which can differ by an ulp from the tensor path.
        levels = torch.full_like(minimum, float(levels))
    return (maximum - minimum) / levels


# --------------------------------------------------------------------------- packing


def pack(codes_RD: Tensor, bits: int) -> Tensor:
    """Pack integer codes along the feature axis, ``8 // bits`` codes per byte.

    Code ``j`` of a row lands in byte ``j // (8 // bits)`` at bit offset
    ``(j % (8 // bits)) * bits``; the tail of a row's last byte is zero padding.

    Args:
        codes_RD: uint8 ``[R, D]`` codes, each ``< 2**bits`` (not checked: larger codes would
            spill into their neighbours' bits).
        bits: bit width, in :data:`SUPPORTED_BITS`.

    Returns:
        uint8 ``[R, ceil(D * bits / 8)]``.
    """
    _check_bits(bits)
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


def unpack(packed_RB: Tensor, bits: int, dim: int) -> Tensor:
    """Inverse of :func:`pack`.

    Args:
        packed_RB: uint8 ``[R, ceil(dim * bits / 8)]``.
        bits: bit width, in :data:`SUPPORTED_BITS`.
        dim: number of codes per row ``D``.

    Returns:
        uint8 ``[R, D]`` codes (a view into a padded buffer when ``D`` is not a whole number of
        bytes; it is not necessarily contiguous).
    """
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


# --------------------------------------------------------------------------- quantization


@dataclass(frozen=True)
class QuantizedRows:
    """Rows quantized at one bit width.

    Attributes:
        packed: uint8 ``[R, packed_row_bytes(dim, bits)]`` packed codes.
        minimum: float32 ``[R]`` row minima ``m``.
        maximum: float32 ``[R]`` row maxima ``M``.
        bits: bit width, in :data:`SUPPORTED_BITS`.
        dim: features per row ``D``.
    """

    packed: Tensor
    minimum: Tensor
    maximum: Tensor
    bits: int
    dim: int

    @property
    def num_rows(self) -> int:
        """Number of rows ``R``."""
        return self.packed.shape[0]

    @property
    def step(self) -> Tensor:
        """float32 ``[R]`` quantization steps ``(M - m) / (2**bits - 1)``."""
        return row_step(self.minimum, self.maximum, (1 << self.bits) - 1)

    @property
    def nbytes(self) -> int:
        """Exact wire size: packed payload + float32 ``(m, M)`` per row."""
        return message_bytes(self.num_rows, self.dim, self.bits)


def _as_float32_rows(x_RD: Tensor) -> Tensor:
    if x_RD.dim() != 2:
        raise ValueError(f"expected a 2-D [rows, dim] tensor, got shape {tuple(x_RD.shape)}")
    if not x_RD.is_floating_point():
        raise ValueError(f"expected a floating-point tensor, got {x_RD.dtype}")
    return x_RD.to(torch.float32)


def _row_range(x_RD: Tensor) -> tuple[Tensor, Tensor]:
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
    """Stochastically rounded codes ``q`` in ``[0, levels]`` as uint8 ``[R, D]``.

    ``levels`` is an int or a float32 ``[R]`` tensor (per-row ``2**bits - 1``).
    """
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


def quantize(x_RD: Tensor, bits: int, generator: torch.Generator | None = None) -> QuantizedRows:
    """Stochastically quantize each row of ``x_RD`` to ``bits`` bits.

    Args:
        x_RD: ``[R, D]`` floating tensor (computed in float32).
        bits: bit width, in :data:`SUPPORTED_BITS`.
        generator: random generator on ``x_RD``'s device; same seed gives the same result.

    Returns:
        The packed codes and float32 ``(m, M)`` metadata.

    Raises:
        ValueError: unsupported ``bits``, a non-2-D or non-float input, NaN/Inf in the input,
            or a row range that overflows float32.
    """
    _check_bits(bits)
    x_RD = _as_float32_rows(x_RD)
    minimum, maximum = _row_range(x_RD)
    levels = (1 << bits) - 1
    codes = _stochastic_codes(x_RD, minimum, row_step(minimum, maximum, levels), levels, generator)
    return QuantizedRows(pack(codes, bits), minimum, maximum, bits, x_RD.shape[1])


def _reconstruct_(out_RD: Tensor, minimum: Tensor, maximum: Tensor, step: Tensor) -> Tensor:
    """In place: codes held in float32 ``out_RD`` become ``min(m + q·Δ, M)``."""
    out_RD.mul_(step[:, None]).add_(minimum[:, None])
    # m + L·Δ can round one ulp above M; clamping keeps every value inside [m, M] exactly.
    return torch.minimum(out_RD, maximum[:, None], out=out_RD)


def _output_buffer(out: Tensor | None, rows: int, dim: int, device: torch.device) -> Tensor:
    if out is None:
        return torch.empty(rows, dim, dtype=torch.float32, device=device)
    if tuple(out.shape) != (rows, dim) or out.dtype != torch.float32:
        raise ValueError(
            f"out must be float32 of shape ({rows}, {dim}), got {tuple(out.shape)} {out.dtype}"
        )
    return out


def dequantize(q: QuantizedRows, out: Tensor | None = None) -> Tensor:
    """Reconstruct ``x̂ = min(m + q·Δ, M)`` from :func:`quantize` output.

    Args:
        q: quantized rows.
        out: optional float32 ``[R, D]`` tensor to write into (e.g. a row slice of a halo
            buffer; it may be a strided view).

    Returns:
        float32 ``[R, D]``: ``out`` when given.
    """
    out = _output_buffer(out, q.num_rows, q.dim, q.packed.device)
    out.copy_(unpack(q.packed, q.bits, q.dim))
    return _reconstruct_(out, q.minimum, q.maximum, q.step)


# --------------------------------------------------------------------------- mixed widths
#
# Flat buffer layout for R rows with per-row widths bits_R (all offsets in bytes, no padding,
# no header):
#   [ float32 minimum, R values, original row order ]   4R bytes
#   [ float32 maximum, R values, original row order ]   4R bytes
#   for b in SUPPORTED_BITS ascending:
#   [ packed codes of the rows with bits_R == b, in original relative order ]
#                                                        n_b * packed_row_bytes(D, b) bytes
# The buffer may start at any byte offset (a slice of an all_to_all buffer), so float32 data is
# moved through byte copies, never through a float view of the buffer itself.


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


def mixed_buffer_bytes(bits_R: Tensor, dim: int) -> int:
    """Exact byte size of the :func:`quantize_mixed` buffer for widths ``bits_R`` and ``dim``.

    Args:
        bits_R: integer ``[R]`` per-row widths, each in :data:`SUPPORTED_BITS`.
        dim: features per row ``D``.
    """
    bits_R = _mixed_widths(bits_R)
    total = _METADATA_BYTES_PER_ROW * bits_R.shape[0]
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


def quantize_mixed(
    x_RD: Tensor,
    bits_R: Tensor,
    generator: torch.Generator | None = None,
    out: Tensor | None = None,
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
        generator: random generator on ``x_RD``'s device.
        out: optional 1-D uint8 tensor of ``mixed_buffer_bytes(bits_R, D)`` bytes to fill (e.g.
            a slice of an all_to_all send buffer).

    Returns:
        uint8 ``[mixed_buffer_bytes(bits_R, D)]``: ``out`` when given.

    Raises:
        ValueError: bad shapes or widths, NaN/Inf input, or a range overflowing float32.
    """
    x_RD = _as_float32_rows(x_RD)
    rows, dim = x_RD.shape
    bits_R = _mixed_widths(bits_R.to(x_RD.device))
    if bits_R.shape[0] != rows:
        raise ValueError(f"bits_R has {bits_R.shape[0]} entries for {rows} rows")
    size = mixed_buffer_bytes(bits_R, dim)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=x_RD.device)
    elif out.dim() != 1 or out.dtype != torch.uint8 or out.shape[0] != size:
        raise ValueError(f"out must be uint8 [{size}], got {tuple(out.shape)} {out.dtype}")

    minimum, maximum = _row_range(x_RD)
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
        packed = pack(group, bits)
        out[offset : offset + packed.numel()] = packed.view(-1)
        offset += packed.numel()
    return out


def dequantize_mixed(
    buf: Tensor,
    bits_R: Tensor,
    dim: int,
    out: Tensor | None = None,
) -> Tensor:
    """Reconstruct rows from a :func:`quantize_mixed` buffer, in their original order.

    Args:
        buf: uint8 ``[mixed_buffer_bytes(bits_R, dim)]``, at any byte offset of its storage.
        bits_R: integer ``[R]`` per-row widths the sender used.
        dim: features per row ``D``.
        out: optional float32 ``[R, D]`` tensor to write into (e.g. a halo buffer slice).

    Returns:
        float32 ``[R, D]``: ``out`` when given.
    """
    bits_R = _mixed_widths(bits_R.to(buf.device))
    rows = bits_R.shape[0]
    size = mixed_buffer_bytes(bits_R, dim)
    if buf.dim() != 1 or buf.dtype != torch.uint8 or buf.shape[0] != size:
        raise ValueError(
            f"buf must be uint8 [{size}] for these widths, got {tuple(buf.shape)} {buf.dtype}"
        )
    out = _output_buffer(out, rows, dim, buf.device)

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
        group = unpack(packed, bits, dim)
        if index.numel() == rows:  # single-width message: no scatter needed
            out.copy_(group)
        else:
            out.index_copy_(0, index, group.to(torch.float32))
        offset += nbytes
    levels = _levels(bits_R)
    return _reconstruct_(out, minimum, maximum, row_step(minimum, maximum, levels))
