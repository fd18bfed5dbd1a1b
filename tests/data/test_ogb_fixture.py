"""Tests for adaqp.data.ogb_fixture and the block-wise parse of OGB's raw files it feeds."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from adaqp.data import GraphData, SyntheticSpec, csr_from_edges, generate_synthetic, load_dataset
from adaqp.data import ogb as ogb_data
from adaqp.data.graph import GRAPH_ARRAYS
from adaqp.data.load import check_source
from adaqp.data.ogb_csv import parse_csv_layout
from adaqp.data.ogb_fixture import write_ogb_fixture
from adaqp.ogb_fixture import main
from tests.data.helpers import TINY_CONFIG

SPEC = SyntheticSpec(num_nodes=300, num_classes=5, avg_degree=6.0, feature_dim=7, seed=3)


def _graph() -> GraphData:
    """A small synthetic graph with one unlabelled node (outside every mask) and
    features that need every digit of a float32."""
    graph = generate_synthetic(SPEC, split_seed=0)
    free = int(np.flatnonzero(~(graph.train_mask | graph.val_mask | graph.test_mask))[0])
    graph.labels[free] = -1
    graph.features[0, :3] = [1e-30, -3.4028235e38, np.float32(1) / 3]
    return graph


def _offline(monkeypatch) -> None:
    def no_download(*args, **kwargs):
        raise AssertionError("a complete fixture must never be downloaded over")

    monkeypatch.setattr("ogb.utils.url.download_url", no_download)


def test_fixture_loads_back_exactly(tmp_path: Path, monkeypatch) -> None:
    _offline(monkeypatch)
    graph = _graph()
    folder = write_ogb_fixture(graph, tmp_path, block_values=40)  # many blocks per file
    assert folder == tmp_path / "ogbn_products"
    assert (folder / "raw" / "edge.csv.gz").is_file()
    assert (folder / "split" / "sales_ranking" / "train.csv.gz").is_file()
    with gzip.open(folder / "raw" / "edge.csv.gz", "rt") as fh:
        pairs = np.loadtxt(fh, delimiter=",", dtype=np.int64)
    assert pairs.shape == (graph.num_edges // 2, 2) and np.all(pairs[:, 0] < pairs[:, 1])
    with gzip.open(folder / "raw" / "node-label.csv.gz", "rt") as fh:
        label_lines = fh.read().splitlines()
    assert [i for i, line in enumerate(label_lines) if not line] == [int(np.argmin(graph.labels))]
    check_source("ogbn-products", root=tmp_path)  # complete: nothing to fetch
    for _ in ("raw files", "cache"):
        loaded = load_dataset("ogbn-products", root=tmp_path)
        for key in GRAPH_ARRAYS:
            expected, got = getattr(graph, key), getattr(loaded, key)
            assert got.dtype == expected.dtype and np.array_equal(got, expected), key
        assert loaded.num_classes == 47 and loaded.labels[loaded.labels < 0].size == 1
        fixture = loaded.info["synthetic_fixture"]
        assert loaded.info["source"] == "synthetic-fixture" and fixture["graph"] == "synthetic"
        assert fixture["graph_info"]["params"]["num_nodes"] == SPEC.num_nodes
        assert loaded.fingerprint() == fixture["expected_fingerprint"]
    assert (folder / "adaqp_cache.npz").is_file()
    # The same graph gives the same bytes, so a fixture can be rebuilt and compared.
    again = write_ogb_fixture(graph, tmp_path / "again")
    for rel in ("raw/edge.csv.gz", "raw/node-feat.csv.gz", "raw/node-label.csv.gz"):
        assert (again / rel).read_bytes() == (folder / rel).read_bytes(), rel


def test_loader_without_marker_reports_ogb(tmp_path: Path) -> None:
    folder = write_ogb_fixture(_graph(), tmp_path)
    (folder / ogb_data.FIXTURE_MARKER).unlink()
    assert load_dataset("ogbn-products", root=tmp_path).info["source"] == "ogb"
    (folder / ogb_data.FIXTURE_MARKER).write_text("synthetic, no provenance line\n")
    info = load_dataset("ogbn-products", root=tmp_path).info  # from the cache
    assert info["source"] == "synthetic-fixture"
    assert info["synthetic_fixture"] == {"marker": ogb_data.FIXTURE_MARKER}


def test_fixture_refusals(tmp_path: Path) -> None:
    graph = _graph()
    n = graph.num_nodes
    rows = np.repeat(np.arange(n), np.diff(graph.indptr))
    cols = graph.indices
    upper, lower = np.flatnonzero(cols > rows)[0], np.flatnonzero(cols < rows)[0]
    absent = next((c, d) for c in range(n) for d in range(c) if d not in cols[rows == c])
    one_way = {  # one entry without its mirror: fewer entries above the diagonal than below
        "count": (np.delete(rows, upper), np.delete(cols, upper)),
        # the same counts on both sides, but one entry below has lost its mirror above
        "mirror": (np.append(np.delete(rows, lower), absent[0]),
                   np.append(np.delete(cols, lower), absent[1])),
    }  # fmt: skip
    for r, c in one_way.values():
        indptr, indices = csr_from_edges(c, r, n, symmetrize=False)
        lopsided = dataclasses.replace(graph, indptr=indptr, indices=indices)
        lopsided.validate()
        with pytest.raises(ValueError, match="not symmetric"):
            write_ogb_fixture(lopsided, tmp_path)
        assert list(tmp_path.iterdir()) == []  # the half-written folder is removed
    with pytest.raises(ValueError, match="47 classes"):
        write_ogb_fixture(dataclasses.replace(graph, num_classes=48), tmp_path)
    with pytest.raises(ValueError, match="multilabel"):
        write_ogb_fixture(dataclasses.replace(graph, multilabel=True), tmp_path)
    (tmp_path / "ogbn_products").mkdir()
    with pytest.raises(FileExistsError, match="ogbn_products"):
        write_ogb_fixture(graph, tmp_path)
    assert list((tmp_path / "ogbn_products").iterdir()) == []


def _write_gz(path: Path, text: str) -> None:
    with gzip.open(path, "wt") as fh:
        fh.write(text)


def test_block_parse_equals_one_shot(tmp_path: Path) -> None:
    folder = write_ogb_fixture(_graph(), tmp_path)
    # Raw edges as OGB's files may hold them: both directions, repeats and a self-loop.
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, SPEC.num_nodes, 500), rng.integers(0, SPEC.num_nodes, 500)
    src, dst = (
        np.concatenate([src, dst[:50], src[:50], [7]]),
        np.concatenate([dst, src[:50], dst[:50], [7]]),
    )
    lines = (f"{s},{d}\n" for s, d in zip(src, dst, strict=True))
    _write_gz(folder / "raw" / "edge.csv.gz", "".join(lines))
    _, directory, files = ogb_data.ogb_source("ogbn-products", tmp_path)
    one_shot = parse_csv_layout(directory, files, block_values=1 << 30)
    blocks = parse_csv_layout(directory, files, block_values=5)
    assert one_shot.keys() == blocks.keys()
    for key, value in one_shot.items():
        assert value.dtype == blocks[key].dtype and np.array_equal(value, blocks[key]), key
    indptr, indices = csr_from_edges(src, dst, SPEC.num_nodes, symmetrize=True)
    assert np.array_equal(blocks["indptr"], indptr) and np.array_equal(blocks["indices"], indices)
    assert int(blocks["num_raw_edges"]) == src.size


@pytest.mark.parametrize(
    ("rel", "damage", "message"),
    [
        ("raw/edge.csv.gz", "truncate", "edge.csv.gz"),
        ("raw/node-feat.csv.gz", "garbage", "node-feat.csv.gz"),
        ("raw/node-feat.csv.gz", "short row", "node-feat.csv.gz: row 1 "),
        ("raw/edge.csv.gz", "3,300000\n", "edge.csv.gz holds node ids outside"),
        ("raw/node-label.csv.gz", "1\n2\n", "node-label.csv.gz must be"),
    ],
)
def test_corrupt_raw_file_is_named(tmp_path: Path, rel: str, damage: str, message: str) -> None:
    folder = write_ogb_fixture(_graph(), tmp_path)
    path = folder / rel
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"this is not gzip data at all")
    elif damage == "short row":
        lines = gzip.decompress(path.read_bytes()).decode().splitlines(keepends=True)
        lines[1] = lines[1].rsplit(",", 1)[0] + "\n"
        _write_gz(path, "".join(lines))
    else:
        _write_gz(path, damage)
    with pytest.raises(ValueError, match=message):
        load_dataset("ogbn-products", root=tmp_path)
    assert not (folder / "adaqp_cache.npz").exists()


def test_command_line(tmp_path: Path, capsys) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(TINY_CONFIG)
    root = tmp_path / "root"
    args = ["--config", str(config), "--root", str(root), "--set", "data.synthetic.seed=5"]
    assert main(args) == 0
    loaded = load_dataset("ogbn-products", root=root)
    fixture = loaded.info["synthetic_fixture"]
    assert loaded.num_nodes == 120 and fixture["graph_info"]["params"]["seed"] == 5
    assert fixture["written_by"].startswith("python -m adaqp.ogb_fixture --config")
    assert main(args) == 2 and "exists" in capsys.readouterr().err
    shutil.rmtree(root)
    assert main(["--root", str(root), "--name", "ogbn-mag"]) == 2
    assert not root.exists() or list(root.iterdir()) == []
