"""Which GCN and SAGE layers transform their rows before aggregating them (standard
library only: the memory prediction reads it without loading torch).

``A (h W)`` is ``(A h) W``. Transforming first exchanges rows ``out_dim`` wide instead of
``in_dim``, and the layer keeps nothing for backward but its input, which it computes
again (``adaqp/model/transform.py``); aggregating first keeps the aggregated rows. But
transforming first transforms every input row, aggregating first only the rows the layer
outputs, which under ``train.compute_rows = "loss"`` may be half of them.
"""

from __future__ import annotations

MORE_ROWS = 1.1
"""A layer as wide out as in transforms first where its input rows are at most this many
times its output rows (at most 10% more dense work for the aggregated rows not kept)."""


def transforms_first(in_dim: int, out_dim: int, num_in: int, num_out: int) -> bool:
    """Whether a layer allowed to (``comm.transform_first``) transforms before aggregating:
    where that narrows the rows, or keeps their width on about as many rows
    (``MORE_ROWS``)."""
    if out_dim < in_dim:
        return True
    return out_dim == in_dim and num_in <= MORE_ROWS * num_out
