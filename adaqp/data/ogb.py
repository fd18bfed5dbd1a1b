"""OGB node-property datasets (``ogbn-*``), read from OGB's on-disk layout.

Homogeneous, csv-format OGB node datasets such as ``ogbn-arxiv`` and ``ogbn-products`` are
read from OGB's raw layout under ``root/<name with _>/`` (downloaded the way OGB does when the
folder is absent), always symmetrised, with the official split; the parsed arrays are cached
in ``adaqp_cache.npz`` beside the raw files and rebuilt when those change. The ``ogb`` package
is only consulted for its ``master.csv`` and download helpers.
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

from adaqp.data.graph import GRAPH_ARRAYS, GraphData, csr_from_edges

logger = logging.getLogger(__name__)

_CACHE_NAME = "adaqp_cache.npz"
_CACHE_VERSION = 1


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


def _parse_ogb_raw(directory: Path, meta: Any, files: list[str]) -> dict[str, np.ndarray]:
    import pandas as pd

    def read(rel: str, dtype: Any, **kwargs: Any) -> np.ndarray:
        path = directory / rel
        try:
            frame = pd.read_csv(path, header=None, dtype=dtype, compression="gzip", **kwargs)
        except ValueError as exc:  # includes pandas' ParserError
            raise ValueError(f"cannot parse {path}: {exc}") from exc
        return frame.to_numpy()

    n = int(read("raw/num-node-list.csv.gz", np.int64).reshape(-1)[0])
    edges = read("raw/edge.csv.gz", np.int64)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise ValueError(f"{directory / 'raw/edge.csv.gz'} must have 2 columns")
    indptr, indices = csr_from_edges(edges[:, 0], edges[:, 1], n, symmetrize=True)
    num_raw_edges = edges.shape[0]
    del edges
    features = np.ascontiguousarray(read("raw/node-feat.csv.gz", np.float32))
    # An unlabelled node may be written as an empty line, which must still count as a row.
    raw_labels = read("raw/node-label.csv.gz", np.float64, names=[0], skip_blank_lines=False)
    if raw_labels.shape != (n, 1):
        raise ValueError(f"{directory / 'raw/node-label.csv.gz'} must be [{n}, 1]")
    labels = np.where(np.isnan(raw_labels[:, 0]), -1, raw_labels[:, 0]).astype(np.int64)
    if features.shape[0] != n:
        raise ValueError(f"{directory / 'raw/node-feat.csv.gz'} has {features.shape[0]} rows")
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


def _ogb_graph(name: str, meta: Any, arrays: dict[str, np.ndarray]) -> GraphData:
    info = {
        "source": "ogb",
        "metric": meta["eval metric"],
        "evaluator": name,
        "split": meta["split"],
        "symmetrized": True,
        "add_inverse_edge": meta["add_inverse_edge"] == "True",
        "num_raw_edges": int(arrays["num_raw_edges"]),
    }
    graph = GraphData(name, *(arrays[k] for k in GRAPH_ARRAYS), int(meta["num classes"]), info=info)
    graph.validate()
    return graph


def supported_ogb_names() -> list[str]:
    """The ``ogbn-*`` names :func:`load_ogb` reads, from the installed ogb's ``master.csv``.

    Raises:
        ValueError: the ogb package is not installed.
    """
    return _ogb_supported(_ogb_master())


def _ogb_source(name: str, root: Path) -> tuple[dict, Path, list[str]]:
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
    meta, directory, files = _ogb_source(name, root)
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
    meta, directory, files = _ogb_source(name, root)
    cache = directory / _CACHE_NAME
    have_raw = all((directory / f).is_file() for f in files)
    if cache.is_file():
        signature = _source_signature(directory, files) if have_raw else None
        try:
            graph = _ogb_graph(name, meta, _read_ogb_cache(cache, name, signature))
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
    graph = _ogb_graph(name, meta, arrays)
    arrays["format_version"] = np.int64(_CACHE_VERSION)
    arrays["name"] = np.str_(name)
    arrays["source_signature"] = np.str_(_source_signature(directory, files))
    tmp = cache.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, cache)  # atomic, so an interrupted write never leaves a half cache
    return graph
