"""Tests for OGB's binary layout (adaqp.data.ogb_binary) and its fixture: the loader gives
what OGB's own loader reads from the same files, mapped or streamed, and names a bad file."""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from adaqp.data import GraphData, SyntheticSpec, csr_from_edges, generate_synthetic, load_dataset
from adaqp.data.graph import GRAPH_ARRAYS
from adaqp.data.load import check_source
from adaqp.data.ogb import ogb_source, supported_ogb_names
from adaqp.data.ogb_binary import parse_binary_layout
from adaqp.data.ogb_fixture import write_ogb_fixture
from adaqp.ogb_fixture import main
from tests.data.helpers import TINY_CONFIG

NAME = "ogbn-papers100M"
SPEC = SyntheticSpec(num_nodes=300, num_classes=5, avg_degree=6.0, feature_dim=7, seed=3)


def _graph() -> GraphData:
    """A small graph whose split leaves most nodes out (as papers100M's does)."""
    graph = generate_synthetic(SPEC, split_seed=0)
    assert not (graph.train_mask | graph.val_mask | graph.test_mask).all()
    return graph


def _in_split(graph: GraphData) -> np.ndarray:
    return graph.train_mask | graph.val_mask | graph.test_mask


@pytest.fixture
def quiet_ogb(monkeypatch) -> None:
    """Lets a test import ogb without its version check: importing ogb starts a thread
    that asks PyPI for the newest version wherever the ``outdated`` package imports, so
    that package is hidden while the test runs (no-op where ogb is imported already)."""
    monkeypatch.setitem(sys.modules, "outdated", None)


@pytest.fixture
def fixture_root(tmp_path: Path, monkeypatch, quiet_ogb) -> Path:
    """A binary-layout fixture of ``_graph()`` under ``tmp_path / "root"``; downloads fail."""

    def no_download(*args, **kwargs):
        raise AssertionError("a complete fixture must never be downloaded over")

    monkeypatch.setattr("ogb.utils.url.download_url", no_download)
    write_ogb_fixture(_graph(), tmp_path / "root", NAME, block_values=50)  # many blocks
    return tmp_path / "root"


@pytest.fixture
def ogb_dataset_class(quiet_ogb):
    """OGB's own loader, ``NodePropPredDataset``."""
    return importlib.import_module("ogb.nodeproppred.dataset").NodePropPredDataset


def test_loader_equals_ogbs_own_loader(fixture_root: Path, tmp_path: Path, ogb_dataset_class):
    graph = load_dataset(NAME, root=fixture_root)
    # OGB's loader reads a copy: it writes its (pickled) cache into the folder it reads.
    ogb_root = tmp_path / "ogb"
    shutil.copytree(fixture_root, ogb_root)
    (ogb_root / "ogbn_papers100M" / "processed").mkdir()
    dataset = ogb_dataset_class(name=NAME, root=str(ogb_root))
    ogb_graph, ogb_labels = dataset[0]
    n = ogb_graph["num_nodes"]
    assert graph.num_nodes == n and graph.name == NAME and graph.num_classes == 172
    src, dst = ogb_graph["edge_index"]
    indptr, indices = csr_from_edges(src, dst, n, symmetrize=True)
    assert np.array_equal(graph.indptr, indptr) and np.array_equal(graph.indices, indices)
    assert graph.indices.dtype == np.int32  # every id fits: half of int64's bytes
    assert graph.info["num_raw_edges"] == src.size and not graph.info["add_inverse_edge"]
    assert ogb_graph["node_feat"].dtype == np.float16 and graph.features.dtype == np.float16
    assert np.array_equal(graph.features, ogb_graph["node_feat"])
    assert isinstance(graph.features, np.memmap)  # mapped from data.npz, not copied
    assert ogb_labels.shape == (n, 1) and np.isnan(ogb_labels).any()
    expected = np.where(np.isnan(ogb_labels[:, 0]), -1, ogb_labels[:, 0]).astype(np.int64)
    assert graph.labels.dtype == np.int64 and np.array_equal(graph.labels, expected)
    split = dataset.get_idx_split()
    for key, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert np.array_equal(np.flatnonzero(getattr(graph, key)), np.sort(split[part])), key
    # The nodes in no split are unlabelled; the written graph's arrays come back.
    written = _graph()
    assert np.array_equal(graph.labels < 0, ~_in_split(written))
    assert np.array_equal(graph.labels[_in_split(written)], written.labels[_in_split(written)])
    assert np.array_equal(graph.features, written.features.astype(np.float16))
    fixture = graph.info["synthetic_fixture"]
    assert fixture["layout"] == "binary" and graph.fingerprint() == fixture["expected_fingerprint"]
    assert not (fixture_root / "ogbn_papers100M" / "adaqp_cache.npz").exists()  # no cache


