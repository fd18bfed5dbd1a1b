"""Tests for adaqp.data.graph: GraphData checks and fingerprint, CSR construction, splits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from adaqp.data import GraphData, csr_from_edges, random_split
from tests.data.helpers import _small_graph


def test_csr_from_edges_handmade() -> None:
    # Edges v -> u: duplicates (0->1 twice), a self-loop (2->2), unsorted input.
    src = np.array([3, 0, 0, 2, 1, 0])
    dst = np.array([1, 1, 1, 2, 3, 3])
    indptr, indices = csr_from_edges(src, dst, 4, symmetrize=False)
    assert indptr.dtype == np.int64 and indices.dtype == np.int64
    # Row u lists sources of in-edges: row1 = {0, 3}, row3 = {0, 1}.
    np.testing.assert_array_equal(indptr, [0, 0, 2, 2, 4])
    np.testing.assert_array_equal(indices, [0, 3, 0, 1])

    indptr, indices = csr_from_edges(src, dst, 4, symmetrize=True)
    # Undirected edges {0,1}, {1,3}, {0,3}.
    np.testing.assert_array_equal(indptr, [0, 2, 4, 4, 6])
    np.testing.assert_array_equal(indices, [1, 3, 0, 3, 0, 1])


def test_csr_from_edges_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match="dst"):
        csr_from_edges(np.array([0]), np.array([5]), 4, symmetrize=False)


def test_csr_from_edges_empty() -> None:
    indptr, indices = csr_from_edges(
        np.array([], np.int64), np.array([], np.int64), 3, symmetrize=True
    )
    np.testing.assert_array_equal(indptr, [0, 0, 0, 0])
    assert indices.shape == (0,)


def test_random_split_sizes_and_unlabelled() -> None:
    labels = np.repeat(np.arange(3), 400)
    labels[:10] = -1
    train, val, test = random_split(labels, 3, seed=1, per_class=20, num_val=100, num_test=200)
    assert train.sum() == 60 and val.sum() == 100 and test.sum() == 200
    np.testing.assert_array_equal(np.bincount(labels[train]), [20, 20, 20])
    assert not (train & val).any() and not (val & test).any() and not (train & test).any()
    assert not (train | val | test)[:10].any()
    with pytest.raises(ValueError, match="num_val"):
        random_split(labels, 3, seed=1, num_val=1000, num_test=1000)


def test_fingerprint_sensitive_to_one_value() -> None:
    g = _small_graph()
    before = g.fingerprint()
    assert len(before) == 32 and before == _small_graph().fingerprint()
    g.features[17, 3] += 1e-3
    assert g.fingerprint() != before


def test_validate_rejects_bad_data() -> None:
    g = _small_graph()
    g.validate()
    bad = dataclasses.replace(g, indices=g.indices.copy())
    bad.indices[5] = g.num_nodes
    with pytest.raises(ValueError, match="indices"):
        bad.validate()
    unsorted = dataclasses.replace(g, indices=g.indices.copy())
    row = int(np.argmax(np.diff(g.indptr) >= 2))
    s = g.indptr[row]
    unsorted.indices[s], unsorted.indices[s + 1] = g.indices[s + 1], g.indices[s]
    with pytest.raises(ValueError, match="not strictly increasing"):
        unsorted.validate()
    with pytest.raises(ValueError, match="features"):
        dataclasses.replace(g, features=g.features.astype(np.float64)).validate()
    with pytest.raises(ValueError, match="test_mask"):
        dataclasses.replace(g, test_mask=g.train_mask.copy()).validate()
    with pytest.raises(ValueError, match="labels"):
        dataclasses.replace(g, labels=g.labels + g.num_classes).validate()


def _tiny_graph(indptr: np.ndarray, indices: np.ndarray) -> GraphData:
    n = indptr.shape[0] - 1
    masks = [np.arange(n) == 0, np.zeros(n, bool), np.zeros(n, bool)]
    return GraphData(
        "t", indptr, indices, np.zeros((n, 2), np.float32), np.zeros(n, np.int64), *masks, 1
    )


def test_validate_rejects_self_loop() -> None:
    indptr = np.array([0, 1, 2], dtype=np.int64)
    indices = np.array([0, 0], dtype=np.int64)  # row 0 holds 0 -> 0
    g = _tiny_graph(indptr, indices)
    with pytest.raises(ValueError, match="self-loop at node 0"):
        g.validate()


def test_symmetrized() -> None:
    n = 3
    indptr, indices = csr_from_edges(np.array([0, 1]), np.array([1, 2]), n, symmetrize=False)
    g = _tiny_graph(indptr, indices)
    g.validate()
    s = g.symmetrized()
    np.testing.assert_array_equal(s.indptr, [0, 1, 3, 4])
    np.testing.assert_array_equal(s.indices, [1, 0, 2, 1])
    assert s.info["symmetrized"] and g.num_edges == 2
