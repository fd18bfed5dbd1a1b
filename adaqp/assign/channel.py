"""What one exchange carries: its channels and what a row costs on the wire.

An exchange (one layer, one direction) is a set of channels ``p -> q`` that run
concurrently. A row of ``D`` values at ``b`` bits costs ``message_bytes(1, D, b)`` wire
bytes (packed codes + float32 min/max); at ``FULL_PRECISION_BITS`` (32) it is the float32
row itself, ``4 * D`` bytes with no metadata. The problem (:mod:`adaqp.assign.problem`)
and the cost models (:mod:`adaqp.assign.costmodels`) both build on these two facts, so
they live here, below both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adaqp.quant.bits import FULL_PRECISION_BITS, SUPPORTED_BITS
from adaqp.quant.pack import message_bytes


@dataclass(frozen=True, eq=False)
class Channel:
    """Messages from rank ``src`` to rank ``dst`` in one exchange.

    Attributes:
        src: sending rank.
        dst: receiving rank (``!= src``).
        weights: float64 ``[n]`` variance weights ``w_v >= 0``, in the channel's message order.
    """

    src: int
    dst: int
    weights: np.ndarray

    def __post_init__(self) -> None:
        w = np.array(self.weights, dtype=np.float64)
        if w.ndim != 1 or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("weights must be a 1-D array of finite non-negative values")
        if self.src == self.dst or min(self.src, self.dst) < 0:
            raise ValueError(f"invalid channel {self.src} -> {self.dst}")
        w.flags.writeable = False
        object.__setattr__(self, "weights", w)

    @property
    def num_messages(self) -> int:
        return int(self.weights.size)


def row_bytes_table(dim: int) -> np.ndarray:
    """Wire bytes of one row of ``dim`` values at each width, as a lookup table.

    Returns:
        int64 ``[FULL_PRECISION_BITS + 1]``: entry ``b`` is the bytes of one row at ``b``
        bits for every supported width and for full precision, 0 for widths that are not
        priced. Index it with an array of widths to price many rows at once.
    """
    table = np.zeros(FULL_PRECISION_BITS + 1, dtype=np.int64)
    for b in SUPPORTED_BITS:
        table[b] = message_bytes(1, dim, b)
    table[FULL_PRECISION_BITS] = 4 * dim  # float32 values, no metadata
    return table