def test_compressed_archives_read_the_same(fixture_root: Path) -> None:
    """np.savez_compressed's members are streamed; a column-major edge_index (E x 2
    transposed) too."""
    stored = load_dataset(NAME, root=fixture_root)
    raw = fixture_root / "ogbn_papers100M" / "raw"
    for file in ("data.npz", "node-label.npz"):
        with np.load(raw / file, allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files}
        if "edge_index" in arrays:
            arrays["edge_index"] = np.ascontiguousarray(arrays["edge_index"].T).T
            assert arrays["edge_index"].flags.f_contiguous
        # Replaced, not rewritten in place: ``stored`` maps the old file's features.
        np.savez_compressed(raw / "new.npz", **arrays)
        os.replace(raw / "new.npz", raw / file)
    compressed = load_dataset(NAME, root=fixture_root)
    assert not isinstance(compressed.features, np.memmap)
    for key in GRAPH_ARRAYS:
        a, b = getattr(stored, key), getattr(compressed, key)
        assert a.dtype == b.dtype and np.array_equal(a, b), key


def test_parse_does_not_depend_on_the_block_size(fixture_root: Path) -> None:
    """Raw edges as published (both directions, repeats, a self-loop) give the symmetric
    CSR, and blocks of 3 values give what one block does."""
    folder = fixture_root / "ogbn_papers100M"
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, SPEC.num_nodes, 500), rng.integers(0, SPEC.num_nodes, 500)
    src = np.concatenate([src, dst[:50], src[:50], [7]])
    dst = np.concatenate([dst, src[:50], dst[:50], [7]])
    with np.load(folder / "raw" / "data.npz", allow_pickle=False) as z:
        arrays = {key: z[key] for key in z.files}
    arrays["edge_index"] = np.stack([src, dst])
    arrays["num_edges_list"] = np.array([src.size])
    np.savez(folder / "raw" / "data.npz", **arrays)
    _, directory, files = ogb_source(NAME, fixture_root)
    one_block = parse_binary_layout(directory, files, block_values=1 << 30)
    blocks = parse_binary_layout(directory, files, block_values=3)
    for key, value in one_block.items():
        assert value.dtype == blocks[key].dtype and np.array_equal(value, blocks[key]), key
    indptr, indices = csr_from_edges(src, dst, SPEC.num_nodes, symmetrize=True)
    assert np.array_equal(blocks["indptr"], indptr) and np.array_equal(blocks["indices"], indices)
    assert int(blocks["num_raw_edges"]) == src.size


def test_an_unlabelled_node_in_the_split_is_dropped(fixture_root: Path, caplog) -> None:
    raw = fixture_root / "ogbn_papers100M" / "raw"
    before = load_dataset(NAME, root=fixture_root)
    node = int(np.flatnonzero(before.train_mask)[0])
    with np.load(raw / "node-label.npz", allow_pickle=False) as z:
        labels = z["node_label"].copy()
    labels[node] = np.nan
    np.savez(raw / "node-label.npz", node_label=labels)
    with caplog.at_level(logging.WARNING, logger="adaqp.data"):
        after = load_dataset(NAME, root=fixture_root)
    assert "dropping 1 unlabelled nodes from train_mask" in caplog.text
    assert after.labels[node] == -1 and not after.train_mask[node]
    assert after.train_mask.sum() == before.train_mask.sum() - 1


