"""Tests for adaqp.data.ogb: OGB's raw layout, the parse cache and the download."""

from __future__ import annotations

import gzip
import logging
import shutil
import urllib.error
import zipfile
from pathlib import Path

import numpy as np
import pytest

from adaqp.data import csr_from_edges, load_dataset
from adaqp.data import ogb as ogb_data


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
        m.setattr(ogb_data, "parse_csv_layout", no_parse)
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
        assert int(z["format_version"]) == ogb_data._CACHE_VERSION

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
