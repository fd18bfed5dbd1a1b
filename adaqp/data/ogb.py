"""OGB node-property datasets (``ogbn-*``), read from OGB's on-disk layout.

Homogeneous, csv-format OGB node datasets such as ``ogbn-arxiv`` and ``ogbn-products`` are
read from OGB's raw layout under ``root/<name with _>/`` (downloaded the way OGB does when the
folder is absent), always symmetrised, with the official split; the parsed arrays are cached
in ``adaqp_cache.npz`` beside the raw files and rebuilt when those change. The ``ogb`` package
is only consulted for its ``master.csv`` and download helpers.

The raw files are parsed block by block into arrays allocated once, so the parse needs
little memory beyond the arrays it returns, whatever the dataset's size. A folder holding
:data:`FIXTURE_MARKER` is a synthetic stand-in (:mod:`adaqp.data.ogb_fixture`), and the
graph's ``info`` says so.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from adaqp.data.graph import GRAPH_ARRAYS, GraphData

logger = logging.getLogger(__name__)

_CACHE_NAME = "adaqp_cache.npz"
_CACHE_VERSION = 1
FIXTURE_MARKER = "SYNTHETIC-README.txt"
"""The file that marks a folder in OGB's layout as a synthetic fixture, not the dataset
(written by :mod:`adaqp.data.ogb_fixture`); its provenance line goes into ``info``."""
PARSE_BLOCK_VALUES = 1 << 22
"""Values the raw-file parser reads at a time: its scratch beside the arrays it returns."""
PROVENANCE_PREFIX = "provenance: "
"""Starts the marker's line holding its provenance as one JSON object."""


def _ogb_master() -> Any:
    import pandas as pd

    # find_spec does not execute ogb/__init__, which starts a network version check.
    spec = importlib.util.find_spec("ogb")
    if spec is None or spec.origin is None:
        raise ValueError("the ogb package is required for ogbn-* datasets")
    master = Path(spec.origin).parent / "nodeproppred" / "master.csv"
    return pd.read_csv(master, index_col=0, keep_default_na=False)


def _ogb_supported(master: Any) -> list[str]:
    return [
        name
        for name in master.columns
        if master[name]["is hetero"] != "True"
        and master[name]["binary"] != "True"
        and master[name]["has_node_attr"] == "True"
        and int(master[name]["num tasks"]) == 1
    ]


def _ogb_files(meta: Any) -> list[str]:
    raw = ["edge", "node-feat", "node-label", "num-node-list"]
    split = [f"split/{meta['split']}/{part}.csv.gz" for part in ("train", "valid", "test")]
    return [f"raw/{f}.csv.gz" for f in raw] + split


def _download_ogb(meta: Any, root: Path, directory: Path) -> None:
    """Downloads and unpacks an OGB zip the way OGB does; raises OSError-like on failure."""
    from ogb.utils import url as ogb_url

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".adaqp-download-", dir=root))
    try:
        logger.info("downloading %s to %s", meta["url"], tmp)
        archive = ogb_url.download_url(meta["url"], str(tmp), log=False)
        ogb_url.extract_zip(archive, str(tmp), log=False)
        extracted = tmp / meta["download_name"]
        if not extracted.is_dir():
            raise OSError(f"archive did not contain the folder {meta['download_name']!r}")
        shutil.move(str(extracted), str(directory))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_blocks(path: Path, dtype: Any, block_rows: int, **kwargs: Any) -> Iterator[np.ndarray]:
    """Yields the rows of the csv.gz ``path`` as numpy arrays of at most ``block_rows`` rows.

    Raises:
        ValueError: naming ``path``, where it is not csv of ``dtype`` or not intact gzip.
    """
    import pandas as pd

    try:
        reader = pd.read_csv(
            path, header=None, dtype=dtype, compression="gzip", chunksize=block_rows, **kwargs
        )
        with reader:
            for frame in reader:
                yield frame.to_numpy()
    # ValueError includes pandas' ParserError; EOFError is a truncated file; OSError
    # (gzip.BadGzipFile) and zlib.error a corrupt one.
    except (ValueError, EOFError, OSError, zlib.error) as exc:
        raise ValueError(f"cannot parse {path}: {exc}") from exc


