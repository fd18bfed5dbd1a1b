"""Per-row stochastic integer quantization of messages, with bit packing.

Each row ``x`` of a ``[R, D]`` tensor (one message: one node's embedding or gradient) is
quantized independently to ``b`` bits, ``b`` in :data:`SUPPORTED_BITS`:

* ``m = min(x)``, ``M = max(x)``, ``L = 2**b - 1``, step ``Δ = (M - m) / L``;
* ``t = (x - m) / Δ`` in ``[0, L]``; code ``q = floor(t) + Bernoulli(t - floor(t))``, never
  above ``L`` (float rounding can give ``t`` just above ``L``);
* the receiver reconstructs ``x̂ = min(m + q·Δ, M)``; at one bit, exactly ``m`` or ``M``.

The Bernoulli draw uses 15 random bits per value (two values per 32-bit random word, half the
generator calls of one float draw per value): ``q = floor((r + u) / 2**15)`` with
``r = round(2**15·t)`` and ``u`` uniform on ``{0, ..., 2**15 - 1}``, so ``E[q] = r / 2**15``
exactly, and the only bias beyond float32 rounding of ``t`` is that of rounding ``t`` to a
multiple of ``2**-15``: ``|E[x̂] - x| <= Δ / 2**16``. ``Var[x̂_j] = Δ²·f_j(1 - f_j) <= Δ²/4``
with ``f_j`` the fractional part of ``r_j / 2**15``, so a row's total variance is at most
``D·Δ²/4``.

Row metadata is ``(m, M)`` in exact float32 (8 bytes a row, the same as ``(m, Δ)``; 16-bit
metadata would bias the reconstruction). ``Δ`` is recomputed on the receiver by the same
expression as on the sender (:func:`row_step`), and knowing ``M`` lets the receiver clamp
reconstructions into ``[m, M]`` exactly (``m + L·Δ`` can round an ulp above ``M``).
Constant rows (``M == m``) send codes of 0 and reconstruct ``m`` exactly.

Codes are packed along the feature axis, ``8 // b`` codes per byte, the first code of a byte in
its least significant bits. Each row is padded to whole bytes, so a packed row has
:func:`packed_row_bytes` bytes and rows stay independently addressable.

All functions are pure tensor functions: they run unchanged on any device, allocate on the
input's device, and do not communicate. On a CPU they work through a message in cache-sized
blocks of rows (:data:`_CPU_BLOCK_VALUES`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from adaqp.bits import SUPPORTED_BITS

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

"""Bit widths a row can be quantized to; each divides 8, so codes never straddle bytes."""

_METADATA_BYTES_PER_ROW = 8  # float32 minimum + float32 maximum

_NOISE_BITS = 15  # random bits per value: the resolution of the Bernoulli draw
# Float32 values in [2**23, 2**24) are the integers: adding 0 <= x < 2**23 to 2**23 rounds x to
# an integer r, and the float's bits read as the int32 0x4B000000 + r.
_INTEGER_BASE = 2.0**23

_CPU_BLOCK_VALUES = 1 << 19
"""Values quantized (and dequantized) per block of rows on a CPU. A block's buffers (about 3 MB)
stay in cache across its passes and are reused by the next block, where passes over a whole
message would stream it through memory several times and fault in fresh pages for every
temporary. Much smaller blocks lose to the fixed cost of a few dozen operator calls per block.
Other devices take a message in one block: there each block costs kernel launches."""


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


def _check_codes(codes_RD: Tensor) -> None:
    if codes_RD.dim() != 2 or codes_RD.dtype != torch.uint8:
        raise ValueError(
            f"pack expects a 2-D uint8 tensor, got {tuple(codes_RD.shape)} {codes_RD.dtype}"
        )


def _pack_slots(codes_RD: Tensor, bits: int) -> Tensor:
    """:func:`pack` by strided column slices, for any byte order (the slower, plainer way)."""
    per_byte = 8 // bits
    # Code slot j of every byte is the strided column slice j::per_byte; slot 0 always has the
    # full byte count, later slots may be one short (the padded tail), so OR them into a prefix.
    packed = codes_RD[:, 0::per_byte].clone()
    for slot in range(1, per_byte):
        column = codes_RD[:, slot::per_byte]
        packed[:, : column.shape[1]] |= column << (slot * bits)
    return packed


def _padded_dim(dim: int) -> int:
    """``dim`` rounded up to whole int64 words of 8 one-byte codes."""
    return -(-dim // 8) * 8


def _pack_words_(codes_RW: Tensor, bits: int, out_RB: Tensor) -> Tensor:
    """Pack codes into ``out_RB``, using ``codes_RW`` as scratch (its contents are lost).

    Args:
        codes_RW: contiguous uint8 ``[R, W]`` codes, ``W`` a multiple of 8, zero past ``D``.
        bits: bit width, in :data:`SUPPORTED_BITS`.
        out_RB: uint8 ``[R, ceil(D * bits / 8)]`` to fill.
    """
    if bits == 8 or codes_RW.numel() == 0:
        return out_RB.copy_(codes_RW[:, : out_RB.shape[1]])
    if sys.byteorder != "little":
        return out_RB.copy_(_pack_slots(codes_RW, bits)[:, : out_RB.shape[1]])
    per_byte = 8 // bits
    # Code j of a word sits in byte lane j (little-endian). Step k ORs every lane with the lane
    # 2**k above it, shifted down to sit just above the 2**k codes the lane already holds; after
    # log2(per_byte) steps lane i·per_byte holds codes i·per_byte ... (i+1)·per_byte - 1 (other
    # lanes hold leftovers, never read). Bit 63 is 0 before every shift (codes are < 2**bits, and
    # a lane fills its top bit only at the last step), so the signed shift brings in zeros.
    words = codes_RW.view(torch.int64)
    shifted = torch.empty_like(words)
    shift = 8 - bits
    for _ in range(per_byte.bit_length() - 1):  # log2(per_byte) steps
        torch.bitwise_right_shift(words, shift, out=shifted)
        words.bitwise_or_(shifted)
        shift *= 2
    lanes = codes_RW.view(codes_RW.shape[0], -1, per_byte)[:, :, 0]
    return out_RB.copy_(lanes[:, : out_RB.shape[1]])


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
    _check_codes(codes_RD)
    if bits == 8:
        return codes_RD.contiguous()
    rows, dim = codes_RD.shape
    packed = codes_RD.new_empty(rows, packed_row_bytes(dim, bits))
    if codes_RD.numel() == 0:
        return packed
    padded = codes_RD.new_zeros(rows, _padded_dim(dim))  # packing works in place on a copy
    padded[:, :dim] = codes_RD
    return _pack_words_(padded, bits, packed)


def _unpack_table(bits: int, device: torch.device) -> Tensor:
    """``[256]`` words whose bytes are the ``8 // bits`` codes of each byte value, in order."""
    per_byte = 8 // bits
    values = torch.arange(256, dtype=torch.int32, device=device)
    shifts = torch.arange(0, 8, bits, dtype=torch.int32, device=device)
    codes = ((values[:, None] >> shifts) & ((1 << bits) - 1)).to(torch.uint8)
    # Viewing the bytes as one wider integer keeps their memory order on any byte order.
    word = {2: torch.int16, 4: torch.int32, 8: torch.int64}[per_byte]
    return codes.view(word).view(256)


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
    return _unpack_with(_unpack_table(bits, packed_RB.device), packed_RB, bits, dim)


