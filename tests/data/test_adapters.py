"""Tests for adaqp.data.adapters: conversion of PyG and (duck-typed) DGL graphs."""

from __future__ import annotations

import numpy as np
import pytest

from adaqp.data import from_dgl, from_pyg
from tests.data.helpers import _adjacency, _FakeDGLGraph


def test_from_pyg() -> None:
    torch = pytest.importorskip("torch")
    pyg_data = pytest.importorskip("torch_geometric.data")
    n = 4
    edge_index = torch.tensor([[0, 0, 2, 3, 1], [1, 1, 2, 0, 3]])  # dup 0->1, self-loop 2->2
    data = pyg_data.Data(
        x=torch.arange(8, dtype=torch.float64).reshape(n, 2),
        edge_index=edge_index,
        y=torch.tensor([[0], [2], [1], [2]]),
        train_mask=torch.tensor([True, True, False, False]),
        val_mask=torch.tensor([False, False, True, False]),
        test_mask=torch.tensor([False, False, False, True]),
    )
    g = from_pyg(data, name="toy")
    # In-edges: row1 <- 0, row3 <- 1, row0 <- 3.
    np.testing.assert_array_equal(g.indptr, [0, 1, 2, 2, 3])
    np.testing.assert_array_equal(g.indices, [3, 0, 1])
    np.testing.assert_array_equal(g.labels, [0, 2, 1, 2])
    assert g.num_classes == 3 and g.features.dtype == np.float32 and g.name == "toy"
    np.testing.assert_array_equal(g.features, np.arange(8).reshape(n, 2))
    s = from_pyg(data, symmetrize=True)
    a = _adjacency(s)
    assert (a != a.T).nnz == 0 and s.num_edges == 6
    del data.train_mask
    with pytest.raises(ValueError, match="train_mask"):
        from_pyg(data)


def test_from_dgl_duck_typed() -> None:
    n = 3
    ndata = {
        "feat": np.eye(n),
        "label": np.array([0, 1, 0]),
        "train_mask": np.array([True, False, False]),
        "val_mask": np.array([False, True, False]),
        "test_mask": np.array([False, False, True]),
    }
    g = from_dgl(_FakeDGLGraph(np.array([0, 1]), np.array([2, 2]), ndata), symmetrize=True)
    np.testing.assert_array_equal(g.indptr, [0, 1, 2, 4])
    np.testing.assert_array_equal(g.indices, [2, 2, 0, 1])
    assert g.num_classes == 2 and g.info == {"source": "dgl", "symmetrized": True}
    del ndata["val_mask"]
    with pytest.raises(ValueError, match="val_mask"):
        from_dgl(_FakeDGLGraph(np.array([0]), np.array([1]), ndata))
