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
partition's send list (``send_keep``) and of the halo (``halo_keep``), ascending positions
in the partition's order, not in general a prefix of a peer's segment. The two sides
agree because the sender's subset is the receiver's, told with the layer's flag exchange
at start-up (``layer_rows``; ``HaloTransport.select``), and a layer says when its
exchange moves it (``selected``): evaluation computes and moves every row.

Shapes: I inner rows, H halo rows, S rows sent, O a layer's output rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from adaqp.graph.aggregate import SparseAdjacency
from adaqp.graph.local import LocalGraph


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


def mark_reads(
    indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray, inner: np.ndarray, halo: np.ndarray
) -> None:
    """Marks what the rows flagged in ``rows`` (bool [R]) read through their in-edges:
    their inner in-neighbours in ``inner`` (bool [I]) and their halo ones in ``halo``
    (bool [H]), in place. ``indptr`` ([R + 1], offsets into ``indices``, which may start
    anywhere: R rows of a larger CSR) and ``indices`` (local ids: inner below I, halo
    from I on) are those rows' in-edges. One rank's step of ``rings`` before its flag
    exchange; ``adaqp/memory/layer_rows.py`` takes it a block of rows at a time."""
    read = indices[np.repeat(rows, np.diff(indptr))]  # only the edges read: int32 mostly
    from_halo = read >= inner.size
    halo[read[from_halo] - inner.size] = True
    inner[read[~from_halo]] = True


def rings(graph: LocalGraph, num_layers: int, exchange: ExchangeFlags) -> np.ndarray:
    """int64 [I]: each inner row's ring, the number of layers, counted from the last, whose
    output reads it (0: a training row; ``num_layers``: no layer of a training step needs it).

    Collective: every rank calls it, with ``exchange`` moving flags between the ranks."""
    send_idx = graph.send_idx.cpu().numpy()
    ring = np.full(graph.num_inner, num_layers, dtype=np.int64)
    needed = graph.train_mask.cpu().numpy().astype(bool)
    if needed.ndim > 1:  # a multilabel mask is per node all the same
        needed = needed.any(1)
    ring[needed] = 0
    for depth in range(1, num_layers):
        # The layer below the one whose output rows are ``needed`` must compute those,
        # their inner in-neighbours, and the rows its peers read as halo.
        below = needed.copy()
        halo = np.zeros(graph.num_halo, dtype=bool)
        mark_reads(graph.indptr, graph.indices, needed, below, halo)
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
    out: list[LayerRows] = []
    for layer in range(num_layers):
        num_out = int(np.searchsorted(ring, num_layers - layer))  # rings 0..L-1-layer
        num_in = num_inner if layer == 0 else out[-1].num_out
        if layer == 0 and cached_input:
            # Layer 0's halo rows arrived once with the features: every column, no exchange.
            central = min(graph.num_central, num_out)
            out.append(LayerRows(num_out, num_in, central, graph.num_halo, graph.send_idx))
            continue
        reads = graph.indices[: graph.indptr[num_out]]
        halo = np.zeros(graph.num_halo, dtype=bool)
        halo[reads[reads >= num_inner] - num_inner] = True
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
    renumbered after them in arrival order: ``[O, num_in + H_l]``. Where no column moves
    (no halo, or every halo row after every inner one) it shares ``adjacency``'s arrays."""
    num_halo = adjacency.shape[1] - num_inner
    if num_halo == 0 or (rows.halo_keep is None and rows.num_in == num_inner):
        return adjacency.row_prefix(rows.num_out, rows.num_in + num_halo)
    return _renumbered(adjacency.row_prefix(rows.num_out, adjacency.shape[1]), rows, num_inner)


def layer_blocks(
    blocks: tuple[SparseAdjacency, SparseAdjacency], rows: LayerRows, num_central: int
) -> tuple[SparseAdjacency, SparseAdjacency]:
    """A linear aggregation's column blocks (``Propagation.column_blocks``: the whole
    graph's ``[I, I]`` inner block and its marginal rows' ``[I - C, H]`` halo block) cut to
    ``rows``: ``[O, num_in]`` (sharing the inner block's arrays) and ``[O - C_l, H_l]``."""
    inner, halo = blocks
    marginal = max(rows.num_out - num_central, 0)
    halo_rows = halo.row_prefix(marginal, halo.shape[1])
    if rows.halo_keep is not None:
        halo_rows = _renumbered(halo_rows, rows, 0, num_in=0)
    return inner.row_prefix(rows.num_out, rows.num_in), halo_rows


def _renumbered(
    matrix: SparseAdjacency, rows: LayerRows, num_inner: int, num_in: int | None = None
) -> SparseAdjacency:
    """``matrix``'s columns: the first ``num_in`` (default ``rows.num_in``) kept, the halo
    columns (from ``num_inner`` on) of ``rows.halo_keep`` renumbered after them in order."""
    num_in = rows.num_in if num_in is None else num_in
    forward = matrix.forward
    cols = forward.col_indices().cpu().numpy().astype(np.int64)
    num_halo_cols = matrix.shape[1] - num_inner
    halo_keep = np.arange(num_halo_cols) if rows.halo_keep is None else rows.halo_keep
    new_col = np.full(matrix.shape[1], -1, dtype=np.int64)
    new_col[:num_in] = np.arange(num_in)
    new_col[num_inner + halo_keep] = num_in + np.arange(halo_keep.size)
    cols = new_col[cols]
    if cols.size and cols.min() < 0:
        raise RuntimeError("a layer's rows read a column its input does not hold")
    col_ids = None
    if matrix.col_ids is not None:
        col_ids = np.concatenate([matrix.col_ids[:num_in], matrix.col_ids[num_inner + halo_keep]])
    return SparseAdjacency.from_csr(
        forward.crow_indices().cpu().numpy(),
        cols,
        forward.values().cpu().numpy(),
        (matrix.shape[0], num_in + halo_keep.size),
        forward.device,
        row_ids=matrix.row_ids,
        col_ids=col_ids,
    )
