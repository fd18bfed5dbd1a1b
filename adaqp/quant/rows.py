"""Per-row stochastic integer quantization at one bit width: quantize, dequantize.

Each row ``x`` of a ``[R, D]`` tensor (one message: one node's embedding or gradient) is
quantized independently to ``b`` bits, ``b`` in :data:`~adaqp.bits.SUPPORTED_BITS`:

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

The codes are packed by :mod:`adaqp.quant.pack`. All functions are pure tensor functions: they
run unchanged on any device, allocate on the input's device, and do not communicate. This
module is the torch path (the reference); on CPU tensors the entry points hand over to the
compiled kernels unless told otherwise (``kernels=``, :mod:`adaqp.quant.kernels`), whose draws
are counter-based and whose bias bound is half this one (:mod:`adaqp.quant.compiled`). On a
CPU the torch path works through a message in cache-sized blocks of rows
(:data:`_CPU_BLOCK_VALUES`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from adaqp.quant.draws import RowKeys, lanes16
from adaqp.quant.kernels import dequantize_rows as compiled_dequantize
from adaqp.quant.kernels import quantize_rows as compiled_quantize
from adaqp.quant.kernels import use_compiled
from adaqp.quant.pack import (
    check_bits,
    message_bytes,
    pack_words_,
    packed_row_bytes,
    padded_dim,
    unpack_table,
    unpack_with,
)

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


def as_float32_rows(x_RD: Tensor) -> Tensor:
    if x_RD.dim() != 2:
        raise ValueError(f"expected a 2-D [rows, dim] tensor, got shape {tuple(x_RD.shape)}")
    if not x_RD.is_floating_point():
        raise ValueError(f"expected a floating-point tensor, got {x_RD.dtype}")
    return x_RD if x_RD.dtype == torch.float32 else x_RD.to(torch.float32)


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


def _fill_noise_(words: Tensor, generator: torch.Generator | None) -> Tensor:
    """Fill int32 ``words`` with two independent draws each, uniform on ``{0, ..., 2**15 - 1}``,
    in bits 0-14 and 16-30 (the other bits 0): ``words.view(torch.int16)`` holds one draw per
    element.

    ``random_()`` fills an int32 with 31 uniform bits (bit 31 is 0): half the generator calls of
    one float draw per value.
    """
    return words.random_(generator=generator).bitwise_and_(0x7FFF7FFF)


def _block_rows(rows: int, dim: int, device: torch.device) -> int:
    """Rows per block of :func:`code_blocks`: see :data:`_CPU_BLOCK_VALUES`."""
    if device.type != "cpu":
        return max(rows, 1)
    return max(1, min(rows, _CPU_BLOCK_VALUES // max(dim, 1)))


def code_blocks(
    x_RD: Tensor,
    minimum: Tensor,
    maximum: Tensor,
    levels: Tensor,
    generator: torch.Generator | None,
    keys: RowKeys | None = None,
) -> Iterator[tuple[int, Tensor]]:
    """Stochastically rounded codes ``q`` in ``[0, L]``, one block of rows at a time, in order.

    Args:
        x_RD: float32 ``[R, D]`` rows.
        minimum: float32 ``[R]`` row minima.
        maximum: float32 ``[R]`` row maxima.
        levels: float32 ``[R]`` per-row ``L = 2**bits - 1``.
        generator: random generator on ``x_RD``'s device.
        keys: the rows' keys: each draw is then the top 15 bits of the compiled path's 16-bit
            draw for the same keys (:mod:`adaqp.quant.draws`), not the generator's.

    Yields:
        ``(start, codes)``: the block's first row and contiguous uint8
        ``[rows in block, padded_dim(D)]`` codes, then zeros, for :func:`pack_words_` to
        consume; the next block reuses the buffer.
    """
    rows, dim = x_RD.shape
    width = padded_dim(dim)
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
        max(-(-block * dim // 2), -(-block * width // 4)), dtype=torch.int32, device=device
    )
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        count = (stop - start) * dim
        if keys is None:
            noise = _fill_noise_(scratch[: -(-count // 2)], generator).view(torch.int16)[:count]
        else:
            noise = lanes16(keys.take(slice(start, stop)), dim, device).bitwise_right_shift_(1)
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
        codes = scratch.view(torch.uint8)[: (stop - start) * width]
        codes = codes.view(stop - start, width)
        codes[:, :dim] = word
        if width > dim:
            codes[:, dim:] = 0
        yield start, codes


def quantize(
    x_RD: Tensor,
    bits: int,
    generator: torch.Generator | None = None,
    kernels: str | None = None,
) -> QuantizedRows:
    """Stochastically quantize each row of ``x_RD`` to ``bits`` bits.

    Args:
        x_RD: ``[R, D]`` floating tensor (computed in float32).
        bits: bit width, in :data:`SUPPORTED_BITS`.
        generator: random generator on ``x_RD``'s device; same seed gives the same result.
        kernels: ``auto``, ``torch`` or ``compiled`` (:mod:`adaqp.quant.kernels`); None: the
            process default.

    Returns:
        The packed codes and float32 ``(m, M)`` metadata.

    Raises:
        ValueError: unsupported ``bits``, a non-2-D or non-float input, NaN/Inf in the input,
            or a row range that overflows float32.
    """
    check_bits(bits)
    x_RD = as_float32_rows(x_RD)
    rows, dim = x_RD.shape
    packed = torch.empty(rows, packed_row_bytes(dim, bits), dtype=torch.uint8, device=x_RD.device)
    if use_compiled(kernels, x_RD.device):
        minimum, maximum = compiled_quantize(x_RD, bits, generator, packed)
        return QuantizedRows(packed, minimum, maximum, bits, dim)
    minimum, maximum = row_range(x_RD)
    levels = torch.full_like(minimum, float((1 << bits) - 1))
    for start, codes in code_blocks(x_RD, minimum, maximum, levels, generator):
        pack_words_(codes, bits, packed[start : start + codes.shape[0]])
    return QuantizedRows(packed, minimum, maximum, bits, dim)


def _reconstruct_(out_RD: Tensor, minimum: Tensor, maximum: Tensor, step: Tensor) -> Tensor:
    """In place: codes held in float32 ``out_RD`` become ``min(m + q·Δ, M)``."""
    out_RD.mul_(step[:, None]).add_(minimum[:, None])
    # m + L·Δ can round one ulp above M; clamping keeps every value inside [m, M] exactly.
    return torch.minimum(out_RD, maximum[:, None], out=out_RD)


def decode_(
    out_RD: Tensor, packed_RB: Tensor, bits: int, minimum: Tensor, maximum: Tensor
) -> Tensor:
    """In place: float32 ``out_RD`` becomes the reconstruction of the packed rows.

    Blocks of rows as in :func:`code_blocks`, so that each block's passes stay in cache.
    """
    rows, dim = out_RD.shape
    device = packed_RB.device
    table = unpack_table(bits, device) if bits < 8 else None
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
        out.copy_(packed if table is None else unpack_with(table, packed, bits, dim))
        _reconstruct_(out, minimum[start:stop], maximum[start:stop], step[start:stop])
    return out_RD


def output_buffer(out: Tensor | None, rows: int, dim: int, device: torch.device) -> Tensor:
    if out is None:
        return torch.empty(rows, dim, dtype=torch.float32, device=device)
    if tuple(out.shape) != (rows, dim) or out.dtype != torch.float32:
        raise ValueError(
            f"out must be float32 of shape ({rows}, {dim}), got {tuple(out.shape)} {out.dtype}"
        )
    return out


def dequantize(q: QuantizedRows, out: Tensor | None = None, kernels: str | None = None) -> Tensor:
    """Reconstruct ``x̂ = min(m + q·Δ, M)`` (one bit: ``m`` or ``M``) from :func:`quantize` output.

    Args:
        q: quantized rows.
        out: optional float32 ``[R, D]`` tensor to write into (e.g. a row slice of a halo
            buffer; it may be a strided view).
        kernels: as for :func:`quantize`; both paths decode the same bytes to the same floats.

    Returns:
        float32 ``[R, D]``: ``out`` when given.
    """
    out = output_buffer(out, q.num_rows, q.dim, q.packed.device)
    if use_compiled(kernels, q.packed.device):
        return compiled_dequantize(q.packed, q.bits, q.minimum, q.maximum, out)
    return decode_(out, q.packed, q.bits, q.minimum, q.maximum)
