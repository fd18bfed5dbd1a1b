"""Counter-based random draws keyed by what they are drawn for, not by where.

Every random number training draws (the dropout masks, GAT's attention dropout, the
stochastic rounding of exchanged rows) is a hash of three things:

* a **base key** naming the call: :func:`draw_key` hashes the seed, the epoch, the layer
  and the kind of draw (:class:`Draw`) with SplitMix64's finaliser ``mix64``. Every rank
  computes it from the same numbers; no generator is involved;
* a **row key** naming the row by its global identity: the node's global id (a row of
  features or activations, a halo row, an exchanged row), or for attention weights the
  edge's ``(destination << 32) | source`` of global ids (:func:`edge_keys`). A plain call
  with no identity uses the row's index;
* the **column**.

Row ``r`` with key ``k`` takes ``K = mix64(base + (k + 1)·γ mod 2**64)`` (output ``k + 1``
of SplitMix64 seeded with the base key, ``γ = 0x9E3779B97F4A7C15``), split into 32-bit
halves ``a`` (low) and ``b`` (high). Word ``w`` of the row is the keyed lowbias32
``h_b(a + w·0x9E3779B9 mod 2**32)`` (its steps in :mod:`adaqp.quant.compiled`, which states
the draw exactly). Dropout takes word ``j`` for value ``j``; the quantizer takes the 16-bit
lane ``j mod 2`` of word ``j // 2``.

A value's draw therefore depends on (base key, row key, column) alone: not on the rank that
computes it, the rows' order, the partition, the thread count or a generator's state. P
workers drop exactly the values one process drops on the whole graph (Vanilla stays exact
with dropout on), a halo row is dropped as its owner drops it, and nothing needs saving to
replay the draws on resume.

This module is numpy and torch operators: :class:`RowKeys`, and the torch path's draws
(any device; the same bits as the compiled kernels of :mod:`adaqp.quant.compiled`).

Shapes: R rows, C columns (values a row), W words a row.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_G32, _H1, _H2 = 0x9E3779B9, 0x7FEB352D, 0x846CA68B


class Draw(enum.IntEnum):
    """The kind of draw a base key is for (one of its hashed parts)."""

    DROPOUT = 1
    """A layer's input dropout, rows keyed by node."""
    ATTENTION = 2
    """GAT's attention dropout, rows keyed by edge."""
    FORWARD = 3
    """Stochastic rounding of a forward exchange's rows (keyed by the node sent)."""
    BACKWARD = 4
    """Stochastic rounding of a backward exchange's gradient rows (keyed by the halo node,
    the sending rank hashed into the base key)."""


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def draw_key(seed: int, *parts: int) -> np.uint64:
    """The base key of one call: ``seed`` and then each of ``parts`` (epoch, layer,
    :class:`Draw`, ...) hashed in turn, ``z <- mix64((z xor part) + γ)`` from
    ``mix64(seed + γ)`` (integers taken modulo ``2**64``)."""
    z = _mix64((seed + _GAMMA) & _MASK64)
    for part in parts:
        z = _mix64(((z ^ (part & _MASK64)) + _GAMMA) & _MASK64)
    return np.uint64(z)


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over a uint64 array (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(_MIX1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def edge_keys(dst_ids: np.ndarray, src_ids: np.ndarray) -> np.ndarray:
    """uint64 ``(dst << 32) | src`` of every edge: distinct for distinct edges of a graph
    with fewer than ``2**32`` nodes (global ids)."""
    dst = np.asarray(dst_ids, dtype=np.int64)
    src = np.asarray(src_ids, dtype=np.int64)
    for ids in (dst, src):
        if ids.size and (ids.min() < 0 or ids.max() > _MASK32):
            raise ValueError("edge keys need node ids in [0, 2**32)")
    return (dst.astype(np.uint64) << np.uint64(32)) | src.astype(np.uint64)


@dataclass(frozen=True, eq=False)
class RowKeys:
    """The keys of one call's draws: a base key and one key per row."""

    base: np.uint64
    """The call's base key (:func:`draw_key`)."""
    rows: np.ndarray
    """uint64 [R]: each row's key (a global id, an edge key, or its index)."""

    @classmethod
    def of(cls, base: np.uint64 | int, ids: np.ndarray | None = None, count: int = 0) -> RowKeys:
        """Rows keyed by ``ids`` (non-negative integers), or by their index ``0..count-1``."""
        if ids is None:
            ids = np.arange(count, dtype=np.uint64)
        return cls(np.uint64(base), np.ascontiguousarray(ids, dtype=np.uint64))

    def __len__(self) -> int:
        return self.rows.shape[0]

    def take(self, index) -> RowKeys:
        """The keys of the rows ``index`` (a numpy index or mask)."""
        return RowKeys(self.base, np.ascontiguousarray(self.rows[index]))

    def split(self, counts: list[int]) -> list[RowKeys]:
        """The keys of consecutive runs of ``counts[s]`` rows."""
        bounds = np.cumsum([0, *counts])
        return [self.take(slice(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]

    def mixed(self) -> np.ndarray:
        """uint64 [R]: ``K = mix64(base + (k + 1)·γ)`` of every row."""
        with np.errstate(over="ignore"):
            return mix64(self.base + (self.rows + np.uint64(1)) * np.uint64(_GAMMA))


def fresh_keys(count: int) -> RowKeys:
    """Keys for a plain call that names none: rows keyed by their index ``0..count-1`` under
    a base key drawn from torch's default CPU generator (so ``torch.manual_seed`` replays
    it). Training always passes keys; a generator of its own would be a second way to the
    same draws."""
    base = torch.empty((), dtype=torch.int64).random_(-(2**63), None).item()
    return RowKeys.of(np.int64(base).view(np.uint64), count=count)


def row_keys(keys: RowKeys | None, count: int) -> RowKeys:
    """``keys`` checked against the ``count`` rows they key, or :func:`fresh_keys`."""
    if keys is None:
        return fresh_keys(count)
    if len(keys) != count:
        raise ValueError(f"{len(keys)} row keys for {count} rows")
    return keys


def _signed32(value: int) -> int:
    """The int32 whose bits are ``value``'s low 32 bits."""
    value &= _MASK32
    return value - (1 << 32) if value >> 31 else value


def _low_int32(values: Tensor) -> Tensor:
    """int32: the bits of int64 ``values``' low 32 bits (``_signed32`` of a tensor)."""
    return (((values & _MASK32) ^ (1 << 31)) - (1 << 31)).to(torch.int32)


def _words32(keys: RowKeys, count: int, device: torch.device | str) -> Tensor:
    """int32 ``[R, count]``: the bits of :func:`words`. int32 tensors wrap on overflow (two's
    complement, as the compiled kernels' uint32 do); a right shift sign-extends, so each
    shift is masked to a logical one. Half the memory of int64 words and no split multiply:
    several times faster (tests/quant/test_draws.py ties it to a numpy statement)."""
    mixed = torch.from_numpy(keys.mixed().view(np.int64)).to(device)
    steps = torch.arange(count, dtype=torch.int64, device=device) * _G32
    z = _low_int32(mixed)[:, None] + _low_int32(steps)
    z ^= (z >> 16) & 0xFFFF
    z *= _signed32(_H1)
    z ^= _low_int32(mixed >> 32)[:, None]
    z ^= (z >> 15) & 0x1FFFF
    z *= _signed32(_H2)
    z ^= (z >> 16) & 0xFFFF
    return z


def words(keys: RowKeys, count: int, device: torch.device | str = "cpu") -> Tensor:
    """int64 ``[R, count]``: words ``0..count-1`` of every row, each in ``[0, 2**32)``
    (torch operators on ``device``; the compiled kernels' words bit for bit)."""
    return _words32(keys, count, device).to(torch.int64) & _MASK32


def keep_mask(keys: RowKeys, cols: int, threshold: int, device="cpu") -> Tensor:
    """bool ``[R, cols]``: dropout keeps value ``(r, j)``, its 32-bit draw (word ``j``) at
    least ``threshold``."""
    return words(keys, cols, device) >= threshold


def lanes16(keys: RowKeys, cols: int, device="cpu") -> Tensor:
    """int32 ``[R, cols]``: the quantizer's 16-bit draws, lane ``j mod 2`` (low half first)
    of word ``j // 2``."""
    w = words(keys, (cols + 1) // 2, device)
    pairs = torch.stack([w & 0xFFFF, w >> 16], dim=-1).view(w.shape[0], -1)
    return pairs[:, :cols].to(torch.int32)


def centred_lanes16(keys: RowKeys, cols: int, device="cpu") -> Tensor:
    """int16 ``[R, cols]`` (a view, strided where ``cols`` is odd): :func:`lanes16` less
    ``2**15``, the quantizer's draws as the torch path adds them (the words' bits read in
    place as 16-bit lanes, the top bit of each lane flipped)."""
    w = _words32(keys, (cols + 1) // 2, device)
    if sys.byteorder != "little":  # an int16 view would read the high lane first
        return (lanes16(keys, cols, device) - (1 << 15)).to(torch.int16)
    w ^= _signed32(0x80008000)  # u xor 2**15 read as int16 is u - 2**15
    return w.view(torch.int16)[:, :cols]
