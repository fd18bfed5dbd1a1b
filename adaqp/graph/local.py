"""One worker's view of the graph: inner nodes (central, then marginal) and halo nodes.

Local ids: inner nodes 0..I-1 with the C *central* ones (no halo in-neighbour) first and
the *marginal* ones after; halo nodes I..I+H-1 in the order the partition stores them
(by owner, then owner-local id), which is the order rows arrive from the peers.
Central rows can be aggregated before the halo exchange lands (overlap).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from adaqp.graph.aggregate import SparseAdjacency
from adaqp.partitioning.schema import Part

NORMS = ("gcn", "mean", "gat")

_REORDER_BLOCK = 1 << 22
"""Entries ``LocalGraph.reorder`` rebuilds at a time (a few tens of MB of temporaries)."""


def _id_dtype(num_local: int) -> type[np.integer]:
    """The narrowest of int32 and int64 that holds ``num_local`` local ids: the local CSR is
    the largest array a worker holds after the activations."""
    return np.int32 if num_local < 2**31 else np.int64


@dataclass
class LocalGraph:
    """Tensors of one part, reordered central-first, on the compute device."""

    rank: int
    num_parts: int
    num_inner: int
    num_halo: int
    num_central: int
    global_ids: np.ndarray
    """int64 [I]: global id of each inner node (local order)."""
    halo_global_ids: np.ndarray
    """int64 [H]: global id of each halo node."""
    indptr: np.ndarray
    """int64 [I+1]: CSR of in-edges over local ids (no self-loops)."""
    indices: np.ndarray
    """int32 [E] (int64 from 2**31 local nodes on): local source ids, inner or halo."""
    in_degree: np.ndarray
    """int64 [I + H]: global in-degree of every local node (no self-loop)."""
    features: torch.Tensor
    """float32 [I, F]."""
    labels: torch.Tensor
    """int64 [I] (float32 [I, C] if multilabel)."""
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    send_idx: torch.Tensor
    """int64 [S]: local inner ids sent to the peers, peer by peer in rank order."""
    send_counts: list[int]
    recv_counts: list[int]

    @classmethod
    def from_part(cls, part: Part, device: torch.device | str = "cpu") -> LocalGraph:
        num_inner, num_halo = part.num_inner, part.num_halo
        old_indptr, old_indices = part.indptr, part.indices
        rows = np.repeat(np.arange(num_inner, dtype=np.int64), np.diff(old_indptr))
        has_halo = np.zeros(num_inner, dtype=bool)
        has_halo[rows[old_indices >= num_inner]] = True
        # Stable order keeps ascending global ids inside each class (deterministic).
        new_to_old = np.concatenate([np.flatnonzero(~has_halo), np.flatnonzero(has_halo)])
        old_to_new = np.empty(num_inner + num_halo, dtype=np.int64)
        old_to_new[new_to_old] = np.arange(num_inner, dtype=np.int64)
        old_to_new[num_inner:] = np.arange(num_inner, num_inner + num_halo, dtype=np.int64)

        new_rows = old_to_new[rows]
        new_cols = old_to_new[old_indices]
        order = np.lexsort((new_cols, new_rows))
        indptr = np.zeros(num_inner + 1, dtype=np.int64)
        np.cumsum(np.bincount(new_rows, minlength=num_inner), out=indptr[1:])

        def tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array[new_to_old])).to(device)

        return cls(
            rank=part.rank,
            num_parts=part.num_parts,
            num_inner=num_inner,
            num_halo=num_halo,
            num_central=int((~has_halo).sum()),
            global_ids=part.global_ids[new_to_old],
            halo_global_ids=part.halo_global_ids,
            indptr=indptr,
            indices=new_cols[order].astype(_id_dtype(num_inner + num_halo)),
            in_degree=np.concatenate([part.in_degree[new_to_old], part.halo_degree]),
            # A part may keep float16 features (adaqp.partitioning.schema); the model
            # computes in float32, converted here on the device (half the transfer).
            features=tensor(part.features).float(),
            labels=tensor(part.labels),
            train_mask=tensor(part.train_mask),
            val_mask=tensor(part.val_mask),
            test_mask=tensor(part.test_mask),
            send_idx=torch.from_numpy(old_to_new[part.send_idx]).to(device),
            send_counts=[int(c) for c in part.send_counts],
            recv_counts=[int(c) for c in part.recv_counts],
        )

    def reorder(self, new_to_old: np.ndarray) -> None:
        """Puts the inner rows in the order ``new_to_old`` (new position -> old local id),
        in place; the halo rows keep theirs. ``num_central`` becomes the number of leading
        rows that read no halo row: an order that is not central-first
        (``adaqp/graph/loss_rows.py``) overlaps only those. The CSR is rebuilt a block of
        rows at a time, so its temporaries stay small beside the graph."""
        num_inner, num_local = self.num_inner, self.num_inner + self.num_halo
        old_to_new = np.arange(num_local, dtype=self.indices.dtype)
        old_to_new[new_to_old] = np.arange(num_inner, dtype=self.indices.dtype)
        counts = np.diff(self.indptr)[new_to_old]
        indptr = np.zeros(num_inner + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        indices = np.empty_like(self.indices)
        first_halo_row = num_inner
        step = max(1, num_inner * _REORDER_BLOCK // max(int(indptr[-1]), 1))
        for lo in range(0, num_inner, step):
            hi = min(lo + step, num_inner)
            start, stop = int(indptr[lo]), int(indptr[hi])
            # Each new row's entries, from its old row: columns renumbered, then sorted by
            # (row, column) as one int64 key.
            where = np.repeat(self.indptr[new_to_old[lo:hi]] - indptr[lo:hi], counts[lo:hi])
            where += np.arange(start, stop, dtype=np.int64)
            key = np.repeat(np.arange(lo, hi, dtype=np.int64), counts[lo:hi]) * num_local
            key += old_to_new[self.indices[where]]
            key.sort()
            cols = key % num_local
            indices[start:stop] = cols
            halo_at = np.flatnonzero(cols >= num_inner)
            if halo_at.size and first_halo_row == num_inner:
                first_halo_row = int(key[halo_at[0]] // num_local)
        self.num_central = first_halo_row
        self.indptr, self.indices = indptr, indices
        self.global_ids = self.global_ids[new_to_old]
        self.in_degree = np.concatenate([self.in_degree[new_to_old], self.in_degree[num_inner:]])
        index = torch.from_numpy(new_to_old).to(self.device)
        for name in ("features", "labels", "train_mask", "val_mask", "test_mask"):
            setattr(self, name, getattr(self, name).index_select(0, index))
        self.send_idx = torch.from_numpy(
            old_to_new[self.send_idx.cpu().numpy()].astype(np.int64)
        ).to(self.device)

    @property
    def local_global_ids(self) -> np.ndarray:
        """int64 [I + H]: the global id of every local node (inner, then halo)."""
        return np.concatenate([self.global_ids, self.halo_global_ids])

    @property
    def num_marginal(self) -> int:
        return self.num_inner - self.num_central

    @property
    def device(self) -> torch.device:
        return self.features.device

    def adjacency(self, norm: str) -> SparseAdjacency:
        """The [I, I + H] aggregation matrix with coefficients c_uv for edge v -> u.

        ``gcn``: D^-1/2 (A + I) D^-1/2 with global degrees (self-loop counted);
        ``mean``: 1 / in-degree (rows without in-edges aggregate to zero);
        ``gat``: the edges with self-loops, valued 1 / (in-degree + 1): the attention's
        structure, valued as uniform attention (what the planner weighs halo rows by).
        Its rows and columns carry their nodes' global ids (the keys of attention dropout).
        """
        rows = np.repeat(np.arange(self.num_inner, dtype=np.int64), np.diff(self.indptr))
        cols = self.indices
        if norm in ("gcn", "gat"):
            self_ids = np.arange(self.num_inner, dtype=np.int64)
            rows = np.concatenate([rows, self_ids])
            cols = np.concatenate([cols, self_ids])
            if norm == "gcn":
                inv_sqrt = 1.0 / np.sqrt(self.in_degree.astype(np.float64) + 1.0)
                values = inv_sqrt[rows] * inv_sqrt[cols]
            else:
                values = 1.0 / (self.in_degree[rows].astype(np.float64) + 1.0)
            order = np.lexsort((cols, rows))
            rows, cols, values = rows[order], cols[order], values[order]
        elif norm == "mean":
            degree = np.maximum(self.in_degree[: self.num_inner], 1).astype(np.float64)
            values = 1.0 / degree[rows]
        else:
            raise ValueError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
        indptr = np.zeros(self.num_inner + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=self.num_inner), out=indptr[1:])
        return SparseAdjacency.from_csr(
            indptr,
            cols,
            values.astype(np.float32),
            (self.num_inner, self.num_inner + self.num_halo),
            self.device,
            row_ids=self.global_ids,
            col_ids=self.local_global_ids,
        )
