"""Compiled CPU kernels (numba): quantize + pack, unpack + dequantize, and dropout's mask.

One fused pass per row writes exactly what :func:`~adaqp.quant.mixed.quantize_mixed` writes
(the wire format of :mod:`adaqp.quant.pack` and :mod:`adaqp.quant.mixed`), with the rounding
rule and the keyed draws of :mod:`adaqp.quant.rows`: the same keys give the same bytes. Python
wrappers, the choice of path and the threads live in :mod:`adaqp.quant.kernels`; this module
holds only the numba code.

**The random draw.** A message (one call) takes a 64-bit base key ``s`` and a uint64 key
``k_r`` per row (:mod:`adaqp.quant.draws`: in training, ``s`` hashes the seed, epoch, layer and
direction, and ``k_r`` is the global id of the node whose row it is; a plain call that names no
keys draws ``s`` from torch's default generator and takes ``k_r = r``,
:func:`adaqp.quant.draws.fresh_keys`). Row ``r`` of an ``[R, D]`` message (an exchange's buffer
of peer segments is one message, :mod:`adaqp.exchange.message`) takes ``K_r = mix64(s + (k_r +
1)·γ mod 2**64)``, output ``k_r + 1`` of SplitMix64 (Steele, Lea and Flood, 2014) seeded with
``s`` (``γ = 0x9E3779B97F4A7C15``, ``mix64`` its finaliser), split into 32-bit halves ``a_r``
(low) and ``b_r`` (high). Value ``(r, j)`` draws the 16-bit lane ``j mod 2`` (bits ``16·(j mod
2)`` and up) of the word ``h(a_r + (j // 2)·0x9E3779B9 mod 2**32)``, where ``h`` is lowbias32
(Wellons' hash-prospector function: xor-shift 16, multiply by ``0x7FEB352D``, xor-shift 15,
multiply by ``0x846CA68B``, xor-shift 16) with ``b_r`` xored in after its first multiply. Codes
therefore depend on ``(s, k_r, j)`` and the value only: not on the thread count, the order rows
are visited in or how rows split into widths. (A 32-bit word hash vectorises in eight lanes of
native 32-bit multiplies; SplitMix64 per word, as before, cost three times as much and a
quarter of the quantizer's time.)

**Rounding.** ``Δ = (M - m) / L`` (1 where it is 0) as in :mod:`adaqp.quant.rows`, the scaled
value ``σ = min((x - m)·(2**16 / Δ), 2**16·L)`` (float32; where ``2**16 / Δ`` overflows,
``(x - m) / Δ·2**16``), ``ρ = rint(σ)`` (rounded half to even), and ``q = (ρ + u) >> 16``
with ``u`` the value's 16-bit draw; ``q <= L`` as ``σ <= 2**16·L``. The torch path
(:mod:`adaqp.quant.rows`) evaluates the same float32 operations, so its codes are these.

**Unbiasedness.** For a seed uniform on ``[0, 2**64)``, ``s + (k_r + 1)·γ`` is uniform,
``mix64`` is a bijection of 64-bit words, so ``K_r`` is uniform and its halves are independent
and uniform; given ``b_r``, ``a_r + k·0x9E3779B9`` is uniform on 32-bit words and the keyed
``h`` is a bijection of them (each step is), so every word is uniform and a 16-bit lane of a
uniform word is uniform: each ``u`` is *exactly* uniform on ``{0, ..., 2**16 - 1}``, so ``E[q]
= ρ / 2**16`` exactly and ``|E[q] - σ / 2**16| <= 2**-17``. Hence ``|E[x̂] - x| <= Δ / 2**17``
beyond float32 rounding of ``σ`` and of ``m + q·Δ``, and ``Var[x̂] = Δ²·f(1 - f) <= Δ²/4`` with
``f`` the fractional part of ``ρ / 2**16``. Distinct values of a row use distinct words (or
lanes of one word); rows with distinct keys use distinct SplitMix64 outputs. Joint independence
beyond that is as good as the hash's and is not otherwise claimed; the tests check the lanes'
uniformity and the correlation of neighbouring draws.

**Reconstruction** is the torch path's expression, evaluated in the same float32 order
(``min(m + q·Δ, M)``, no fused multiply-add; one bit: ``m`` or ``M``), so both paths decode the
same bytes to the same floats. The decoder can also *blend* the rows into the tensor it writes
(``out + w·(x̂ - out)``, the moving average of stale rows, :func:`adaqp.quant.mixed.blend_`):
one pass instead of decoding into a new tensor and reading it back.

Row minima and maxima are taken over the float32 bit patterns mapped to order-preserving
integers (vectorised integer min/max): a NaN maps beyond ±Inf, so a row holding NaN or ±Inf
gets a non-finite ``M - m``; such a row is skipped (codes 0) and the caller raises.

**Dropout's mask** (:func:`masked_scale_serial`, used by :mod:`adaqp.quant.mask`) keys its
rows the same way (a node's global id, or an edge's key for attention weights) and draws 32
bits a value: value ``(r, j)`` takes the whole word ``h(a_r + j·0x9E3779B9)`` and is kept
when it is at least ``round(p·2**32)``, so ``P(keep)`` is within ``2**-33`` of ``1 - p``.

Entry points (``*_serial``, ``*_parallel``) release the GIL; the ``*_parallel`` ones split
rows (or blocks) into chunks over numba's threads, with the same result as the serial ones.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)
_ONE64 = np.uint64(1)
_I31 = np.int32(31)
_I16 = np.int32(16)
_IMAX = np.int32(0x7FFFFFFF)
_IMIN = np.int32(-0x80000000)
_SCALE16 = np.float32(65536.0)
_F1 = np.float32(1.0)

DRAWS_PER_WORD = 2
"""16-bit draws per 32-bit hash word."""

_G32 = np.uint32(0x9E3779B9)
_H1, _H2 = np.uint32(0x7FEB352D), np.uint32(0x846CA68B)
_U16 = np.uint32(16)


@njit(cache=True)
def mix64(z):
    """SplitMix64's finaliser: a bijection of 64-bit words."""
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