def _read_edges(path: Path, n: int, block_rows: int) -> list[np.ndarray]:
    """``path``'s edges as [rows, 2] blocks, int32 where ``n`` allows (half the memory)."""
    id_dtype = np.int32 if n <= np.iinfo(np.int32).max else np.int64
    blocks = []
    for block in _read_blocks(path, np.int64, block_rows):
        if block.ndim != 2 or block.shape[1] != 2:
            raise ValueError(f"{path} must have 2 columns")
        if block.size and (block.min() < 0 or block.max() >= n):
            raise ValueError(f"{path} holds node ids outside [0, {n})")
        blocks.append(block.astype(id_dtype))
    return blocks


def _csr_from_blocks(blocks: list[np.ndarray], n: int, block_entries: int) -> tuple:
    """The canonical symmetric in-edge CSR of the edge ``blocks`` (emptied on the way):
    the arrays ``csr_from_edges(src, dst, n, symmetrize=True)`` returns, built in place in
    one ``indices`` array instead of sorting every edge's key at once."""
    degree = np.zeros(n, dtype=np.int64)
    for block in blocks:
        degree += np.bincount(block[:, 0], minlength=n)
        degree += np.bincount(block[:, 1], minlength=n)
    start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=start[1:])
    del degree
    # Scatter both directions of every edge into its row, in any order within the row.
    indices = np.empty(int(start[-1]), dtype=np.int64)
    cursor = start[:-1].copy()
    for i, block in enumerate(blocks):
        blocks[i] = None  # placed blocks are freed as the rows fill
        rows = np.concatenate([block[:, 1], block[:, 0]])
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        counts = np.bincount(rows, minlength=n)
        rank = np.arange(rows.shape[0]) - (np.cumsum(counts) - counts)[rows]
        indices[cursor[rows] + rank] = np.concatenate([block[:, 0], block[:, 1]])[order]
        cursor += counts
    del cursor
    # Sort each row, drop duplicates and self-loops, and move the rows down over the gaps:
    # a row only ever moves to lower positions, so one pass over row blocks suffices.
    indptr = np.zeros(n + 1, dtype=np.int64)
    cuts = np.searchsorted(start, np.arange(0, start[-1], block_entries), side="right") - 1
    bounds = np.unique(np.concatenate([cuts.clip(0, n), [0, n]]))
    written = 0
    for r0, r1 in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        e0, e1 = int(start[r0]), int(start[r1])
        rows = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(start[r0 : r1 + 1]))
        keys = rows * n + indices[e0:e1]  # row-major keys, as in csr_from_edges
        keys.sort()
        keep = np.ones(keys.shape[0], dtype=bool)
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        keep &= keys % (n + 1) != 0  # self-loop u -> u has key u * (n + 1)
        keys = keys[keep]
        kept = np.bincount(rows[keep] - r0, minlength=r1 - r0)
        indptr[r0 + 1 : r1 + 1] = written + np.cumsum(kept)
        indices[written : written + keys.shape[0]] = keys % n if n else keys
        written += keys.shape[0]
    # No view of indices is left; resize gives the tail back without a second copy.
    indices.resize(written, refcheck=False)
    return indptr, indices


