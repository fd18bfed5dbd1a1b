"""Tests for adaqp.data.synthetic: the contextual SBM generator and its spec."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from adaqp.data import GraphData, SyntheticSpec, generate_synthetic, load_dataset
from tests.data.helpers import _adjacency, _masks, _rows


def test_synthetic_determinism() -> None:
    spec = SyntheticSpec(num_nodes=1500, avg_degree=10.0, seed=3)
    a, b = load_dataset("synthetic", synthetic=spec), load_dataset("synthetic", synthetic=spec)
    assert a.fingerprint() == b.fingerprint()
    c = load_dataset("synthetic", synthetic=dataclasses.replace(spec, seed=4))
    assert c.fingerprint() != a.fingerprint()
    d = load_dataset("synthetic", synthetic=spec, split_seed=1)
    np.testing.assert_array_equal(d.indices, a.indices)
    assert not np.array_equal(d.train_mask, a.train_mask)
    assert a.info["params"]["seed"] == 3


@pytest.mark.parametrize("power_law", [0.0, 2.5])
def test_synthetic_structure(power_law: float) -> None:
    spec = SyntheticSpec(num_nodes=4000, avg_degree=16.0, homophily=0.6, power_law=power_law)
    g = load_dataset("synthetic", synthetic=spec)
    a = _adjacency(g)
    assert (a != a.T).nnz == 0 and a.diagonal().sum() == 0
    degree = np.diff(g.indptr)
    assert 0.85 * 16 < degree.mean() <= 16.0
    if power_law:
        assert degree.max() > 10 * np.median(degree)  # heavy tail
    else:
        assert degree.max() < 3 * degree.mean()
    homophily = np.mean(g.labels[_rows(g)] == g.labels[g.indices])
    # Deduplication removes more same-class hub pairs under a power law, lowering it a bit.
    assert abs(homophily - 0.6) < (0.05 if power_law else 0.01)
    assert [int(m.sum()) for m in _masks(g)] == [400, 400, 800]
    np.testing.assert_array_equal(np.bincount(g.labels), [500] * 8)


def _ridge_accuracy(x: np.ndarray, g: GraphData) -> float:
    onehot = np.eye(g.num_classes)[g.labels[g.train_mask]]
    xt = np.hstack([x, np.ones((x.shape[0], 1))])
    a = xt[g.train_mask]
    w = np.linalg.solve(a.T @ a + 1.0 * np.eye(a.shape[1]), a.T @ onehot)
    pred = (xt[g.test_mask] @ w).argmax(1)
    return float(np.mean(pred == g.labels[g.test_mask]))


def test_synthetic_learnable() -> None:
    spec = SyntheticSpec(num_nodes=2000, feature_dim=32, train_fraction=0.2, seed=5)
    g = load_dataset("synthetic", synthetic=spec)
    a = _adjacency(g)
    deg = np.maximum(np.asarray(a.sum(1)).ravel(), 1.0)
    neigh = (a @ g.features) / deg[:, None]
    feat_only = _ridge_accuracy(g.features, g)
    with_graph = _ridge_accuracy(np.hstack([g.features, neigh]), g)
    chance = 1.0 / spec.num_classes
    assert feat_only < 0.6  # features alone are not enough ...
    assert with_graph > 0.75 and with_graph > feat_only + 0.2  # ... aggregation is
    assert feat_only > chance + 0.05


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_classes": 1}, "num_classes"),
        ({"homophily": 1.5}, "homophily"),
        ({"power_law": 0.5}, "power_law"),
        ({"num_nodes": 2.5}, "num_nodes"),
        ({"train_fraction": 0.6, "val_fraction": 0.3, "test_fraction": 0.3}, "test_fraction"),
        ({"avg_degree": 0.0}, "avg_degree"),
        ({"communities": 1}, "communities"),
        ({"num_nodes": 100, "num_classes": 4, "communities": 26}, "communities"),
        ({"communities": 4.0}, "communities"),
        ({"communities": 8, "inter_community": 1.5}, "inter_community"),
    ],
)
def test_synthetic_spec_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SyntheticSpec(**kwargs)


# Fingerprints of graphs made by generate_synthetic before communities existed (commit
# 5e4c213's adaqp/datasets.py, `generate_synthetic(spec).fingerprint()` for these specs).
# Communities at their default (0) must reproduce them bit for bit.
_FINGERPRINTS_BEFORE_COMMUNITIES = [
    ({}, "7796a08579ded96e0c617b725c7499fa"),
    (
        {"num_nodes": 3000, "avg_degree": 10.0, "power_law": 2.5, "seed": 7},
        "6fd49d5b2f52af22850c2f9e7b98619e",
    ),
    (
        {
            "num_nodes": 20000,
            "avg_degree": 10.0,
            "feature_dim": 64,
            "feature_noise": 2.0,
            "power_law": 2.5,
        },
        "5bcd8403b9a3a905eddd708a20a6e692",
    ),
]


@pytest.mark.parametrize(("kwargs", "fingerprint"), _FINGERPRINTS_BEFORE_COMMUNITIES)
def test_synthetic_without_communities_unchanged(kwargs: dict, fingerprint: str) -> None:
    assert generate_synthetic(SyntheticSpec(**kwargs)).fingerprint() == fingerprint
    # inter_community only matters with communities.
    spec = SyntheticSpec(**kwargs, communities=0, inter_community=0.5)
    assert generate_synthetic(spec).fingerprint() == fingerprint


def _communities(g: GraphData, k: int) -> np.ndarray:
    """The generator's community of each node: its rank within its class, cut into k runs."""
    rank = np.empty(g.num_nodes, dtype=np.int64)
    for c in range(g.num_classes):
        members = np.flatnonzero(g.labels == c)
        rank[members] = np.arange(members.size) * k // members.size
    return rank