def _spread_bits_table():
    """``[256]`` uint64: byte ``k`` of entry ``b`` is bit ``k`` of ``b`` (one-bit codes)."""
    table = np.zeros(256, np.uint64)
    for b in range(256):
        table[b] = sum(((b >> k) & 1) << (8 * k) for k in range(8))
    return table


_SPREAD1 = _spread_bits_table()
_GATHER1 = np.uint64(0x0102040810204080)
"""Times a word of eight 0/1 bytes (byte ``k`` = code ``k``), its top byte has code ``k`` at
bit ``k``: byte ``k`` reaches bit ``56 + k`` by the term ``2**(56 - 7k)`` alone, and no two
products overlap, so nothing carries."""
_S56 = np.uint64(56)
_U3, _U12, _U48, _U192 = np.uint32(3), np.uint32(12), np.uint32(48), np.uint32(192)
_U4, _U6, _U15, _U18 = np.uint32(4), np.uint32(6), np.uint32(15), np.uint32(18)
_U240 = np.uint32(240)

# The row loops below are written out in one function each: a call that passes arrays costs
# more (reference counting) than the work on a short row, and views are made once per call.


@njit(cache=True, inline="always")
def _key_range(row_bits):
    """Order-preserving int32 keys of a row's smallest and largest float32 (its bits as
    int32): a vectorised integer min/max. ``_unkey`` turns a key back into float32 bits."""
    lo, hi = _IMAX, _IMIN
    for j in range(row_bits.shape[0]):
        b = row_bits[j]
        key = np.int32(b ^ np.int32(np.int32(b >> _I31) & _IMAX))
        lo = np.int32(min(lo, key))
        hi = np.int32(max(hi, key))
    return lo, hi


@njit(cache=True, inline="always")
def _unkey(key):
    return key ^ ((key >> _I31) & _IMAX)


@njit(cache=True, inline="always")
def _fill_words(words, low, high):
    """``words[k] = h_high(low + k·0x9E3779B9)``: the keyed lowbias32 of the docstring."""
    for k in range(words.shape[0]):
        z = np.uint32(low + np.uint32(np.uint32(k) * _G32))
        z ^= z >> _U16
        z = np.uint32(z * _H1) ^ high
        z ^= z >> _U15
        z = np.uint32(z * _H2)
        z ^= z >> _U16
        words[k] = z


