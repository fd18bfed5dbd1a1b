"""Tests for adaqp.data.builtin: the embedded cora and citeseer datasets."""

from __future__ import annotations

import numpy as np
import pytest

from adaqp.data import load_dataset
from tests.data.helpers import _adjacency, _masks


@pytest.mark.parametrize(
    ("name", "nodes", "classes", "feats", "train"),
    [("cora", 2708, 7, 1433, 140), ("citeseer", 3312, 6, 3703, 120)],
)
def test_builtin(name: str, nodes: int, classes: int, feats: int, train: int) -> None:
    g = load_dataset(name)
    g.validate()
    assert (g.num_nodes, g.num_classes, g.feature_dim) == (nodes, classes, feats)
    assert g.features.dtype == np.float32 and g.features.flags.c_contiguous
    assert set(np.unique(g.features)) <= {0.0, 1.0}  # raw binary bag of words
    a = _adjacency(g)
    assert (a != a.T).nnz == 0
    assert a.diagonal().sum() == 0
    assert (train, 500, 1000) == tuple(int(m.sum()) for m in _masks(g))
    np.testing.assert_array_equal(np.bincount(g.labels[g.train_mask]), [20] * classes)
    tr, va, te = _masks(g)
    assert not (tr & va).any() and not (va & te).any() and not (tr & te).any()
    assert g.info["split_seed"] == 0 and g.info["split_sizes"] == [train, 500, 1000]


def test_cora_edge_count_and_split_seed() -> None:
    g0 = load_dataset("cora", split_seed=0)
    assert g0.num_edges == 10556  # the well-known 5278 undirected Cora edges
    again = load_dataset("cora", split_seed=0)
    g1 = load_dataset("cora", split_seed=1)
    for a, b in zip(_masks(g0), _masks(again), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(g0.train_mask, g1.train_mask)
    assert g0.fingerprint() == again.fingerprint() != g1.fingerprint()
    np.testing.assert_array_equal(g0.indices, g1.indices)
