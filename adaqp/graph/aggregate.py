"""Sparse aggregation: CSR x dense with a precomputed transpose for the backward pass.

Autograd through ``torch.sparse.mm`` builds the gradient with slow generic sparse code;
multiplying the incoming gradient by a transpose prepared once is several times faster
(see ``python -m adaqp.bench aggregate``). The adjacency is a constant: no gradient
flows into its values.

An aggregation that is linear in its input rows says so by its type,
:class:`LinearAggregation` (the product, :data:`PRODUCT`, is one): the layers may then split
the adjacency by columns and add the parts (``adaqp/model/layers.py``).

Shapes: N rows (destinations), M columns (sources), D features.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from adaqp.quant.draws import edge_keys


@dataclass(frozen=True)
class SparseAdjacency:
    """A constant [N, M] sparse matrix in CSR form together with its [M, N] transpose, int32
    indices where they fit (:func:`index_dtype`). The transpose, which only backward reads,
    is built when first asked for: a matrix that only ever runs forward (evaluation's, or
    one cut into blocks) never holds one."""

    forward: torch.Tensor
    """CSR tensor [N, M]: row u holds the coefficients of u's in-edges."""
    given_transpose: torch.Tensor | None = field(default=None, repr=False)
    """The transpose where the maker had it; else ``transpose`` builds it once."""
    row_ids: np.ndarray | None = None
    """int64 [N]: the global id of each row's node; None: the row index (a whole graph)."""
    col_ids: np.ndarray | None = None
    """int64 [M]: the global id of each column's node; None: the column index."""

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.forward.shape)

    @property
    def transpose(self) -> torch.Tensor:
        """CSR tensor [M, N]: routes gradients back to the sources (built on first use)."""
        if self.given_transpose is not None:
            return self.given_transpose
        cached = self.__dict__.get("_transpose")
        if cached is None:
            crow = self.forward.crow_indices().cpu().numpy()
            cols = self.forward.col_indices().cpu().numpy()
            values = self.forward.values().cpu().numpy()
            num_rows, num_cols = self.shape
            rows = np.repeat(np.arange(num_rows, dtype=np.int64), np.diff(crow))
            # Sorting by (column, row) yields the transpose's CSR order directly.
            order = np.lexsort((rows, cols))
            t_indptr = np.zeros(num_cols + 1, dtype=np.int64)
            np.cumsum(np.bincount(cols, minlength=num_cols), out=t_indptr[1:])
            cached = csr_tensor(
                t_indptr, rows[order], values[order], (num_cols, num_rows), self.forward.device
            )
            self.__dict__["_transpose"] = cached  # frozen: the cache bypasses __setattr__
        return cached

    @classmethod
    def from_csr(
        cls,
        indptr: np.ndarray,
        indices: np.ndarray,
        values: np.ndarray,
        shape: tuple[int, int],
        device: torch.device | str = "cpu",
        row_ids: np.ndarray | None = None,
        col_ids: np.ndarray | None = None,
    ) -> SparseAdjacency:
        """The matrix of CSR arrays (integer indptr/indices, float32 values); ``row_ids``,
        ``col_ids``: the nodes' global ids (None: their indices)."""
        values = np.asarray(values, dtype=np.float32)
        forward = csr_tensor(indptr, indices, values, shape, device)
        return cls(forward, None, row_ids, col_ids)

    def edges(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(row, column, transpose_order)`` of every stored entry, int64 [E] each, in CSR
        order; ``transpose_order`` lists them in the transpose's order. Computed once."""
        cached = self.__dict__.get("_edges")
        if cached is None:
            crow = self.forward.crow_indices().long()
            rows = torch.repeat_interleave(
                torch.arange(self.shape[0], device=crow.device), crow.diff()
            )
            cols = self.forward.col_indices().long()
            # The transpose's entries sorted by (column, row), as ``from_csr`` orders them.
            order = torch.from_numpy(np.lexsort((rows.cpu().numpy(), cols.cpu().numpy())))
            cached = (rows, cols, order.to(crow.device))
            self.__dict__["_edges"] = cached  # frozen: the cache bypasses __setattr__
        return cached

    def edge_keys(self) -> np.ndarray:
        """uint64 [E]: ``(row's global id << 32) | column's global id`` of every stored entry,
        in CSR order (``adaqp.quant.draws.edge_keys``): what attention dropout keys an
        edge's weights by. Computed once."""
        cached = self.__dict__.get("_edge_keys")
        if cached is None:
            crow = self.forward.crow_indices().cpu().numpy()
            rows = np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(crow))
            cols = self.forward.col_indices().cpu().numpy()
            if self.row_ids is not None:
                rows = self.row_ids[rows]
            if self.col_ids is not None:
                cols = self.col_ids[cols]
            cached = edge_keys(rows, cols)
            self.__dict__["_edge_keys"] = cached  # frozen: the cache bypasses __setattr__
        return cached

    def count(self, rows: slice, cols: slice) -> int:
        """The number of stored entries in rows ``rows`` and columns ``cols`` (contiguous
        ranges). A host-device sync where the matrix is not on the CPU."""
        row_lo, row_hi, _ = rows.indices(self.shape[0])
        col_lo, col_hi, _ = cols.indices(self.shape[1])
        crow = self.forward.crow_indices()
        indices = self.forward.col_indices()[int(crow[row_lo]) : int(crow[row_hi])]
        return int(((indices >= col_lo) & (indices < col_hi)).sum())

    def row_prefix(self, num_rows: int, num_cols: int) -> SparseAdjacency:
        """The first ``num_rows`` rows as ``[num_rows, num_cols]``, sharing this matrix's
        arrays (no copy): those rows must read only the first ``num_cols`` columns."""
        crow = self.forward.crow_indices()[: num_rows + 1]
        end = int(crow[-1])
        forward = csr_tensor(
            crow,
            self.forward.col_indices()[:end],
            self.forward.values()[:end],
            (num_rows, num_cols),
            self.forward.device,
        )
        return SparseAdjacency(
            forward,
            None,
            None if self.row_ids is None else self.row_ids[:num_rows],
            None if self.col_ids is None else self.col_ids[:num_cols],
        )

    def row_slice(self, start: int, stop: int, num_cols: int | None = None) -> SparseAdjacency:
        """The block of rows start..stop (with its own transpose), [stop - start, M], or
        [stop - start, num_cols] when those rows are known to read only the first columns."""
        return self.block(slice(start, stop), slice(0, num_cols or self.shape[1]))

    def block(self, rows: slice, cols: slice) -> SparseAdjacency:
        """The sub-matrix of rows ``rows`` and columns ``cols`` (contiguous ranges, with its
        own transpose): entries outside the column range are dropped."""
        row_lo, row_hi, _ = rows.indices(self.shape[0])
        col_lo, col_hi, _ = cols.indices(self.shape[1])
        crow = self.forward.crow_indices().cpu().numpy()
        lo, hi = int(crow[row_lo]), int(crow[row_hi])
        indices = self.forward.col_indices()[lo:hi].cpu().numpy()
        values = self.forward.values()[lo:hi].cpu().numpy()
        keep = (indices >= col_lo) & (indices < col_hi)
        # Entries kept per row, from the running count of kept entries at each row's end.
        kept = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
        indptr = kept[crow[row_lo : row_hi + 1] - lo]
        return SparseAdjacency.from_csr(
            indptr,
            indices[keep] - col_lo,
            values[keep],
            (row_hi - row_lo, col_hi - col_lo),
            self.forward.device,
            None if self.row_ids is None else self.row_ids[row_lo:row_hi],
            None if self.col_ids is None else self.col_ids[col_lo:col_hi],
        )