@njit(cache=True)
def _quantize_rows(
    x_RD, bits_R, seed, keys_R, offsets_R, payload, mins, maxs, first_R, start, stop
):
    """Quantizes rows ``start`` to ``stop`` (see :func:`quantize_serial`); returns how many
    were skipped as non-finite."""
    dim = x_RD.shape[1]
    xbits = x_RD.view(np.int32)
    mins_i, maxs_i = mins.view(np.int32), maxs.view(np.int32)
    groups = (dim + DRAWS_PER_WORD - 1) // DRAWS_PER_WORD
    words = np.zeros(groups, np.uint32)
    draws = words.view(np.uint16)  # draw j: lane j % 2 of word j // 2 (little-endian)
    # The row key passes through memory: read back as two uint32, the hash loop below is
    # vectorised in 32-bit lanes (from the 64-bit key itself, LLVM widens it to 64-bit lanes).
    # Its names are its own: numba gives a name one type per function.
    row_key = np.zeros(2, np.uint32)
    row_key64 = row_key.view(np.uint64)
    c = np.zeros((dim + 7) // 8 * 8 + 8, np.uint8)  # codes; zero tail: packing reads whole bytes
    c64 = c.view(np.uint64)
    skipped = 0
    repeats = first_R.shape[0] > 0
    for r in range(start, stop):
        if repeats and first_R[r] >= 0:
            continue  # a copy of an earlier row: copy_repeats fills it
        bits = bits_R[r]
        out = payload[offsets_R[r] : offsets_R[r] + (dim * bits + 7) // 8]
        row = x_RD[r]
        lo, hi = _key_range(xbits[r])
        mins_i[r], maxs_i[r] = _unkey(lo), _unkey(hi)
        mn, mx = mins[r], maxs[r]
        span = mx - mn
        if not np.isfinite(span):  # NaN or ±Inf in the row, or a range overflowing float32
            for i in range(out.shape[0]):
                out[i] = 0
            skipped += 1
            continue
        levels = np.float32((1 << bits) - 1)
        step = span / levels
        scale = _SCALE16 / (step if step > 0 else _F1)
        top = levels * _SCALE16
        row_key64[0] = mix64(seed + (keys_R[r] + _ONE64) * _GAMMA)
        _fill_words(words, row_key[0], row_key[1])  # little-endian: the low half first
        if np.isfinite(scale):
            for j in range(dim):
                rho = np.int32(np.rint(min((row[j] - mn) * scale, top)))
                c[j] = np.uint8(np.int32(np.int32(rho + np.int32(draws[j])) >> _I16))
        else:  # a step below 2**16 / float32 max: its reciprocal overflows, a quotient does not
            for j in range(dim):
                rho = np.int32(np.rint(min((row[j] - mn) / step * _SCALE16, top)))
                c[j] = np.uint8(np.int32(np.int32(rho + np.int32(draws[j])) >> _I16))
        # Code j in byte j // (8 // bits) at bit (j % (8 // bits))·bits, as pack() does.
        if bits == 8:
            for i in range(out.shape[0]):
                out[i] = c[i]
        elif bits == 4:
            for i in range(out.shape[0]):
                out[i] = c[2 * i] | (c[2 * i + 1] << 4)
        elif bits == 2:
            for i in range(out.shape[0]):
                j = 4 * i
                out[i] = c[j] | (c[j + 1] << 2) | (c[j + 2] << 4) | (c[j + 3] << 6)
        elif bits == 1:  # eight 0/1 code bytes, little-endian in a word: one multiply gathers them
            for i in range(out.shape[0]):
                out[i] = np.uint8((c64[i] * _GATHER1) >> _S56)
    return skipped


@njit(cache=True, nogil=True)
def quantize_serial(x_RD, bits_R, seed, keys_R, offsets_R, payload, mins, maxs, first_R):
    """Quantizes every row of float32 ``x_RD`` at its width into ``payload`` at
    ``offsets_R``, and its float32 minimum and maximum into ``mins``/``maxs``; one thread.
    Row ``r``'s draws are keyed by (``seed``, ``keys_R[r]``) (uint64 base and row keys).
    Returns how many rows held NaN or ±Inf or a range overflowing float32 (their codes: 0).
    Rows ``r`` with ``first_R[r] >= 0`` are left to :func:`copy_repeats` (``first_R`` empty:
    none)."""
    args = (x_RD, bits_R, seed, keys_R, offsets_R, payload, mins, maxs, first_R)
    return _quantize_rows(*args, 0, x_RD.shape[0])


@njit(cache=True, nogil=True, parallel=True)
def quantize_parallel(x_RD, bits_R, seed, keys_R, offsets_R, payload, mins, maxs, first_R, chunks):
    """:func:`quantize_serial` over ``chunks`` slices of rows on numba's threads."""
    rows = x_RD.shape[0]
    skipped = 0
    for c in prange(chunks):
        start, stop = c * rows // chunks, (c + 1) * rows // chunks
        args = (x_RD, bits_R, seed, keys_R, offsets_R, payload, mins, maxs, first_R, start, stop)
        skipped += _quantize_rows(*args)
    return skipped


@njit(cache=True, nogil=True)
def squared_ranges(x_RD, out_R):
    """``out_R[r] = (max - min)²`` of row ``r`` of float32 ``x_RD``, the difference taken in
    float32 and squared in float64 (float64 ``out_R``); NaN where the row holds one. One
    pass of :func:`_key_range`, as the quantizer takes its rows' minima and maxima."""
    dim = x_RD.shape[1]
    xbits = x_RD.view(np.int32)
    ends = np.zeros(2, np.int32)
    ends_f = ends.view(np.float32)
    for r in range(x_RD.shape[0]):
        lo, hi = _key_range(xbits[r])
        ends[0], ends[1] = _unkey(lo), _unkey(hi)
        span = np.float64(np.float32(ends_f[1] - ends_f[0]))
        out_R[r] = span * span if dim else 0.0


@njit(cache=True)
def _dequantize_rows(payload, bits_R, offsets_R, mins, maxs, out_RD, weight, start, stop):
    """Reconstructs rows ``start`` to ``stop`` into ``out_RD``, or blends them into it
    (see :func:`dequantize_serial`)."""
    dim = out_RD.shape[1]
    codes = np.zeros((dim + 7) // 8 * 8 + 8, np.uint8)
    codes16, codes32, codes64 = codes.view(np.uint16), codes.view(np.uint32), codes.view(np.uint64)
    blend = weight != _F1
    for r in range(start, stop):
        bits = bits_R[r]
        row = payload[offsets_R[r] : offsets_R[r] + (dim * bits + 7) // 8]
        mn, mx, out = mins[r], maxs[r], out_RD[r]
        if bits == 1:  # each byte's 8 codes at once, then m or M
            for i in range(row.shape[0]):
                codes64[i] = _SPREAD1[row[i]]
            if blend:
                for j in range(dim):
                    a = out[j]
                    out[j] = a + weight * ((mx if codes[j] else mn) - a)
            else:
                for j in range(dim):
                    out[j] = mx if codes[j] else mn
            continue
        if bits == 2:
            for i in range(row.shape[0]):
                b = np.uint32(row[i])
                low = (b & _U3) | ((b & _U12) << _U6)
                codes32[i] = low | ((b & _U48) << _U12) | ((b & _U192) << _U18)
        elif bits == 4:
            for i in range(row.shape[0]):
                b = np.uint32(row[i])
                codes16[i] = np.uint16((b & _U15) | ((b & _U240) << _U4))
        src = row if bits == 8 else codes  # 8 bits: a code per byte, read in place
        step = (mx - mn) / np.float32((1 << bits) - 1)
        if blend:
            for j in range(dim):
                a = out[j]
                out[j] = a + weight * (min(mn + np.float32(src[j]) * step, mx) - a)
        else:
            for j in range(dim):
                out[j] = min(mn + np.float32(src[j]) * step, mx)


@njit(cache=True, nogil=True)
def dequantize_serial(payload, bits_R, offsets_R, mins, maxs, out_RD, weight):
    """Reconstructs every row of float32 ``out_RD`` from ``payload``: ``x̂ = min(m + q·Δ, M)``,
    at one bit ``m`` or ``M``; one thread. With float32 ``weight`` other than 1, blends
    instead: ``out = out + weight·(x̂ - out)``, rounded after each operation (no fused
    multiply-add), which is :func:`adaqp.quant.mixed.blend_` bit for bit."""
    _dequantize_rows(payload, bits_R, offsets_R, mins, maxs, out_RD, weight, 0, out_RD.shape[0])


@njit(cache=True, nogil=True, parallel=True)
def dequantize_parallel(payload, bits_R, offsets_R, mins, maxs, out_RD, weight, chunks):
    """:func:`dequantize_serial` over ``chunks`` slices of rows on numba's threads."""
    rows = out_RD.shape[0]
    for c in prange(chunks):
        start, stop = c * rows // chunks, (c + 1) * rows // chunks
        _dequantize_rows(payload, bits_R, offsets_R, mins, maxs, out_RD, weight, start, stop)


@njit(cache=True, nogil=True)
def copy_repeats(first_R, bits_R, offsets_R, payload, mins, maxs, dim):
    """Row ``r`` with ``first_R[r] >= 0`` repeats row ``first_R[r]`` (same values, same width,
    quantized already): its codes, minimum and maximum are copied from there. A row that is
    sent to several peers is quantized once, and each peer gets the same codes."""
    for r in range(first_R.shape[0]):
        f = first_R[r]
        if f < 0:
            continue
        size, src, dst = (dim * bits_R[r] + 7) // 8, offsets_R[f], offsets_R[r]
        for i in range(size):
            payload[dst + i] = payload[src + i]
        mins[r], maxs[r] = mins[f], maxs[f]


@njit(cache=True, nogil=True)
def copy_metadata(payload, seg_starts, seg_rows, mins, maxs, to_payload):
    """Each segment's float32 row minima, then maxima, at its start ``seg_starts[s]`` in
    ``payload`` (the metadata of a :func:`~adaqp.quant.mixed.quantize_mixed` message per
    segment; segment ``s`` holds the next ``seg_rows[s]`` rows of ``mins``/``maxs``): written
    there from ``mins``/``maxs`` when ``to_payload``, else read from there into them."""
    lo, hi = mins.view(np.uint8), maxs.view(np.uint8)
    first = 0
    for s in range(seg_starts.shape[0]):
        size, base = 4 * seg_rows[s], seg_starts[s]
        for i in range(size):
            if to_payload:
                payload[base + i], payload[base + size + i] = lo[first + i], hi[first + i]
            else:
                lo[first + i], hi[first + i] = payload[base + i], payload[base + size + i]
        first += size


@njit(cache=True)
def _masked_scale_rows(x_RC, out_RC, seed, keys_R, threshold, scale, start, stop):
    """Rows ``start`` to ``stop`` of :func:`masked_scale_serial`."""
    words = np.zeros(x_RC.shape[1], np.uint32)
    row_key = np.zeros(2, np.uint32)  # through memory, as in _quantize_rows
    row_key64 = row_key.view(np.uint64)
    zero = np.float32(0.0)
    for r in range(start, stop):
        row_key64[0] = mix64(seed + (keys_R[r] + _ONE64) * _GAMMA)
        _fill_words(words, row_key[0], row_key[1])
        src, dst = x_RC[r], out_RC[r]
        for j in range(src.shape[0]):
            dst[j] = src[j] * (scale if np.int64(words[j]) >= threshold else zero)


@njit(cache=True, nogil=True)
def masked_scale_serial(x_RC, out_RC, seed, keys_R, threshold, scale):
    """Dropout's mask applied: ``out[r, j] = x[r, j]·scale`` where value ``(r, j)``'s 32-bit
    draw is at least ``threshold``, ``x[r, j]·0`` elsewhere (2-D float32); one thread. The
    draw is word ``j`` of row ``r``, keyed by (``seed``, ``keys_R[r]``) as the quantizer's."""
    _masked_scale_rows(x_RC, out_RC, seed, keys_R, threshold, scale, 0, x_RC.shape[0])


@njit(cache=True, nogil=True, parallel=True)
def masked_scale_parallel(x_RC, out_RC, seed, keys_R, threshold, scale, chunks):
    """:func:`masked_scale_serial` over ``chunks`` slices of rows on numba's threads."""
    rows = x_RC.shape[0]
    for c in prange(chunks):
        start, stop = c * rows // chunks, (c + 1) * rows // chunks
        _masked_scale_rows(x_RC, out_RC, seed, keys_R, threshold, scale, start, stop)


@njit(cache=True)
def layout(bits_R, dim, offsets_R):
    """Fills the payload offset of every row in the mixed layout (after the ``8·R`` bytes of
    metadata: widths ascending, original order within a width); returns the buffer's size,
    or -1 if a width is not 1, 2, 4 or 8."""
    rows = bits_R.shape[0]
    counts = np.zeros(9, np.int64)
    for r in range(rows):
        b = bits_R[r]
        if b != 1 and b != 2 and b != 4 and b != 8:
            return -1
        counts[b] += 1
    start = np.zeros(9, np.int64)
    offset = 8 * rows
    for b in (1, 2, 4, 8):
        start[b] = offset
        offset += counts[b] * ((dim * b + 7) // 8)
    for r in range(rows):
        b = bits_R[r]
        offsets_R[r] = start[b]
        start[b] += (dim * b + 7) // 8
    return offset