def _read_features(path: Path, n: int, block_values: int) -> np.ndarray:
    """``path``'s float32 [n, F] features, parsed block by block into one array."""
    features = None
    rows = 0
    # The width is known only once a block is read: blocks of rows of 128 values.
    for block in _read_blocks(path, np.float32, max(1, block_values // 128)):
        if features is None:
            features = np.empty((n, block.shape[1]), dtype=np.float32)
        if block.shape[1] != features.shape[1] or rows + block.shape[0] > n:
            raise ValueError(f"{path} must be [{n}, {features.shape[1]}]")
        if np.isnan(block).any():  # pandas fills a short row with NaN
            bad = rows + int(np.flatnonzero(np.isnan(block).any(axis=1))[0])
            raise ValueError(f"{path}: row {bad} has a missing or non-numeric value")
        features[rows : rows + block.shape[0]] = block
        rows += block.shape[0]
    if features is None or rows != n:
        raise ValueError(f"{path} has {rows} rows, expected {n}")
    return features


def _parse_ogb_raw(
    directory: Path, meta: Any, files: list[str], block_values: int = PARSE_BLOCK_VALUES
) -> dict[str, np.ndarray]:
    """The arrays of the raw files, parsed in blocks of about ``block_values`` values;
    the result does not depend on ``block_values``."""

    def read(rel: str, dtype: Any, **kwargs: Any) -> np.ndarray:
        blocks = list(_read_blocks(directory / rel, dtype, block_values, **kwargs))
        return np.concatenate(blocks)

    n = int(read("raw/num-node-list.csv.gz", np.int64).reshape(-1)[0])
    blocks = _read_edges(directory / "raw/edge.csv.gz", n, max(1, block_values // 2))
    num_raw_edges = sum(block.shape[0] for block in blocks)
    indptr, indices = _csr_from_blocks(blocks, n, block_values)
    features = _read_features(directory / "raw/node-feat.csv.gz", n, block_values)
    # An unlabelled node may be written as an empty line, which must still count as a row.
    raw_labels = read("raw/node-label.csv.gz", np.float64, names=[0], skip_blank_lines=False)
    if raw_labels.shape != (n, 1):
        raise ValueError(f"{directory / 'raw/node-label.csv.gz'} must be [{n}, 1]")
    labels = np.where(np.isnan(raw_labels[:, 0]), -1, raw_labels[:, 0]).astype(np.int64)
    out = {"indptr": indptr, "indices": indices, "features": features, "labels": labels}
    for key, rel in zip(("train_mask", "val_mask", "test_mask"), files[-3:], strict=True):
        ids = read(rel, np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"{directory / rel} holds node ids outside [0, {n})")
        mask = np.zeros(n, dtype=bool)
        mask[ids] = True
        dropped = int(np.count_nonzero(mask & (labels < 0)))
        if dropped:
            logger.warning("%s: dropping %d unlabelled nodes from %s", directory, dropped, key)
            mask &= labels >= 0
        out[key] = mask
    out["num_raw_edges"] = np.int64(num_raw_edges)
    return out


def _source_signature(directory: Path, files: list[str]) -> str:
    return json.dumps({f: (directory / f).stat().st_size for f in files}, sort_keys=True)


def _read_ogb_cache(cache: Path, name: str, signature: str | None) -> dict[str, np.ndarray]:
    with np.load(cache, allow_pickle=False) as z:
        arrays = {key: z[key] for key in z.files}
    if int(arrays.get("format_version", -1)) != _CACHE_VERSION:
        raise ValueError(f"format_version {arrays.get('format_version')} != {_CACHE_VERSION}")
    if str(arrays.get("name")) != name:
        raise ValueError(f"cache is for {arrays.get('name')!r}, not {name!r}")
    if signature is not None and str(arrays.get("source_signature")) != signature:
        raise ValueError("raw files changed since the cache was written")
    return arrays


def read_fixture_marker(directory: Path) -> dict | None:
    """The provenance of the synthetic fixture in ``directory``, or None where the folder
    holds no :data:`FIXTURE_MARKER`; a marker without a readable provenance line still
    marks the folder synthetic."""
    marker = directory / FIXTURE_MARKER
    if not marker.is_file():
        return None
    for line in marker.read_text(errors="replace").splitlines():
        if line.startswith(PROVENANCE_PREFIX):
            try:
                provenance = json.loads(line[len(PROVENANCE_PREFIX) :])
            except json.JSONDecodeError:
                break
            if isinstance(provenance, dict):
                return {"marker": FIXTURE_MARKER, **provenance}
    return {"marker": FIXTURE_MARKER}


def _ogb_graph(name: str, meta: Any, arrays: dict[str, np.ndarray], directory: Path) -> GraphData:
    fixture = read_fixture_marker(directory)
    info = {
        # A fixture has OGB's layout and split names but none of the dataset's content.
        "source": "ogb" if fixture is None else "synthetic-fixture",
        "metric": meta["eval metric"],
        "evaluator": name,
        "split": meta["split"],
        "symmetrized": True,
        "add_inverse_edge": meta["add_inverse_edge"] == "True",
        "num_raw_edges": int(arrays["num_raw_edges"]),
    }
    if fixture is not None:
        info["synthetic_fixture"] = fixture
    graph = GraphData(name, *(arrays[k] for k in GRAPH_ARRAYS), int(meta["num classes"]), info=info)
    graph.validate()
    return graph


def supported_ogb_names() -> list[str]:
    """The ``ogbn-*`` names :func:`load_ogb` reads, from the installed ogb's ``master.csv``.

    Raises:
        ValueError: the ogb package is not installed.
    """
    return _ogb_supported(_ogb_master())


def ogb_source(name: str, root: Path) -> tuple[dict, Path, list[str]]:
    """``name``'s OGB metadata, its folder under ``root`` and its raw files there.

    Raises:
        ValueError: ``name`` is not a supported OGB dataset.
    """
    master = _ogb_master()
    supported = _ogb_supported(master)
    if name not in supported:
        raise ValueError(f"unsupported OGB dataset {name!r}; supported: {', '.join(supported)}")
    meta = master[name]
    return meta, root / name.replace("-", "_"), _ogb_files(meta)


def check_ogb_files(name: str, root: Path) -> None:
    """Raises, changing nothing, where ``load_ogb`` could not read ``name`` from ``root``
    without a download: an unsupported name (ValueError), or neither the raw files nor a
    cache (FileNotFoundError, saying how to get them). A training job refuses then,
    before any worker starts; ``python -m partition`` still downloads where it can."""
    meta, directory, files = ogb_source(name, root)
    missing = [f for f in files if not (directory / f).is_file()]
    if not missing or (directory / _CACHE_NAME).is_file():
        return
    raise FileNotFoundError(
        f"{name}: missing {', '.join(missing[:2])}{' ...' if len(missing) > 2 else ''} under "
        f"{directory}: download {meta['url']}, unzip it and move its "
        f"'{meta['download_name']}' folder to {directory} (or, where the network allows, "
        f"`python -m partition --dataset {name} --set data.root={root} --num-parts P --out "
        "DIR` fetches it)"
    )


def load_ogb(name: str, root: Path) -> GraphData:
    """Loads the OGB dataset ``name`` from ``root`` as described above: from the cache when it
    matches the raw files, else from the raw files (downloaded when their folder is absent).

    Raises:
        ValueError: ``name`` is not supported, or ogb is not installed.
        FileNotFoundError: the raw files are missing and could not be downloaded.
    """
    meta, directory, files = ogb_source(name, root)
    cache = directory / _CACHE_NAME
    have_raw = all((directory / f).is_file() for f in files)
    if cache.is_file():
        signature = _source_signature(directory, files) if have_raw else None
        try:
            graph = _ogb_graph(name, meta, _read_ogb_cache(cache, name, signature), directory)
            logger.info("loaded %s from cache %s", name, cache)
            return graph
        except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as exc:
            logger.warning("ignoring unusable cache %s (%s); rebuilding from raw files", cache, exc)
    if not have_raw and not directory.exists():
        try:
            _download_ogb(meta, root, directory)
        except (OSError, RuntimeError, zipfile.BadZipFile) as exc:
            logger.warning("download of %s failed: %s", meta["url"], exc)
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{name}: missing {', '.join(missing)} under {directory}. Download "
            f"{meta['url']} (automatic download failed or was skipped because the folder "
            f"exists), unzip it and move its '{meta['download_name']}' folder to "
            f"{directory} so that e.g. {directory / files[0]} exists."
        )
    logger.info("parsing OGB raw files of %s in %s", name, directory)
    arrays = _parse_ogb_raw(directory, meta, files)
    graph = _ogb_graph(name, meta, arrays, directory)
    arrays["format_version"] = np.int64(_CACHE_VERSION)
    arrays["name"] = np.str_(name)
    arrays["source_signature"] = np.str_(_source_signature(directory, files))
    tmp = cache.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, cache)  # atomic, so an interrupted write never leaves a half cache
    return graph