def index_dtype(num_entries: int, shape: tuple[int, int]) -> torch.dtype:
    """int32 where every row pointer and column index fits (half the bytes of int64, and
    torch's CSR products give the same bits with either), else int64."""
    fits = max(num_entries, *shape) < 2**31
    return torch.int32 if fits else torch.int64


def csr_tensor(indptr, indices, values, shape, device=None) -> torch.Tensor:
    """A CSR tensor from arrays or tensors (values keep their dtype), unchecked; its
    indices are :func:`index_dtype`'s."""
    dtype = index_dtype(len(indices), shape)
    # The arrays come from our own validated builders; torch's per-tensor invariant
    # check would cost a pass over every index.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.as_tensor(indptr, dtype=dtype),
            torch.as_tensor(indices, dtype=dtype),
            torch.as_tensor(values),
            size=shape,
            device=device,
            check_invariants=False,
        )


def _product(matrix: torch.Tensor, x_MD: torch.Tensor) -> torch.Tensor:
    """``matrix @ x_MD`` (CSR times dense) in a new ``[N, D]`` tensor. ``torch.sparse.mm``
    on the CPU fills a zeroed result and a second one it copies in, twice the output's
    memory for a moment, and takes twice as long; ``addmm`` with ``beta = 0`` into an
    uninitialised result writes the same bits once."""
    out = x_MD.new_empty((matrix.shape[0], x_MD.shape[1]))
    return torch.addmm(out, matrix, x_MD, beta=0, out=out)


GradHand = Callable[[torch.Tensor], bool]
"""``hand(grad_MD) -> bool``: takes a product's input gradient to deliver it through another
node (True: the product returns none), or leaves it to autograd (False). The layers hand
the inner rows' gradient to the exchange, which adds the landed gradients into it where it
is (``adaqp/model/flight.py``): autograd would add a second gradient out of place."""