@pytest.mark.parametrize("power_law", [0.0, 2.5])
def test_synthetic_communities(power_law: float) -> None:
    spec = SyntheticSpec(
        num_nodes=4000,
        avg_degree=10.0,
        homophily=0.7,
        power_law=power_law,
        communities=16,
        inter_community=0.05,
        seed=2,
    )
    g = load_dataset("synthetic", synthetic=spec)
    assert g.fingerprint() == load_dataset("synthetic", synthetic=spec).fingerprint()
    a = _adjacency(g)
    assert (a != a.T).nnz == 0 and a.diagonal().sum() == 0
    assert g.num_edges == 2 * 20000  # duplicates are redrawn: the degree is exact
    rows = _rows(g)
    homophily = np.mean(g.labels[rows] == g.labels[g.indices])
    community = _communities(g, spec.communities)
    inter = np.mean(community[rows] != community[g.indices])
    assert homophily == pytest.approx(g.info["sampled_edge_homophily"])
    assert inter == pytest.approx(g.info["sampled_inter_community"])
    assert abs(homophily - 0.7) < 0.015 and abs(inter - 0.05) < 0.006
    # Each community holds an equal share of every class.
    cells = np.bincount(community * g.num_classes + g.labels)
    assert cells.min() >= 31 and cells.max() <= 32  # 500 nodes per class / 16
    degree = np.diff(g.indptr)
    if power_law:
        assert degree.max() > 10 * np.median(degree)  # still heavy-tailed
    else:
        assert degree.max() < 3 * degree.mean()


def test_synthetic_communities_give_locality() -> None:
    from adaqp.partitioning.cut import assign_parts

    spec = SyntheticSpec(num_nodes=4000, avg_degree=10.0, power_law=2.5)
    cuts = []
    for communities in (0, 16):
        g = load_dataset("synthetic", synthetic=dataclasses.replace(spec, communities=communities))
        parts = assign_parts(g.indptr, g.indices, 4)
        cuts.append(np.mean(parts[_rows(g)] != parts[g.indices]))
    assert cuts[0] > 0.2 and cuts[1] < 0.08


def test_synthetic_communities_learnable() -> None:
    spec = SyntheticSpec(num_nodes=2000, feature_dim=32, train_fraction=0.2, seed=5, communities=8)
    g = load_dataset("synthetic", synthetic=spec)
    a = _adjacency(g)
    deg = np.maximum(np.asarray(a.sum(1)).ravel(), 1.0)
    neigh = (a @ g.features) / deg[:, None]
    feat_only = _ridge_accuracy(g.features, g)
    with_graph = _ridge_accuracy(np.hstack([g.features, neigh]), g)
    assert feat_only < 0.6 and with_graph > 0.75 and with_graph > feat_only + 0.2


def test_synthetic_communities_too_small_warns(caplog) -> None:
    # One node per (community, class) cell: no edge can stay inside a cell.
    spec = SyntheticSpec(num_nodes=40, num_classes=2, avg_degree=4.0, communities=20)
    with caplog.at_level(logging.WARNING, logger="adaqp.data"):
        g = load_dataset("synthetic", synthetic=spec)
    assert "too small" in caplog.text
    assert 0 < g.num_edges < 2 * 80
