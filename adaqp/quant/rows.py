"""Per-row stochastic integer quantization at one bit width: quantize, dequantize.

Each row ``x`` of a ``[R, D]`` tensor (one message: one node's embedding or gradient) is
quantized independently to ``b`` bits, ``b`` in :data:`~adaqp.quant.bits.SUPPORTED_BITS`:

* ``m = min(x)``, ``M = max(x)``, ``L = 2**b - 1``, step ``Δ = (M - m) / L``;
* ``t = (x - m) / Δ`` in ``[0, L]``; code ``q = floor(t) + Bernoulli(t - floor(t))``, never
  above ``L`` (float rounding can give ``t`` just above ``L``);
* the receiver reconstructs ``x̂ = min(m + q·Δ, M)``; at one bit, exactly ``m`` or ``M``.

The Bernoulli draw uses 16 random bits per value, a lane of a keyed 32-bit hash word
(:mod:`adaqp.quant.draws`; two values a word): with the scaled value
``σ = min((x - m)·(2**16 / Δ), 2**16·L)`` (float32), ``ρ = rint(σ)`` and ``u`` uniform on
``{0, ..., 2**16 - 1}``, ``q = floor((ρ + u) / 2**16)``, so ``E[q] = ρ / 2**16`` exactly, and
the only bias beyond float32 rounding of ``σ`` is that of rounding it to an integer:
``|E[x̂] - x| <= Δ / 2**17``. ``Var[x̂_j] = Δ²·f_j(1 - f_j) <= Δ²/4`` with ``f_j`` the
fractional part of ``ρ_j / 2**16``, so a row's total variance is at most ``D·Δ²/4``. This is
the compiled kernels' rule operation for operation (:mod:`adaqp.quant.compiled`): given the
same keys, both paths write the same codes.

Row metadata is ``(m, M)`` in exact float32 (8 bytes a row, the same as ``(m, Δ)``; 16-bit
metadata would bias the reconstruction). ``Δ`` is recomputed on the receiver by the same
expression as on the sender (:func:`row_step`), and knowing ``M`` lets the receiver clamp
reconstructions into ``[m, M]`` exactly (``m + L·Δ`` can round an ulp above ``M``).
Constant rows (``M == m``) send codes of 0 and reconstruct ``m`` exactly.

The codes are packed by :mod:`adaqp.quant.pack`. All functions are pure tensor functions: they
run unchanged on any device, allocate on the input's device, and do not communicate. This
module is the torch path (the reference, and the path for CUDA tensors); on CPU tensors the
entry points hand over to the compiled kernels unless told otherwise (``kernels=``,
:mod:`adaqp.quant.kernels`), which write the same bytes for the same keys. On a CPU the torch
path works through a message in cache-sized blocks of rows (:data:`_CPU_BLOCK_VALUES`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from adaqp.quant.draws import RowKeys, centred_lanes16, row_keys
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

_SCALE = 2.0**16  # random bits per value, 2**16: the resolution of the Bernoulli draw

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


def _block_rows(rows: int, dim: int, device: torch.device) -> int:
    """Rows per block of :func:`code_blocks`: see :data:`_CPU_BLOCK_VALUES`."""
    if device.type != "cpu":
        return max(rows, 1)
    return max(1, min(rows, _CPU_BLOCK_VALUES // max(dim, 1)))


def code_blocks(
    x_RD: Tensor, minimum: Tensor, maximum: Tensor, levels: Tensor, keys: RowKeys
) -> Iterator[tuple[int, Tensor]]:
    """Stochastically rounded codes ``q`` in ``[0, L]``, one block of rows at a time, in order.

    Args:
        x_RD: float32 ``[R, D]`` rows.
        minimum: float32 ``[R]`` row minima.
        maximum: float32 ``[R]`` row maxima.
        levels: float32 ``[R]`` per-row ``L = 2**bits - 1``.
        keys: the rows' keys: value ``(r, j)`` takes the compiled path's 16-bit draw for the
            same keys (:func:`adaqp.quant.draws.lanes16`), so both paths give the same codes.

    Yields:
        ``(start, codes)``: the block's first row and contiguous uint8
        ``[rows in block, padded_dim(D)]`` codes, then zeros, for :func:`pack_words_` to
        consume; the next block reuses the buffer.
    """
    rows, dim = x_RD.shape
    width = padded_dim(dim)
    device = x_RD.device
    step = row_step(minimum, maximum, levels)
    # Constant rows divide by 1 instead: x - m is 0 there, so σ is 0 and the code 0.
    safe_step = torch.where(step > 0, step, torch.ones_like(step))
    # σ = (x - m)·(2**16 / Δ), a multiply a value as the compiled kernel does, rounded alike.
    scale_R1 = (torch.full_like(safe_step, _SCALE) / safe_step)[:, None]
    # A step below 2**16 / float32 max: its reciprocal overflows, and such rows (rare) take
    # σ = (x - m) / Δ·2**16 instead, as the kernel does.
    overflow = ~torch.isfinite(scale_R1[:, 0])
    overflow = overflow.nonzero().squeeze(1) if bool(overflow.any()) else None
    top_R1 = (levels * _SCALE)[:, None]  # 2**16·L, exact
    block = _block_rows(rows, dim, device)
    value_buf = torch.empty(block, dim, dtype=torch.float32, device=device)
    code_buf = torch.empty(block * width, dtype=torch.uint8, device=device)
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        noise = centred_lanes16(keys.take(slice(start, stop)), dim, device)  # u - 2**15
        value = torch.sub(
            x_RD[start:stop], minimum[start:stop, None], out=value_buf[: stop - start]
        )
        sigma = value.mul_(scale_R1[start:stop])  # >= 0: x >= m is exact in floats
        if overflow is not None:
            inside = overflow[(overflow >= start) & (overflow < stop)]
            if inside.numel():
                exact = (x_RD[inside] - minimum[inside, None]) / step[inside, None] * _SCALE
                sigma[inside - start] = exact
        # σ can exceed 2**16·L by an ulp after rounding, and a code of L + 1 would spill into
        # the neighbouring packed code (or wrap to 0 at 8 bits): the clamp keeps q <= L.
        torch.minimum(sigma, top_R1[start:stop], out=sigma)
        # ρ = rint(σ) (half to even, as numpy's rint) and ρ + u are integers below 2**24,
        # exact in float32, and so is their quotient by 2**16 rounded down:
        # q = floor(ρ / 2**16) + Bernoulli((ρ mod 2**16) / 2**16), E[q] = ρ / 2**16.
        sigma.round_().add_(_SCALE / 2).add_(noise).mul_(1.0 / _SCALE).floor_()
        codes = code_buf[: (stop - start) * width].view(stop - start, width)
        codes[:, :dim] = sigma
        if width > dim:
            codes[:, dim:] = 0
        yield start, codes


def quantize(
    x_RD: Tensor,
    bits: int,
    *,
    kernels: str | None = None,
    keys: RowKeys | None = None,
) -> QuantizedRows:
    """Stochastically quantize each row of ``x_RD`` to ``bits`` bits.

    Args:
        x_RD: ``[R, D]`` floating tensor (computed in float32).
        bits: bit width, in :data:`SUPPORTED_BITS`.
        kernels: ``auto``, ``torch`` or ``compiled`` (:mod:`adaqp.quant.kernels`); None: the
            process default.
        keys: the rows' keys (:mod:`adaqp.quant.draws`): the same keys give the same codes,
            on either path. None: rows keyed by index under a base key drawn from torch's
            default generator (:func:`~adaqp.quant.draws.fresh_keys`).

    Returns:
        The packed codes and float32 ``(m, M)`` metadata.

    Raises:
        ValueError: unsupported ``bits``, a non-2-D or non-float input, NaN/Inf in the input,
            a row range that overflows float32, or keys for another number of rows.
    """
    check_bits(bits)
    x_RD = as_float32_rows(x_RD)
    rows, dim = x_RD.shape
    keys = row_keys(keys, rows)
    packed = torch.empty(rows, packed_row_bytes(dim, bits), dtype=torch.uint8, device=x_RD.device)
    if use_compiled(kernels, x_RD.device):
        minimum, maximum = compiled_quantize(x_RD, bits, packed, keys)
        return QuantizedRows(packed, minimum, maximum, bits, dim)
    minimum, maximum = row_range(x_RD)
    levels = torch.full_like(minimum, float((1 << bits) - 1))
    for start, codes in code_blocks(x_RD, minimum, maximum, levels, keys):
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
