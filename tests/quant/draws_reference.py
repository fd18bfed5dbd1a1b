"""The compiled quantizer's draws and codes stated again in plain numpy, outside the
project's code path (adaqp/quant/compiled.py and adaqp/quant/draws.py state them in their
docstrings): SplitMix64 row keys, the keyed lowbias32 words, the 16-bit lanes and the
rounding ``(rint(s) + u) >> 16``. The tests compare the kernels' output against these.
"""

from __future__ import annotations

import numpy as np
import torch

GAMMA = np.uint64(0x9E3779B97F4A7C15)
"""SplitMix64's increment: row r's key is the mix of ``seed + (r + 1)·GAMMA``."""


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (uint64 arrays)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def lowbias32_keyed(z: np.ndarray, high: np.ndarray) -> np.ndarray:
    """lowbias32 with ``high`` xored in after its first multiply (uint32 arrays)."""
    z = z ^ (z >> np.uint32(16))
    z = (z * np.uint32(0x7FEB352D)) ^ high
    z = z ^ (z >> np.uint32(15))
    z = z * np.uint32(0x846CA68B)
    return z ^ (z >> np.uint32(16))


def draws(seed: np.uint64, rows: int, dim: int) -> np.ndarray:
    """uint32 ``[R, D]`` 16-bit draws as adaqp/quant/compiled.py states them: row r's key is
    SplitMix64 output r + 1, value (r, j) takes lane j % 2 of the keyed lowbias32 of
    low32(key) + (j // 2)·0x9E3779B9, keyed by high32(key)."""
    r = np.arange(rows, dtype=np.uint64)[:, None]
    j = np.arange(dim, dtype=np.uint32)[None, :]
    with np.errstate(over="ignore"):
        key = mix64(seed + (r + np.uint64(1)) * GAMMA)
        low = (key & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        high = (key >> np.uint64(32)).astype(np.uint32)
        words = lowbias32_keyed(low + (j // np.uint32(2)) * np.uint32(0x9E3779B9), high)
    return (words >> (np.uint32(16) * (j % np.uint32(2)))) & np.uint32(0xFFFF)


def round_codes(scaled: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The stated rounding: ``(rint(s) + u) >> 16`` with ``s = 2**16·t`` (float32, clamped)
    and ``u`` the 16-bit draws."""
    rho = np.rint(scaled).astype(np.int64)
    return (rho + u.astype(np.int64)) >> 16


def codes(x: torch.Tensor, bits_r: torch.Tensor, seed: np.uint64) -> np.ndarray:
    """The codes the compiled path must send for rows ``x`` at widths ``bits_r``:
    ``s = min((x - m)·(2**16 / Δ), 2**16·L)``, or ``(x - m) / Δ·2**16`` where ``2**16 / Δ``
    overflows."""
    x = x.numpy()
    levels = (2 ** bits_r.numpy().astype(np.int64) - 1).astype(np.float32)[:, None]
    m, big = x.min(1, keepdims=True), x.max(1, keepdims=True)
    step = (big - m) / levels
    safe = np.where(step > 0, step, np.float32(1))
    with np.errstate(over="ignore"):
        scale = np.float32(2**16) / safe
    product = (x - m) * np.where(np.isfinite(scale), scale, np.float32(0))
    quotient = (x - m) / safe * np.float32(2**16)
    scaled = np.where(np.isfinite(scale), product, quotient)
    return round_codes(np.minimum(scaled, levels * np.float32(2**16)), draws(seed, *x.shape))