def _unpack_with(table: Tensor, packed_RB: Tensor, bits: int, dim: int) -> Tensor:
    """:func:`unpack` for ``bits < 8`` with a table from :func:`_unpack_table`."""
    # One table lookup per byte yields all of its codes at once, as one word of 8 // bits bytes.
    index = packed_RB.reshape(-1).to(torch.int32)
    words = torch.index_select(table, 0, index)
    row_codes = packed_RB.shape[1] * (8 // bits)
    return words.view(torch.uint8).view(packed_RB.shape[0], row_codes)[:, :dim]


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


def _fill_noise_(words: Tensor, generator: torch.Generator | None) -> Tensor:
    """Fill int32 ``words`` with two independent draws each, uniform on ``{0, ..., 2**15 - 1}``,
    in bits 0-14 and 16-30 (the other bits 0): ``words.view(torch.int16)`` holds one draw per
    element.

    ``random_()`` fills an int32 with 31 uniform bits (bit 31 is 0): half the generator calls of
    one float draw per value.
    """
    return words.random_(generator=generator).bitwise_and_(0x7FFF7FFF)


def _block_rows(rows: int, dim: int, device: torch.device) -> int:
    """Rows per block of :func:`_code_blocks`: see :data:`_CPU_BLOCK_VALUES`."""
    if device.type != "cpu":
        return max(rows, 1)
    return max(1, min(rows, _CPU_BLOCK_VALUES // max(dim, 1)))


def _code_blocks(
    x_RD: Tensor,
    minimum: Tensor,
    maximum: Tensor,
    levels: Tensor,
    generator: torch.Generator | None,
) -> Iterator[tuple[int, Tensor]]:
    """Stochastically rounded codes ``q`` in ``[0, L]``, one block of rows at a time, in order.

    Args:
        x_RD: float32 ``[R, D]`` rows.
        minimum: float32 ``[R]`` row minima.
        maximum: float32 ``[R]`` row maxima.
        levels: float32 ``[R]`` per-row ``L = 2**bits - 1``.
        generator: random generator on ``x_RD``'s device.

    Yields:
        ``(start, codes)``: the block's first row and contiguous uint8
        ``[rows in block, _padded_dim(D)]`` codes, then zeros, for :func:`_pack_words_` to
        consume; the next block reuses the buffer.
    """
    rows, dim = x_RD.shape
    padded_dim = _padded_dim(dim)
    device = x_RD.device
    step = row_step(minimum, maximum, levels)
    # Constant rows (and steps that underflow to 0) divide by 1 instead: x - m is 0 there (or
    # subnormal), so t rounds to code 0 and the receiver reconstructs m.
    safe_step_R1 = torch.where(step > 0, step, torch.ones_like(step))[:, None]
    levels_R1 = levels[:, None]
    block = _block_rows(rows, dim, device)
    value_buf = torch.empty(block, dim, dtype=torch.float32, device=device)
    integer_base = torch.tensor(_INTEGER_BASE, dtype=torch.float32, device=device)
    # Holds a block's random draws and then, once they are added in, the block's codes.
    scratch = torch.empty(
        max(-(-block * dim // 2), -(-block * padded_dim // 4)), dtype=torch.int32, device=device
    )
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        count = (stop - start) * dim
        noise = _fill_noise_(scratch[: -(-count // 2)], generator).view(torch.int16)[:count]
        value = torch.sub(
            x_RD[start:stop], minimum[start:stop, None], out=value_buf[: stop - start]
        )
        t = value.div_(safe_step_R1[start:stop])  # >= 0: x >= m is exact in floats
        # t can exceed L by an ulp after rounding, and a code of L + 1 would spill into the
        # neighbouring packed code (or wrap to 0 at 8 bits): clamping t to L keeps q <= L.
        torch.minimum(t, levels_R1[start:stop], out=t)
        # 2**23 + 2**15·t rounds 2**15·t (exact) to the nearest integer r, and as the sum lies
        # in [2**23, 2**24) its bits read as the int32 0x4B000000 + r: float rounding does the
        # conversion. Adding u is then exact, and floor((r + u) / 2**15) is floor(r / 2**15) +
        # Bernoulli((r mod 2**15) / 2**15): E[q] = r / 2**15, within 2**-16 of t.
        torch.add(integer_base, t, alpha=2**_NOISE_BITS, out=value)
        word = value.view(torch.int32)
        word.add_(noise.view(stop - start, dim))
        word.bitwise_right_shift_(_NOISE_BITS)
        # word = 2**8 + q, as r + u < (L + 1)·2**15: the uint8 cast wraps 2**8 away.
        codes = scratch.view(torch.uint8)[: (stop - start) * padded_dim]
        codes = codes.view(stop - start, padded_dim)
        codes[:, :dim] = word
        if padded_dim > dim:
            codes[:, dim:] = 0
        yield start, codes


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
    rows, dim = x_RD.shape
    minimum, maximum = _row_range(x_RD)
    levels = torch.full_like(minimum, float((1 << bits) - 1))
    packed = torch.empty(rows, packed_row_bytes(dim, bits), dtype=torch.uint8, device=x_RD.device)
    for start, codes in _code_blocks(x_RD, minimum, maximum, levels, generator):
        _pack_words_(codes, bits, packed[start : start + codes.shape[0]])
    return QuantizedRows(packed, minimum, maximum, bits, dim)


def _reconstruct_(out_RD: Tensor, minimum: Tensor, maximum: Tensor, step: Tensor) -> Tensor:
    """In place: codes held in float32 ``out_RD`` become ``min(m + q·Δ, M)``."""
    out_RD.mul_(step[:, None]).add_(minimum[:, None])
    # m + L·Δ can round one ulp above M; clamping keeps every value inside [m, M] exactly.
    return torch.minimum(out_RD, maximum[:, None], out=out_RD)


def _decode_(
    out_RD: Tensor, packed_RB: Tensor, bits: int, minimum: Tensor, maximum: Tensor
) -> Tensor:
    """In place: float32 ``out_RD`` becomes the reconstruction of the packed rows.

    Blocks of rows as in :func:`_code_blocks`, so that each block's passes stay in cache.
    """
    rows, dim = out_RD.shape
    device = packed_RB.device
    table = _unpack_table(bits, device) if bits < 8 else None
    step = row_step(minimum, maximum, (1 << bits) - 1)
    if bits == 1:
        # m + 1·Δ can miss M by an ulp when M - m rounds. With the next float above Δ it lands
        # on or above M, so the clamp to M makes every value exactly m or M.
        step = torch.nextafter(step, torch.full_like(step, float("inf")))
        step = step.clamp_(max=torch.finfo(torch.float32).max)
    block = _block_rows(rows, dim, device)
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        packed, out = packed_RB[start:stop], out_RD[start:stop]
        out.copy_(packed if table is None else _unpack_with(table, packed, bits, dim))
        _reconstruct_(out, minimum[start:stop], maximum[start:stop], step[start:stop])
    return out_RD


def _output_buffer(out: Tensor | None, rows: int, dim: int, device: torch.device) -> Tensor:
    if out is None:
        return torch.empty(rows, dim, dtype=torch.float32, device=device)
    if tuple(out.shape) != (rows, dim) or out.dtype != torch.float32:
        raise ValueError(
            f"out must be float32 of shape ({rows}, {dim}), got {tuple(out.shape)} {out.dtype}"
        )
    return out


def dequantize(q: QuantizedRows, out: Tensor | None = None) -> Tensor:
    """Reconstruct ``x̂ = min(m + q·Δ, M)`` (one bit: ``m`` or ``M``) from :func:`quantize` output.

    Args:
        q: quantized rows.
        out: optional float32 ``[R, D]`` tensor to write into (e.g. a row slice of a halo
            buffer; it may be a strided view).

    Returns:
        float32 ``[R, D]``: ``out`` when given.
    """
    out = _output_buffer(out, q.num_rows, q.dim, q.packed.device)
    return _decode_(out, q.packed, q.bits, q.minimum, q.maximum)


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
    total = _METADATA_BYTES_PER_ROW * sum(counts)
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
    bits_R = bits_R.to(x_RD.device)
    counts = _width_counts(bits_R)
    if bits_R.shape[0] != rows:
        raise ValueError(f"bits_R has {bits_R.shape[0]} entries for {rows} rows")
    size = _buffer_bytes(counts, dim)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=x_RD.device)
    elif out.dim() != 1 or out.dtype != torch.uint8 or out.shape[0] != size:
        raise ValueError(f"out must be uint8 [{size}], got {tuple(out.shape)} {out.dtype}")

    minimum, maximum = _row_range(x_RD)
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
    # Blocks run over all rows in order with per-row L, so the random stream does not depend
    # on how rows split into widths.
    for start, codes in _code_blocks(x_RD, minimum, maximum, _levels(bits_R), generator):
        stop = start + codes.shape[0]
        if single is not None:
            _pack_words_(codes, single, sections[single][start:stop])
            continue
        for bits in sections:  # at most 4 widths, not rows
            index = (bits_R[start:stop] == bits).nonzero().squeeze(1)
            num = index.numel()
            if num:
                group = codes if num == stop - start else codes.index_select(0, index)
                _pack_words_(group, bits, sections[bits][filled[bits] : filled[bits] + num])
                filled[bits] += num
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
    bits_R = bits_R.to(buf.device)
    counts = _width_counts(bits_R)
    rows = bits_R.shape[0]
    size = _buffer_bytes(counts, dim)
    if buf.dim() != 1 or buf.dtype != torch.uint8 or buf.shape[0] != size:
        raise ValueError(
            f"buf must be uint8 [{size}] for these widths, got {tuple(buf.shape)} {buf.dtype}"
        )
    out = _output_buffer(out, rows, dim, buf.device)

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
            _decode_(out, packed, bits, minimum, maximum)
            continue
        index = (bits_R == bits).nonzero().squeeze(1)
        group = torch.empty(count, dim, dtype=torch.float32, device=buf.device)
        _decode_(group, packed, bits, minimum[index], maximum[index])
        out.index_copy_(0, index, group)
    return out