def _rewrite(path: Path, **changes) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {key: z[key] for key in z.files}
    arrays.update(changes)
    for key in [key for key, value in changes.items() if value is None]:
        del arrays[key]
    np.savez(path, **arrays)


@pytest.mark.parametrize(
    ("file", "damage", "message"),
    [
        ("data.npz", "garbage", r"raw/data.npz is not an .npz archive"),
        ("data.npz", "truncate", r"raw/data.npz is not an .npz archive"),
        ("data.npz", {"node_feat": None}, r"raw/data.npz lacks 'node_feat'"),
        ("data.npz", {"num_nodes_list": np.array([10, 5])}, r"data.npz must hold one graph"),
        ("data.npz", {"edge_index": np.array([[0], [300]])}, r"'edge_index'.* shape \[2, "),
        (
            "data.npz",
            {"edge_index": np.array([[0], [300]]), "num_edges_list": np.array([1])},
            "outside",
        ),
        ("data.npz", {"node_feat": np.zeros((299, 7), np.float16)}, r"'node_feat'.*\[300, F\]"),
        ("node-label.npz", {"node_label": np.zeros((300, 2))}, r"'node_label'.*\[300, 1\]"),
        ("node-label.npz", {"node_label": np.full((300, 1), 1.5)}, r"node-label.npz: label 1.5"),
        ("node-label.npz", "garbage", r"raw/node-label.npz is not an .npz archive"),
    ],
)
def test_a_damaged_file_is_named(fixture_root: Path, file: str, damage, message: str) -> None:
    path = fixture_root / "ogbn_papers100M" / "raw" / file
    if damage == "garbage":
        path.write_bytes(b"this is not a zip archive")
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        _rewrite(path, **damage)
    with pytest.raises(ValueError, match=message):
        load_dataset(NAME, root=fixture_root)


def test_a_missing_label_file_is_named(fixture_root: Path) -> None:
    (fixture_root / "ogbn_papers100M" / "raw" / "node-label.npz").unlink()
    with pytest.raises(FileNotFoundError, match="raw/node-label.npz"):
        check_source(NAME, root=fixture_root)
    with pytest.raises(FileNotFoundError, match=r"missing raw/node-label.npz under"):
        load_dataset(NAME, root=fixture_root)


def test_command_line_writes_the_binary_layout(tmp_path: Path, capsys) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(TINY_CONFIG)
    root = tmp_path / "root"
    args = ["--config", str(config), "--root", str(root), "--name", NAME, "--compresslevel", "2"]
    assert main([*args, "--set", "data.synthetic.seed=5"]) == 0
    folder = root / "ogbn_papers100M"
    assert sorted(p.name for p in (folder / "raw").iterdir()) == ["data.npz", "node-label.npz"]
    assert sorted(p.name for p in (folder / "split" / "time").iterdir()) == [
        "test.csv.gz",
        "train.csv.gz",
        "valid.csv.gz",
    ]
    assert (folder / "RELEASE_v1.txt").is_file()
    with np.load(folder / "raw" / "data.npz", allow_pickle=False) as z:
        assert z["node_feat"].dtype == np.float16 and z["node_year"].shape == (120, 1)
    loaded = load_dataset(NAME.lower(), root=root)  # names are matched whatever their case
    fixture = loaded.info["synthetic_fixture"]
    assert loaded.num_nodes == 120 and fixture["graph_info"]["params"]["seed"] == 5
    assert loaded.fingerprint() == fixture["expected_fingerprint"]
    assert main(args) == 2 and "exists" in capsys.readouterr().err


def test_binary_datasets_are_supported() -> None:
    assert NAME in supported_ogb_names()


def test_features_float16_cannot_hold_are_refused(tmp_path: Path) -> None:
    graph = _graph()
    graph.features[3, 1] = 1e6
    with pytest.raises(ValueError, match="node 3's features exceed float16's range"):
        write_ogb_fixture(graph, tmp_path, NAME)
    assert list(tmp_path.iterdir()) == []  # the half-written folder is removed
