"""Helpers shared by the tests of adaqp.data: adjacency views, small graphs, a fake DGL graph."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from adaqp.data import GraphData, SyntheticSpec, load_dataset


def _adjacency(g: GraphData) -> sp.csr_matrix:
    ones = np.ones(g.num_edges, dtype=np.float32)
    return sp.csr_matrix((ones, g.indices, g.indptr), shape=(g.num_nodes, g.num_nodes))


def _rows(g: GraphData) -> np.ndarray:
    return np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))


def _masks(g: GraphData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return g.train_mask, g.val_mask, g.test_mask


def _small_graph() -> GraphData:
    return load_dataset("synthetic", synthetic=SyntheticSpec(num_nodes=300, avg_degree=6.0))


class _FakeDGLGraph:
    """Just the DGL surface that from_dgl uses (DGL itself is not installed)."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, ndata: dict) -> None:
        self._src, self._dst, self.ndata = src, dst, ndata

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        return self._src, self._dst

    def num_nodes(self) -> int:
        return len(self.ndata["label"])


TINY_CONFIG = (
    '[data]\ndataset = "synthetic"\n\n[data.synthetic]\nnum_nodes = 120\nnum_classes = 4\n'
    "feature_dim = 3\navg_degree = 4.0\n"
)
"""A run config naming a 120-node synthetic graph (the fixture commands' tests)."""
