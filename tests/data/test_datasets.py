"""Tests for adaqp.data: loaders, CSR construction, splits and formats."""

from __future__ import annotations

import dataclasses
import gzip
import logging
import shutil
import urllib.error
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from adaqp import data as datasets
from adaqp.data import (
    GraphData,
    SyntheticSpec,
    csr_from_edges,
    from_dgl,
    from_pyg,
    load_dataset,
    random_split,
    save_npz,
)


def _adjacency(g: GraphData) -> sp.csr_matrix:
    ones = np.ones(g.num_edges, dtype=np.float32)
    return sp.csr_matrix((ones, g.indices, g.indptr), shape=(g.num_nodes, g.num_nodes))


def _rows(g: GraphData) -> np.ndarray:
    return np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))


def _masks(g: GraphData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return g.train_mask, g.val_mask, g.test_mask


# --------------------------------------------------------------------------- csr / split


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


# --------------------------------------------------------------------------- built-in


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


def test_unknown_name_lists_available() -> None:
    with pytest.raises(ValueError, match=r"cora.*citeseer.*synthetic.*npz.*ogbn-arxiv"):
        load_dataset("pubmed-nope")


# --------------------------------------------------------------------------- synthetic


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
    assert datasets.generate_synthetic(SyntheticSpec(**kwargs)).fingerprint() == fingerprint
    # inter_community only matters with communities.
    spec = SyntheticSpec(**kwargs, communities=0, inter_community=0.5)
    assert datasets.generate_synthetic(spec).fingerprint() == fingerprint


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


# --------------------------------------------------------------------------- GraphData


def _small_graph() -> GraphData:
    return load_dataset("synthetic", synthetic=SyntheticSpec(num_nodes=300, avg_degree=6.0))


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


# --------------------------------------------------------------------------- npz


def test_npz_round_trip(tmp_path: Path) -> None:
    g = _small_graph()
    path = tmp_path / "g.npz"
    save_npz(g, path)
    h = load_dataset("npz", path=path)
    assert h.fingerprint() == g.fingerprint()
    assert h.info["params"] == g.info["params"]


def test_npz_normalises_and_symmetrizes(tmp_path: Path) -> None:
    path = tmp_path / "raw.npz"
    n = 4
    np.savez(
        path,
        indptr=np.array([0, 3, 3, 4, 4], dtype=np.int32),
        indices=np.array([2, 0, 2, 1], dtype=np.int32),  # unsorted, self-loop, duplicate
        features=np.ones((n, 2)),
        labels=np.array([0, 1, 1, 0]),
        train_mask=np.array([1, 0, 0, 0], dtype=np.uint8),
        val_mask=np.zeros(n, bool),
        test_mask=np.zeros(n, bool),
        symmetrize=True,
    )
    g = load_dataset("npz", path=path)
    # Edges 2->0 and 1->2 plus reverses.
    np.testing.assert_array_equal(g.indptr, [0, 1, 2, 4, 4])
    np.testing.assert_array_equal(g.indices, [2, 2, 0, 1])
    assert g.num_classes == 2 and g.name == "raw" and g.features.dtype == np.float32


def test_npz_missing_key(tmp_path: Path) -> None:
    g = _small_graph()
    path = tmp_path / "bad.npz"
    np.savez(
        path,
        indptr=g.indptr,
        indices=g.indices,
        features=g.features,
        labels=g.labels,
        train_mask=g.train_mask,
        val_mask=g.val_mask,
    )
    with pytest.raises(ValueError, match=r"bad\.npz.*'test_mask'"):
        load_dataset("npz", path=path)
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        load_dataset("npz", path=tmp_path / "nope.npz")
    with pytest.raises(ValueError, match="path"):
        load_dataset("npz")


def _set(key: str, value: Any) -> Callable[[dict], None]:
    def apply(arrays: dict) -> None:
        arrays[key] = value(arrays[key]) if callable(value) else value

    return apply


def _non_monotone(indptr: np.ndarray) -> np.ndarray:
    indptr = indptr.copy()
    indptr[1], indptr[2] = indptr[2] + 1, indptr[1]  # keeps both ends, breaks the order
    return indptr


def _index(at: int, value: float) -> Callable[[np.ndarray], np.ndarray]:
    def apply(arr: np.ndarray) -> np.ndarray:
        arr = arr.copy()
        arr.reshape(-1)[at] = value
        return arr

    return apply


def _first_unlabelled(arrays: dict) -> None:
    arrays["labels"] = arrays["labels"].copy()
    arrays["labels"][np.flatnonzero(~arrays["train_mask"])[0]] = -2


# One bad input per row: how it is broken, and what the error must say.
_BAD_INPUTS = [
    (
        "label-too-large",
        _set("labels", lambda x: np.where(np.arange(len(x)) == 7, 8, x)),
        r"labels must lie in \[0, 8\).*got 8 at node 7",
    ),
    ("label-negative", _first_unlabelled, r"labels must lie in \[0, 8\).*got -2"),
    (
        "feature-nan",
        _set("features", _index(5 * 64 + 3, np.nan)),
        r"NaN or Inf \(first at node 5\)",
    ),
    ("feature-inf", _set("features", _index(9 * 64, -np.inf)), r"NaN or Inf \(first at node 9\)"),
    (
        "mask-length",
        _set("val_mask", lambda x: x[:-1]),
        r"val_mask has 299 rows, expected num_nodes=300",
    ),
    ("train-empty", _set("train_mask", lambda x: np.zeros_like(x)), r"train_mask is empty"),
    (
        "indptr-length",
        _set("indptr", lambda x: x[:-1]),
        r"indptr must start at 0 and end at len\(indices\)",
    ),
    ("indptr-order", _set("indptr", _non_monotone), r"indptr must be non-decreasing"),
    ("index-range", _set("indices", _index(11, 300)), r"indices must lie in \[0, 300\)"),
    (
        "feature-rows",
        _set("features", lambda x: x[:-2]),
        r"features has 298 rows, expected num_nodes=300",
    ),
]


@pytest.mark.parametrize(
    ("case", "corrupt", "message"), _BAD_INPUTS, ids=[c[0] for c in _BAD_INPUTS]
)
def test_load_rejects_bad_input(tmp_path: Path, case: str, corrupt, message: str) -> None:
    g = _small_graph()
    arrays = {key: getattr(g, key) for key in datasets._ARRAYS}
    corrupt(arrays)
    path = tmp_path / f"{case}.npz"
    np.savez(path, **arrays, num_classes=np.int64(g.num_classes), name=np.str_(f"bad-{case}"))
    # The message names the dataset (and its file) and the problem.
    with pytest.raises(ValueError, match=rf"^dataset 'bad-{case}' \(.*{case}\.npz\): .*{message}"):
        load_dataset("npz", path=path)


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
        datasets.generate_synthetic(
            SyntheticSpec(num_nodes=20, avg_degree=4.0, train_fraction=0.01)
        )


# --------------------------------------------------------------------------- OGB


def _write_csv_gz(path: Path, rows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.write("".join(f"{r}\n" for r in rows))


def _fake_ogb(folder: Path, n: int = 30, seed: int = 0) -> dict:
    """Writes a tiny dataset in OGB's raw csv layout (as for ogbn-arxiv, split 'time')."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, 80), rng.integers(0, n, 80)
    feat = rng.standard_normal((n, 6)).astype(np.float32)
    labels = rng.integers(0, 5, n)
    raw = folder / "raw"
    _write_csv_gz(raw / "edge.csv.gz", [f"{s},{d}" for s, d in zip(src, dst, strict=True)])
    _write_csv_gz(raw / "node-feat.csv.gz", [",".join(repr(float(v)) for v in row) for row in feat])
    label_rows = [str(v) for v in labels]
    label_rows[0] = ""  # NaN: an unlabelled node listed in the train split
    _write_csv_gz(raw / "node-label.csv.gz", label_rows)
    _write_csv_gz(raw / "num-node-list.csv.gz", [str(n)])
    _write_csv_gz(raw / "num-edge-list.csv.gz", [str(len(src))])
    split = {"train": range(0, 15), "valid": range(15, 22), "test": range(22, 30)}
    for part, ids in split.items():
        _write_csv_gz(folder / "split" / "time" / f"{part}.csv.gz", [str(i) for i in ids])
    return {"src": src, "dst": dst, "feat": feat, "labels": labels}


def test_ogb_layout_load_and_cache(tmp_path: Path, monkeypatch, caplog) -> None:
    truth = _fake_ogb(tmp_path / "ogbn_arxiv")
    g = load_dataset("ogbn-arxiv", root=tmp_path)
    assert g.num_nodes == 30 and g.num_classes == 40 and g.feature_dim == 6
    np.testing.assert_allclose(g.features, truth["feat"])
    assert g.labels[0] == -1
    np.testing.assert_array_equal(g.labels[1:], truth["labels"][1:])
    expected = csr_from_edges(truth["src"], truth["dst"], 30, symmetrize=True)
    np.testing.assert_array_equal(g.indptr, expected[0])
    np.testing.assert_array_equal(g.indices, expected[1])
    assert g.train_mask.sum() == 14 and not g.train_mask[0]  # node 0 is unlabelled
    assert g.val_mask[15:22].all() and g.val_mask.sum() == 7 and g.test_mask.sum() == 8
    assert g.info["metric"] == "acc" and g.info["evaluator"] == "ogbn-arxiv"
    assert g.info["symmetrized"] and g.info["split"] == "time"
    cache = tmp_path / "ogbn_arxiv" / "adaqp_cache.npz"
    assert cache.is_file()

    def no_parse(*args, **kwargs):
        raise AssertionError("raw files parsed although a valid cache exists")

    with monkeypatch.context() as m:
        m.setattr(datasets, "_parse_ogb_raw", no_parse)
        assert load_dataset("ogbn-arxiv", root=tmp_path).fingerprint() == g.fingerprint()

    cache.write_bytes(b"not a zip file")
    with caplog.at_level(logging.WARNING, logger="adaqp.data"):
        assert load_dataset("ogbn-arxiv", root=tmp_path).fingerprint() == g.fingerprint()
    assert "rebuilding" in caplog.text

    with np.load(cache, allow_pickle=False) as z:
        arrays = dict(z)
    arrays["format_version"] = np.int64(999)
    np.savez(cache, **arrays)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="adaqp.data"):
        assert load_dataset("ogbn-arxiv", root=tmp_path).fingerprint() == g.fingerprint()
    assert "format_version" in caplog.text
    with np.load(cache, allow_pickle=False) as z:
        assert int(z["format_version"]) == datasets._CACHE_VERSION

    # Changed raw files invalidate the cache (detected via their sizes).
    new = int(np.setdiff1d(np.arange(29), g.indices[g.indptr[29] : g.indptr[30]])[0])
    edges = [f"{s},{d}" for s, d in zip(truth["src"], truth["dst"], strict=True)]
    _write_csv_gz(tmp_path / "ogbn_arxiv" / "raw" / "edge.csv.gz", [*edges, f"{new},29"])
    h = load_dataset("ogbn-arxiv", root=tmp_path)
    assert new in h.indices[h.indptr[29] : h.indptr[30]] and h.num_edges == g.num_edges + 2


def test_ogb_missing_files(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def offline(url, folder, log=True):
        calls.append(url)
        raise urllib.error.URLError("no network")

    monkeypatch.setattr("ogb.utils.url.download_url", offline)
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("ogbn-arxiv", root=tmp_path)
    message = str(err.value)
    assert "raw/edge.csv.gz" in message and str(tmp_path / "ogbn_arxiv") in message
    assert "arxiv.zip" in message and len(calls) == 1

    # A partial folder is never clobbered by a download; the error names the missing file.
    _fake_ogb(tmp_path / "ogbn_arxiv")
    (tmp_path / "ogbn_arxiv" / "raw" / "node-feat.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match="node-feat.csv.gz"):
        load_dataset("ogbn-arxiv", root=tmp_path)
    assert len(calls) == 1


def test_ogb_download_unpacks_like_ogb(tmp_path: Path, monkeypatch) -> None:
    staging = tmp_path / "staging"
    _fake_ogb(staging / "arxiv")
    archive = shutil.make_archive(str(tmp_path / "arxiv"), "zip", staging)
    assert zipfile.is_zipfile(archive)

    def fake_download(url, folder, log=True):
        assert url.endswith("arxiv.zip")
        return shutil.copy(archive, Path(folder) / "arxiv.zip")

    monkeypatch.setattr("ogb.utils.url.download_url", fake_download)
    root = tmp_path / "root"
    g = load_dataset("ogbn-arxiv", root=root)
    assert g.num_nodes == 30
    assert sorted(p.name for p in root.iterdir()) == ["ogbn_arxiv"]  # temp files cleaned up


def test_ogb_unsupported() -> None:
    with pytest.raises(ValueError, match="ogbn-products"):
        load_dataset("ogbn-mag")


# --------------------------------------------------------------------------- adapters


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


class _FakeDGLGraph:
    """Just the DGL surface that from_dgl uses (DGL itself is not installed)."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, ndata: dict) -> None:
        self._src, self._dst, self.ndata = src, dst, ndata

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        return self._src, self._dst

    def num_nodes(self) -> int:
        return len(self.ndata["label"])


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