def _hand(hand: GradHand | None, grad_MD: torch.Tensor) -> torch.Tensor | None:
    return None if hand is not None and hand(grad_MD) else grad_MD


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, adjacency: SparseAdjacency, x_MD: torch.Tensor, hand) -> torch.Tensor:
        ctx.adjacency, ctx.hand = adjacency, hand
        return _product(adjacency.forward, x_MD)

    @staticmethod
    def backward(ctx, grad_ND: torch.Tensor):
        grad_MD = _product(ctx.adjacency.transpose, grad_ND.contiguous())
        return None, _hand(ctx.hand, grad_MD), None


def spmm(
    adjacency: SparseAdjacency, x_MD: torch.Tensor, hand: GradHand | None = None
) -> torch.Tensor:
    """Returns adjacency @ x_MD, shape [N, D], differentiable in x_MD (its gradient given to
    ``hand`` first, where one is given)."""
    if x_MD.shape[0] != adjacency.shape[1]:
        raise ValueError(
            f"spmm: adjacency has {adjacency.shape[1]} columns but x has {x_MD.shape[0]} rows"
        )
    return _SpMM.apply(adjacency, x_MD, hand)


class _AddSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out_ND, row_start: int, block: SparseAdjacency, x_MD, hand):
        ctx.row_start, ctx.block, ctx.hand = row_start, block, hand
        rows = out_ND[row_start:]
        if rows.is_contiguous():
            # Added where the rows are: the same bits as adding a separate product.
            torch.addmm(rows, block.forward, x_MD, out=rows)
        else:
            rows.add_(_product(block.forward, x_MD))
        ctx.mark_dirty(out_ND)
        return out_ND

    @staticmethod
    def backward(ctx, grad_ND: torch.Tensor):
        grad_rows = grad_ND[ctx.row_start :].contiguous()
        grad_MD = _product(ctx.block.transpose, grad_rows)
        return grad_ND, None, None, _hand(ctx.hand, grad_MD), None


def add_spmm_(
    out_ND: torch.Tensor,
    row_start: int,
    block: SparseAdjacency,
    x_MD: torch.Tensor,
    hand: GradHand | None = None,
):
    """Adds ``block @ x_MD`` to the rows ``row_start..`` of ``out_ND`` in place and returns
    ``out_ND``, differentiable in both (``block``: ``[N - row_start, M]``; ``hand``: see
    :data:`GradHand`)."""
    if block.shape != (out_ND.shape[0] - row_start, x_MD.shape[0]):
        raise ValueError(
            f"add_spmm_: a {tuple(block.shape)} block cannot add {x_MD.shape[0]} rows "
            f"into rows {row_start}..{out_ND.shape[0]}"
        )
    return _AddSpMM.apply(out_ND, row_start, block, x_MD, hand)


class LinearAggregation(ABC):
    """An in-neighbour aggregation linear in the rows it reads, summed over the adjacency's
    columns: over ``[A_1 | A_2]`` it gives ``A_1``'s aggregation of ``x_1`` plus ``A_2``'s of
    ``x_2``. A row's result reads only its own row of the block. Being of this type is the
    promise: the layers then aggregate the inner columns while the halo rows travel and add
    the halo columns' part once they land, with the dense transform once over all rows.
    An aggregation without the promise (GAT's attention, whose softmax spans every in-edge
    of a row) is a plain callable and is split by rows instead."""

    @abstractmethod
    def __call__(self, block: SparseAdjacency, x_MD: torch.Tensor, rows: slice) -> torch.Tensor:
        """``[X, D]``: the aggregation over ``block`` ``[X, M]`` of the inner rows ``rows``
        (a slice of 0..I, the block's rows)."""

    def add_(
        self,
        out_ND: torch.Tensor,
        row_start: int,
        block: SparseAdjacency,
        x_MD: torch.Tensor,
        rows: slice,
    ) -> torch.Tensor:
        """``out_ND`` with ``block``'s aggregation of ``x_MD`` added to its rows
        ``row_start..`` (``rows``: those rows, as in ``__call__``). This default makes a new
        tensor; an aggregation that can add in place overrides it."""
        added = self(block, x_MD, rows)
        return torch.cat([out_ND[:row_start], out_ND[row_start:] + added])


class Product(LinearAggregation):
    """``block @ x``: the adjacency's coefficients are the aggregation (GCN's, SAGE's)."""

    def __call__(self, block: SparseAdjacency, x_MD: torch.Tensor, rows: slice) -> torch.Tensor:
        return spmm(block, x_MD)

    def add_(
        self,
        out_ND: torch.Tensor,
        row_start: int,
        block: SparseAdjacency,
        x_MD: torch.Tensor,
        rows: slice,
    ) -> torch.Tensor:
        """Adds in place (``add_spmm_``): no row of ``out_ND`` is copied."""
        return add_spmm_(out_ND, row_start, block, x_MD)


PRODUCT = Product()
"""The default aggregation of ``adaqp.model.layers.Propagation``."""
