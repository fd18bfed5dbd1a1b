"""OGB node-property datasets (``ogbn-*``), read from OGB's on-disk layout.

Homogeneous OGB node datasets with node features and one task (``ogbn-arxiv``,
``ogbn-products``, ``ogbn-papers100M``) are read from OGB's raw layout under
``root/<name with _>/`` (downloaded the way OGB does when the folder is absent), always
symmetrised, with the official split. ``master.csv``'s ``binary`` column says which of
OGB's two layouts a dataset has:

- csv (:mod:`adaqp.data.ogb_csv`): ``raw/*.csv.gz``, parsed block by block; the parsed
  arrays are cached in ``adaqp_cache.npz`` beside the raw files and rebuilt when those
  change (the parse takes minutes at ogbn-products' size);
- binary (:mod:`adaqp.data.ogb_binary`): ``raw/data.npz`` and ``raw/node-label.npz``,
  read mapped or in blocks; no cache, the files being binary already.

The ``ogb`` package is only consulted for its ``master.csv`` and download helpers. A
folder holding :data:`FIXTURE_MARKER` is a synthetic stand-in
(:mod:`adaqp.data.ogb_fixture`), and the graph's ``info`` says so.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from adaqp.data.graph import GRAPH_ARRAYS, GraphData
from adaqp.data.ogb_binary import DATA_FILE, LABEL_FILE, parse_binary_layout
from adaqp.data.ogb_csv import parse_csv_layout

logger = logging.getLogger(__name__)

_CACHE_NAME = "adaqp_cache.npz"
_CACHE_VERSION = 1
FIXTURE_MARKER = "SYNTHETIC-README.txt"
"""The file that marks a folder in OGB's layout as a synthetic fixture, not the dataset
(written by :mod:`adaqp.data.ogb_fixture`); its provenance line goes into ``info``."""
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
        and master[name]["has_node_attr"] == "True"
        and int(master[name]["num tasks"]) == 1
    ]


def is_binary(meta: Any) -> bool:
    """Whether the dataset ``meta`` (its ``master.csv`` column) has OGB's binary layout."""
    return meta["binary"] == "True"


def _ogb_files(meta: Any) -> list[str]:
    """The files the loader reads, relative to the dataset's folder; the split's three last."""
    split = [f"split/{meta['split']}/{part}.csv.gz" for part in ("train", "valid", "test")]
    if is_binary(meta):
        return [DATA_FILE, LABEL_FILE, *split]
    raw = ["edge", "node-feat", "node-label", "num-node-list"]
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
    # load_dataset lowers names; OGB's keep their case (ogbn-papers100M), as must the
    # folder (ogbn_papers100M) and the Evaluator's name: meta.name is OGB's spelling.
    spelled = {key.lower(): key for key in supported}.get(name.lower())
    if spelled is None:
        raise ValueError(f"unsupported OGB dataset {name!r}; supported: {', '.join(supported)}")
    meta = master[spelled]
    return meta, root / spelled.replace("-", "_"), _ogb_files(meta)


def check_ogb_files(name: str, root: Path) -> None:
    """Raises, changing nothing, where ``load_ogb`` could not read ``name`` from ``root``
    without a download: an unsupported name (ValueError), or neither the raw files nor a
    cache (FileNotFoundError, saying how to get them). A training job refuses then,
    before any worker starts; ``python -m partition`` still downloads where it can."""
    meta, directory, files = ogb_source(name, root)
    missing = [f for f in files if not (directory / f).is_file()]
    if not missing or (not is_binary(meta) and (directory / _CACHE_NAME).is_file()):
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
    matches the raw files (csv layout), else from the raw files (downloaded when their
    folder is absent).

    Raises:
        ValueError: ``name`` is not supported, ogb is not installed, or a raw file is
            damaged (the message names it).
        FileNotFoundError: the raw files are missing and could not be downloaded.
    """
    meta, directory, files = ogb_source(name, root)
    name, binary = meta.name, is_binary(meta)
    cache = directory / _CACHE_NAME
    have_raw = all((directory / f).is_file() for f in files)
    if cache.is_file() and not binary:
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
    if binary:
        logger.info("reading OGB binary files of %s in %s", name, directory)
        return _ogb_graph(name, meta, parse_binary_layout(directory, files), directory)
    logger.info("parsing OGB raw files of %s in %s", name, directory)
    arrays = parse_csv_layout(directory, files)
    graph = _ogb_graph(name, meta, arrays, directory)
    arrays["format_version"] = np.int64(_CACHE_VERSION)
    arrays["name"] = np.str_(name)
    arrays["source_signature"] = np.str_(_source_signature(directory, files))
    tmp = cache.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, cache)  # atomic, so an interrupted write never leaves a half cache
    return graph
