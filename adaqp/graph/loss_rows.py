"""The rows a training step computes: only those the loss reads (``train.compute_rows``).

The loss reads the last layer's output at the training nodes. With L layers, layer ``l``
must compute the rows within L - 1 - l hops of a training node: the last layer the
training rows, each earlier one the rows the next reads (in-neighbours, its own rows for
the root or self term, and the rows its peers read as halo). Every other row is computed
and thrown away by a full step; leaving it out changes no value the loss reads, so
training stays exact (tests/run/test_exact_loss_rows.py).

The sets are nested (a layer reads its own output rows), so they are worked out once at
start-up, from the last layer down, with one exchange of flags per layer: each rank tells
the owners which of their rows its next layer reads. The inner nodes are then ordered by
*ring*, the earliest layer that does not need them (training rows first), and within a
ring central before marginal, so that every layer's output rows are a prefix of the inner
order and its input rows the previous layer's prefix: the model runs unchanged, each
layer on fewer rows, and the dropout masks, keyed by global ids, stay the same.

A layer's exchange moves only the halo rows its rows read: per layer, a subset of the
partition's send list (``send_keep``) and of the halo (``halo_keep``), each a prefix of
every peer's segment in the partition's order, so the two sides agree without a word
(``HaloTransport.select``). Evaluation still computes every row.

Shapes: I inner rows, H halo rows, S rows sent, O a layer's output rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from adaqp.graph.aggregate import SparseAdjacency
from adaqp.graph.local import LocalGraph

COMPUTE_ROWS = ("loss", "all")
"""``train.compute_rows``: the rows the loss reads (default), or every row."""


@dataclass(frozen=True)
class LayerRows:
    """The rows one layer reads and writes, in the local inner order (a prefix each).

    For the whole graph: ``num_out = num_in = I``, every halo row, every sent row."""

    num_out: int
    """Output rows: the first ``num_out`` inner rows."""
    num_in: int
    """Inner input rows: the first ``num_in`` (the previous layer's output rows)."""
    num_central: int
    """Leading output rows that read no halo row (aggregated while the exchange travels)."""
    num_halo: int
    """Halo rows read, appended after the inner input rows in arrival order."""
    send_idx: torch.Tensor
    """int64 [S_l]: the inner input rows sent to the peers, peer by peer."""
    send_keep: np.ndarray | None = None
    """int64 [S_l]: which rows of the partition's send list are sent (None: all)."""
    halo_keep: np.ndarray | None = None
    """int64 [H_l]: which halo rows are received (None: all)."""

    @classmethod
    def whole(cls, graph: LocalGraph) -> LayerRows:
        """Every row: what evaluation computes (and training with ``compute_rows = "all"``)."""
        return cls(
            graph.num_inner, graph.num_inner, graph.num_central, graph.num_halo, graph.send_idx
        )


ExchangeFlags = Callable[[np.ndarray], np.ndarray]
"""``exchange(halo_flags_H) -> send_flags_S``: every rank's flags on its halo rows, to their
owners; returns the flags peers set on this rank's send list (a collective)."""


def rings(graph: LocalGraph, num_layers: int, exchange: ExchangeFlags) -> np.ndarray:
    """int64 [I]: each inner row's ring, the number of layers, counted from the last, whose
    output reads it (0: a training row; ``num_layers``: no layer of a training step needs it).

    Collective: every rank calls it, with ``exchange`` moving flags between the ranks."""
    num_inner = graph.num_inner
    rows = np.repeat(np.arange(num_inner, dtype=np.int64), np.diff(graph.indptr))
    cols = graph.indices.astype(np.int64, copy=False)
    inner_edge = cols < num_inner
    send_idx = graph.send_idx.cpu().numpy()
    ring = np.full(num_inner, num_layers, dtype=np.int64)
    needed = graph.train_mask.cpu().numpy().astype(bool)
    if needed.ndim > 1:  # a multilabel mask is per node all the same
        needed = needed.any(1)
    ring[needed] = 0
    for depth in range(1, num_layers):
        # The layer below the one whose output rows are ``needed`` must compute those,
        # their inner in-neighbours, and the rows its peers read as halo.
        reads = needed[rows]
        halo = np.zeros(graph.num_halo, dtype=bool)
        halo[cols[reads & ~inner_edge] - num_inner] = True
        below = needed.copy()
        below[cols[reads & inner_edge]] = True
        below[send_idx[exchange(halo)]] = True
        ring[below & ~needed] = depth
        needed = below
    return ring


def order_by_ring(graph: LocalGraph, ring: np.ndarray) -> np.ndarray:
    """int64 [I]: the new inner order (new position -> old local id): by ring, and within
    a ring central rows first, each stably (ascending global ids within a class, as
    ``LocalGraph.from_part`` orders them)."""
    marginal = np.arange(graph.num_inner) >= graph.num_central
    return np.lexsort((marginal, ring)).astype(np.int64)


def layer_rows(
    graph: LocalGraph,
    ring: np.ndarray,
    num_layers: int,
    cached_input: bool,
    exchange: ExchangeFlags,
) -> list[LayerRows]:
    """Each layer's rows on ``graph``, whose inner rows are ordered by ``order_by_ring``
    (``ring`` in that order, so non-decreasing; ``graph.num_central`` the leading rows
    that read no halo row, as ``LocalGraph.reordered`` counts them). Collective, as
    ``rings``."""
    num_inner = graph.num_inner
    send_idx = graph.send_idx.cpu().numpy()
    halo_cols = graph.indices.astype(np.int64, copy=False) - num_inner
    out: list[LayerRows] = []
    for layer in range(num_layers):
        num_out = int(np.searchsorted(ring, num_layers - layer))  # rings 0..L-1-layer
        num_in = num_inner if layer == 0 else out[-1].num_out
        if layer == 0 and cached_input:
            # Layer 0's halo rows arrived once with the features: every column, no exchange.
            central = min(graph.num_central, num_out)
            out.append(LayerRows(num_out, num_in, central, graph.num_halo, graph.send_idx))
            continue
        reads = halo_cols[: graph.indptr[num_out]]
        halo = np.zeros(graph.num_halo, dtype=bool)
        halo[reads[reads >= 0]] = True
        sent = exchange(halo)
        send_keep = np.flatnonzero(sent)
        if send_keep.size and send_idx[send_keep].max() >= num_in:
            raise RuntimeError(
                f"rank {graph.rank}: layer {layer} must send rows its input does not hold "
                "(the rings disagree between ranks)"
            )
        out.append(
            LayerRows(
                num_out=num_out,
                num_in=num_in,
                num_central=min(graph.num_central, num_out),
                num_halo=int(halo.sum()),
                send_idx=torch.from_numpy(send_idx[send_keep]).to(graph.device),
                send_keep=send_keep,
                halo_keep=np.flatnonzero(halo),
            )
        )
    return out


def layer_adjacency(adjacency: SparseAdjacency, rows: LayerRows, num_inner: int) -> SparseAdjacency:
    """``adjacency`` ([I, I + H], every row) cut to ``rows``: its first ``num_out`` rows,
    the inner columns kept where they are (all below ``num_in``) and the halo columns read
    renumbered after them in arrival order: ``[O, num_in + H_l]``."""
    if rows.num_out == adjacency.shape[0] and rows.halo_keep is None and (rows.num_in == num_inner):
        return adjacency
    forward = adjacency.forward
    crow = forward.crow_indices().cpu().numpy()
    end = int(crow[rows.num_out])
    cols = forward.col_indices()[:end].cpu().numpy().astype(np.int64)
    values = forward.values()[:end].cpu().numpy()
    num_halo_cols = adjacency.shape[1] - num_inner
    new_col = np.full(num_inner + num_halo_cols, -1, dtype=np.int64)
    new_col[: rows.num_in] = np.arange(rows.num_in)
    halo_keep = np.arange(num_halo_cols) if rows.halo_keep is None else rows.halo_keep
    new_col[num_inner + halo_keep] = rows.num_in + np.arange(halo_keep.size)
    cols = new_col[cols]
    if cols.size and cols.min() < 0:
        raise RuntimeError("a layer's rows read a column its input does not hold")
    col_ids = None
    if adjacency.col_ids is not None:
        col_ids = np.concatenate(
            [adjacency.col_ids[: rows.num_in], adjacency.col_ids[num_inner + halo_keep]]
        )
    return SparseAdjacency.from_csr(
        crow[: rows.num_out + 1],
        cols,
        values,
        (rows.num_out, rows.num_in + halo_keep.size),
        forward.device,
        row_ids=None if adjacency.row_ids is None else adjacency.row_ids[: rows.num_out],
        col_ids=col_ids,
    )
