"""Builds each part's arrays (inner nodes, halo nodes, send lists) one part at a time.

The assignment (node -> part) comes from ``adaqp.partitioning.cut``; this module turns it
into the arrays ``adaqp.partitioning.schema`` defines, for one part at a time, so that a
partition is written part by part and only one part's arrays are ever resident.

Two passes over each part's in-edges. The first finds every part's halo: the in-
neighbours owned by another part, keyed ``owner * N + owner-local id`` and sorted, so rows
from each peer land contiguously and in order. A part's send list needs every other
part's halo, and halos are small (a few ids per cut edge), so all of them are kept. The
second pass builds one part's arrays in full from its halo and the peers' halos. All steps
are vectorised over a part's edges, in int32 where node ids fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from adaqp.data.pages import release
from adaqp.partitioning.source import GraphSource


def _gather_rows(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edge positions of the given CSR rows, and the new indptr over those rows."""
    lengths = indptr[rows + 1] - indptr[rows]
    new_indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_indptr[1:])
    edge_pos = np.repeat(indptr[rows] - new_indptr[:-1], lengths)
    edge_pos += np.arange(new_indptr[-1], dtype=np.int64)
    return edge_pos, new_indptr


class PartBuilder:
    """Builds the parts of ``source`` cut by ``parts`` (int64 [N], ids 0..P-1).

    The halos of every part are found when the builder is made (the first pass);
    :meth:`part` builds one part's arrays (the second pass), :meth:`__iter__` all of
    them in rank order.
    """

    def __init__(self, source: GraphSource, parts: np.ndarray):
        self.source = source
        self.num_nodes = source.num_nodes
        self.num_parts = int(parts.max()) + 1 if parts.size else 1
        narrow = np.int32 if self.num_parts < np.iinfo(np.int32).max else np.int64
        self.part_of = parts.astype(narrow)
        self.order = np.argsort(parts, kind="stable")
        self.offsets = np.zeros(self.num_parts + 1, dtype=np.int64)
        np.cumsum(np.bincount(parts, minlength=self.num_parts), out=self.offsets[1:])
        self.owner_local = np.empty(self.num_nodes, dtype=np.int64)
        self.owner_local[self.order] = (
            np.arange(self.num_nodes, dtype=np.int64) - self.offsets[parts[self.order]]
        )
        self.halo_keys = [self._halo_keys(p) for p in range(self.num_parts)]
        """Per part: sorted distinct ``owner * N + owner-local id`` of its halo nodes."""

    def inner(self, p: int) -> np.ndarray:
        """int64 [I]: global ids of part ``p``'s inner nodes, ascending."""
        return self.order[self.offsets[p] : self.offsets[p + 1]]

    def _in_edges(self, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(inner ids, local indptr [I+1], global source id of every in-edge [E_p])."""
        inner = self.inner(p)
        edge_pos, local_indptr = _gather_rows(self.source.indptr, inner)
        src = self.source.indices[edge_pos]
        release(self.source.indices)  # a lean source's spilled ids: let them go
        return inner, local_indptr, src

    def _remote_keys(self, src: np.ndarray, remote: np.ndarray) -> np.ndarray:
        """``owner * N + owner-local id`` of the remote sources, int64."""
        far = src[remote]
        keys = self.part_of[far].astype(np.int64)
        keys *= self.num_nodes
        keys += self.owner_local[far]
        return keys

    def _halo_keys(self, p: int) -> np.ndarray:
        _, _, src = self._in_edges(p)
        remote = self.part_of[src] != p
        return np.unique(self._remote_keys(src, remote))

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return (self.part(p) for p in range(self.num_parts))

    def part(self, p: int) -> dict[str, np.ndarray]:
        """Part ``p``'s arrays, in the partition format (see adaqp/partitioning/schema.py)."""
        n, source = self.num_nodes, self.source
        inner, local_indptr, src = self._in_edges(p)
        num_inner = len(inner)
        remote = self.part_of[src] != p
        halo_keys = self.halo_keys[p]
        local_src = np.empty(len(src), dtype=np.int64)
        local_src[~remote] = self.owner_local[src[~remote]]
        local_src[remote] = num_inner + np.searchsorted(halo_keys, self._remote_keys(src, remote))
        del src, remote
        # Sources sorted within each row: one sort of row * width + local id.
        width = num_inner + len(halo_keys)
        indices = np.repeat(np.arange(num_inner, dtype=np.int64), np.diff(local_indptr))
        indices *= width
        indices += local_src
        del local_src
        indices.sort()
        np.remainder(indices, max(width, 1), out=indices)
        halo_owner, halo_owner_local = np.divmod(halo_keys, n)
        halo_global = self.order[self.offsets[halo_owner] + halo_owner_local]
        # What p sends to q is exactly q's halo rows owned by p, in q's halo order.
        low, high = p * n, (p + 1) * n
        sends = [
            keys[np.searchsorted(keys, low) : np.searchsorted(keys, high)] - low
            for keys in self.halo_keys
        ]
        return {
            "global_ids": inner,
            "indptr": local_indptr,
            "indices": indices,
            "halo_global_ids": halo_global,
            "halo_owner": halo_owner,
            "halo_owner_local": halo_owner_local,
            "recv_counts": np.bincount(halo_owner, minlength=self.num_parts).astype(np.int64),
            "send_idx": np.concatenate(sends).astype(np.int64),
            "send_counts": np.array([len(s) for s in sends], dtype=np.int64),
            "features": source.feature_rows(inner),
            "labels": source.labels[inner],
            "train_mask": source.train_mask[inner],
            "val_mask": source.val_mask[inner],
            "test_mask": source.test_mask[inner],
            "in_degree": source.in_degree[inner].astype(np.int64),
            "halo_degree": source.in_degree[halo_global].astype(np.int64),
        }


def part_stats(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """One part's exchange figures (an entry of ``stats.parts`` in the metadata)."""
    num_inner = len(arrays["global_ids"])
    remote = arrays["indices"] >= num_inner
    rows = np.repeat(np.arange(num_inner, dtype=np.int64), np.diff(arrays["indptr"]))
    has_halo = np.zeros(num_inner, dtype=bool)
    has_halo[rows[remote]] = True
    num_central = int(num_inner - has_halo.sum())
    return {
        "edge_cut": int(remote.sum()),
        "num_halo": len(arrays["halo_global_ids"]),
        "num_central": num_central,
        "central_fraction": num_central / num_inner if num_inner else 1.0,
    }


def total_stats(per_part: list[dict[str, Any]], num_nodes: int, num_edges: int) -> dict[str, Any]:
    """What the halo exchange will cost in total (``stats`` in the metadata).

    ``edge_cut`` counts in-edges from a halo source; ``halo_rows`` the rows a layer's
    exchange delivers; ``central`` inner nodes are those with no halo in-neighbour, whose
    aggregation can overlap the exchange.
    """
    edge_cut = sum(p["edge_cut"] for p in per_part)
    halo_rows = sum(p["num_halo"] for p in per_part)
    num_central = sum(p["num_central"] for p in per_part)
    return {
        "edge_cut": edge_cut,
        "edge_cut_fraction": edge_cut / max(num_edges, 1),
        "halo_rows": halo_rows,
        "halo_rows_per_node": halo_rows / max(num_nodes, 1),
        "num_central": num_central,
        "central_fraction": num_central / max(num_nodes, 1),
        "parts": per_part,
    }
