"""Tests for adaqp.data.load: dataset names, and validation by every loader."""

from __future__ import annotations

import numpy as np
import pytest

from adaqp.data import SyntheticSpec, from_dgl, generate_synthetic, load_dataset
from tests.data.helpers import _FakeDGLGraph


def test_unknown_name_lists_available() -> None:
    with pytest.raises(ValueError, match=r"cora.*citeseer.*synthetic.*npz.*ogbn-arxiv"):
        load_dataset("pubmed-nope")


def test_converters_and_generators_validate() -> None:
    n = 3
    ndata = {
        "feat": np.array([[0.0], [np.nan], [1.0]]),
        "label": np.array([0, 1, 0]),
        "train_mask": np.array([True, False, False]),
        "val_mask": np.array([False, True, False]),
        "test_mask": np.array([False, False, True]),
    }
    with pytest.raises(ValueError, match=r"^dataset 'toy': features hold NaN or Inf"):
        from_dgl(_FakeDGLGraph(np.array([0]), np.array([2]), ndata), name="toy")
    ndata["feat"] = np.eye(n)
    with pytest.raises(ValueError, match=r"^dataset 'toy' from dgl: edges: src ids"):
        from_dgl(_FakeDGLGraph(np.array([3]), np.array([2]), ndata), name="toy")
    # A split too small to hold a training node is caught where the graph is generated.
    with pytest.raises(ValueError, match=r"^dataset 'synthetic': train_mask is empty"):
        generate_synthetic(SyntheticSpec(num_nodes=20, avg_degree=4.0, train_fraction=0.01))


def test_row_normalisation_divides_each_row_by_its_l1_norm() -> None:
    raw = load_dataset("synthetic", synthetic=SyntheticSpec(num_nodes=300, feature_dim=12))
    graph = load_dataset(
        "synthetic", synthetic=SyntheticSpec(num_nodes=300, feature_dim=12), feature_norm="row"
    )
    assert np.any(raw.features < 0)  # L1: negative features count by their magnitude
    norms = np.abs(raw.features).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(graph.features, raw.features / norms, rtol=1e-6)
    assert graph.features.dtype == np.float32
    assert graph.info["feature_norm"] == "row" and "feature_norm" not in raw.info
    with pytest.raises(ValueError, match="feature_norm must be 'none' or 'row', not 'l2'"):
        load_dataset("cora", feature_norm="l2")


def test_row_normalisation_keeps_zero_rows_of_a_loaded_graph() -> None:
    graph = load_dataset("cora")
    graph.features[5] = 0.0
    graph.normalize_rows()
    sums = graph.features.sum(axis=1)
    assert sums[5] == 0.0
    np.testing.assert_allclose(np.delete(sums, 5), 1.0, rtol=1e-5)
