"""Graph datasets for AdaQP: one in-memory format and loaders that produce it.

Every loader returns a :class:`GraphData` whose adjacency is a CSR of *in-edges*: row ``u``
lists the sources ``v`` of the edges ``v -> u`` (sorted, no duplicates, no self-loops), which
is the layout a GCN aggregation ``h_u = sum_v h_v`` consumes directly.

Sources accepted by :func:`load_dataset`:

* ``cora``, ``citeseer``: shipped in ``adaqp/data``; symmetrised, raw binary bag-of-words
  features (no row normalisation), random 20-per-class / 500 / 1000 split.
* ``synthetic``: a seeded contextual stochastic block model, see :class:`SyntheticSpec`.
* ``ogbn-*`` (homogeneous, csv-format OGB node datasets such as ``ogbn-arxiv`` and
  ``ogbn-products``): read from OGB's raw layout under ``root/<name with _>/``, always
  symmetrised, official split; parsed arrays are cached in ``adaqp_cache.npz``.
* ``npz``: a user file given by ``path``, read with ``allow_pickle=False``. Required keys:
  ``indptr`` int [N+1] and ``indices`` int [E] (in-edge CSR; rows may be unsorted or hold
  duplicates/self-loops, which are normalised away), ``features`` float [N, F] (stored as
  float32), ``labels`` int [N] (``-1`` = unlabelled) or 0/1 float [N, C] (multilabel),
  ``train_mask``/``val_mask``/``test_mask`` bool [N]. Optional scalars: ``num_classes`` int
  (default inferred from ``labels``), ``multilabel`` bool (default ``labels.ndim == 2``),
  ``symmetrize`` bool (add reverse edges; default False), ``name`` str (default the file
  stem), ``info`` str (JSON provenance). :func:`save_npz` writes this format.

:func:`from_pyg` and :func:`from_dgl` convert in-memory PyG / DGL graphs (duck-typed, so
neither library is imported here).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

_CACHE_NAME = "adaqp_cache.npz"
_CACHE_VERSION = 1
_BUILTIN = ("cora", "citeseer")
_ARRAYS = ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask")
_MASKS = _ARRAYS[4:]
# Bounds the temporaries of validate() to a few hundred MB even for 100M+ edge graphs.
_VALIDATE_CHUNK = 1 << 24


@dataclass(repr=False)
class GraphData:
    """One in-memory graph.

    Attributes:
        name: Dataset name.
        indptr: int64 [N+1] CSR of in-edges: row ``u`` lists the sources ``v`` of ``v -> u``.
        indices: int64 [E], sorted within each row, no duplicates, no self-loops.
        features: float32 [N, F], C-contiguous.
        labels: int64 [N] (``-1`` = unlabelled), or float32 [N, C] of 0/1 if ``multilabel``.
        train_mask, val_mask, test_mask: bool [N], pairwise disjoint.
        num_classes: Number of classes (columns of ``labels`` when multilabel).
        multilabel: Whether ``labels`` is a multilabel matrix.
        info: JSON-serialisable provenance (source, split seed, generator params, metric...).
    """

    name: str
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    multilabel: bool = False
    info: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def num_edges(self) -> int:
        """Number of stored (directed) CSR entries; an undirected edge counts twice."""
        return int(self.indices.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    def __repr__(self) -> str:
        return (
            f"GraphData(name={self.name!r}, num_nodes={self.num_nodes}, "
            f"num_edges={self.num_edges}, feature_dim={self.feature_dim}, "
            f"num_classes={self.num_classes}, multilabel={self.multilabel}, "
            f"train/val/test={int(self.train_mask.sum())}/{int(self.val_mask.sum())}/"
            f"{int(self.test_mask.sum())})"
        )

    def validate(self) -> None:
        """Checks dtypes, shapes, index ranges and CSR canonical form.

        Raises:
            ValueError: naming the offending field.
        """
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        _check_array("indptr", self.indptr, np.int64, 1)
        n = self.num_nodes
        _check_array("indices", self.indices, np.int64, 1)
        _check_csr_structure(self.indptr, self.indices, n)
        problem = _csr_problem(self.indptr, self.indices)
        if problem is not None:
            raise ValueError(f"indices: {problem}")
        _check_array("features", self.features, np.float32, 2, rows=n)
        if not self.features.flags.c_contiguous:
            raise ValueError("features must be C-contiguous")
        if not isinstance(self.num_classes, int | np.integer) or self.num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {self.num_classes!r}")
        if self.multilabel:
            _check_array("labels", self.labels, np.float32, 2, rows=n)
            if self.labels.shape[1] != self.num_classes:
                raise ValueError(
                    f"labels has {self.labels.shape[1]} columns but num_classes={self.num_classes}"
                )
        else:
            _check_array("labels", self.labels, np.int64, 1, rows=n)
            if n and (self.labels.min() < -1 or self.labels.max() >= self.num_classes):
                raise ValueError(
                    f"labels must lie in [-1, {self.num_classes}), got range "
                    f"[{self.labels.min()}, {self.labels.max()}]"
                )
        for key in _MASKS:
            mask = getattr(self, key)
            _check_array(key, mask, np.bool_, 1, rows=n)
            if not self.multilabel and np.any(self.labels[mask] < 0):
                raise ValueError(f"{key} selects nodes with label -1 (unlabelled)")
        if np.any(self.train_mask & self.val_mask) or np.any(self.test_mask & self.val_mask):
            raise ValueError("val_mask overlaps train_mask or test_mask")
        if np.any(self.train_mask & self.test_mask):
            raise ValueError("train_mask overlaps test_mask")
        try:
            json.dumps(self.info)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"info is not JSON-serialisable: {exc}") from exc

    def fingerprint(self) -> str:
        """Returns a 32-hex-digit content hash of name, num_classes and all arrays."""
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.name}\0{int(self.num_classes)}\0{bool(self.multilabel)}".encode())
        for key in _ARRAYS:
            arr = np.ascontiguousarray(getattr(self, key))
            h.update(f"\0{key}:{arr.dtype.str}:{arr.shape}\0".encode())
            h.update(arr.data)  # raw buffer: hashing runs at memory speed
        return h.hexdigest()

    def symmetrized(self) -> GraphData:
        """Returns a copy whose adjacency is the union of both edge directions."""
        rows = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        indptr, indices = csr_from_edges(self.indices, rows, self.num_nodes, symmetrize=True)
        return dataclasses.replace(
            self, indptr=indptr, indices=indices, info={**self.info, "symmetrized": True}
        )


def _check_array(key: str, arr: Any, dtype: type, ndim: int, rows: int | None = None) -> None:
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{key} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != dtype or arr.ndim != ndim:
        raise ValueError(
            f"{key} must be {np.dtype(dtype).name} with {ndim} dims, got {arr.dtype} {arr.shape}"
        )
    if rows is not None and arr.shape[0] != rows:
        raise ValueError(f"{key} has {arr.shape[0]} rows, expected num_nodes={rows}")


def _check_csr_structure(indptr: np.ndarray, indices: np.ndarray, n: int) -> None:
    if indptr.shape[0] == 0:
        raise ValueError("indptr must have at least one element")
    if indptr[0] != 0 or indptr[-1] != indices.shape[0]:
        raise ValueError(
            f"indptr must start at 0 and end at len(indices)={indices.shape[0]}, got "
            f"{indptr[0]}..{indptr[-1]}"
        )
    if np.any(np.diff(indptr) < 0):
        raise ValueError("indptr must be non-decreasing")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise ValueError(
            f"indices must lie in [0, {n}), got range [{indices.min()}, {indices.max()}]"
        )


def _row_chunks(indptr: np.ndarray, max_entries: int) -> Iterator[tuple[int, int]]:
    """Yields row ranges [r0, r1) holding about ``max_entries`` CSR entries each."""
    n = indptr.shape[0] - 1
    cuts = np.searchsorted(indptr, np.arange(0, indptr[-1], max_entries), side="right") - 1
    bounds = np.unique(np.concatenate([cuts.clip(0, n), [0, n]]))
    for r0, r1 in zip(bounds[:-1], bounds[1:], strict=True):
        yield int(r0), int(r1)


def _csr_problem(indptr: np.ndarray, indices: np.ndarray) -> str | None:
    """Returns why a structurally valid CSR is not canonical, or None if it is."""
    for r0, r1 in _row_chunks(indptr, _VALIDATE_CHUNK):
        e0, e1 = indptr[r0], indptr[r1]
        rows = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(indptr[r0 : r1 + 1]))
        cols = indices[e0:e1]
        loops = np.flatnonzero(cols == rows)
        if loops.size:
            return f"self-loop at node {rows[loops[0]]}"
        bad = np.flatnonzero((np.diff(cols) <= 0) & (rows[1:] == rows[:-1]))
        if bad.size:
            return f"row {rows[bad[0]]} is not strictly increasing (unsorted or duplicate)"
    return None


def csr_from_edges(
    src: np.ndarray, dst: np.ndarray, num_nodes: int, *, symmetrize: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Builds a canonical in-edge CSR from an edge list.

    Args:
        src: int [E] edge sources ``v``.
        dst: int [E] edge targets ``u``; edge ``v -> u`` is stored in row ``u``.
        num_nodes: N.
        symmetrize: Also store ``u -> v`` for every edge.

    Returns:
        ``(indptr int64 [N+1], indices int64 [E'])`` sorted within rows, without self-loops
        or duplicates.
    """
    src = np.asarray(src).reshape(-1)
    dst = np.asarray(dst).reshape(-1)
    n = int(num_nodes)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst differ in length: {src.shape[0]} vs {dst.shape[0]}")
    if not 0 <= n <= 3_037_000_499:  # n * n must fit in int64 for the combined sort key
        raise ValueError(f"num_nodes={n} out of supported range")
    for key, arr in (("src", src), ("dst", dst)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{key} must be integer, got {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            raise ValueError(f"{key} ids must lie in [0, {n}), got [{arr.min()}, {arr.max()}]")
    m = src.shape[0]
    # One int64 key per entry (row-major) lets a single in-place sort do all the work.
    keys = np.empty(2 * m if symmetrize else m, dtype=np.int64)
    np.multiply(dst, n, out=keys[:m], dtype=np.int64, casting="unsafe")
    keys[:m] += src
    if symmetrize:
        np.multiply(src, n, out=keys[m:], dtype=np.int64, casting="unsafe")
        keys[m:] += dst
    keys.sort()
    keep = np.empty(keys.shape[0], dtype=bool)
    if keys.size:
        keep[0] = True
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        # Self-loop u -> u has key u * (n + 1), and no other key below n * n is a multiple.
        keep &= keys % (n + 1) != 0
        keys = keys[keep]
    del keep
    indptr = np.searchsorted(keys, np.arange(n + 1, dtype=np.int64) * n).astype(np.int64)
    np.remainder(keys, n if n else 1, out=keys)
    return indptr, keys


def random_split(
    labels: np.ndarray,
    num_classes: int,
    seed: int,
    per_class: int = 20,
    num_val: int = 500,
    num_test: int = 1000,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Semi-supervised benchmark split: ``per_class`` train nodes per class, then val/test.

    Args:
        labels: int [N]; negative entries are unlabelled and never selected.
        num_classes: C.
        seed: Seed for ``np.random.default_rng``.
        per_class: Training nodes per class (fewer if a class is smaller, with a warning).
        num_val: Validation nodes drawn from the remaining labelled nodes.
        num_test: Test nodes drawn after the validation nodes.

    Returns:
        ``(train_mask, val_mask, test_mask)``, bool [N] each, pairwise disjoint.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(labels.shape[0])
    perm = perm[labels[perm] >= 0]
    perm_labels = labels[perm]
    train = np.zeros(labels.shape[0], dtype=bool)
    for c in range(num_classes):
        members = perm[perm_labels == c]
        if members.shape[0] < per_class:
            logger.warning("class %d has only %d labelled nodes", c, members.shape[0])
        train[members[:per_class]] = True
    rest = perm[~train[perm]]
    if rest.shape[0] < num_val + num_test:
        raise ValueError(
            f"only {rest.shape[0]} labelled nodes left after training selection; need "
            f"num_val + num_test = {num_val + num_test}"
        )
    val = np.zeros_like(train)
    val[rest[:num_val]] = True
    test = np.zeros_like(train)
    test[rest[num_val : num_val + num_test]] = True
    return train, val, test


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of the contextual stochastic block model behind ``load_dataset("synthetic")``.

    Class centres are random unit-norm vectors, so with ``feature_noise=1`` features alone
    are only weakly informative and neighbourhood aggregation is needed for high accuracy.
    """

    num_nodes: int = 10000
    """Number of nodes N (classes are balanced)."""
    num_classes: int = 8
    """Number of classes C (at least 2)."""
    avg_degree: float = 20.0
    """Average undirected degree after symmetrisation (approximate: duplicates are dropped)."""
    homophily: float = 0.7
    """Probability that an edge's endpoints share a class."""
    feature_dim: int = 64
    """Feature dimension F."""
    feature_noise: float = 1.0
    """Standard deviation of the Gaussian noise around the class centres."""
    power_law: float = 0.0
    """0: roughly uniform degrees; > 1: degree propensity ~ Pareto density w^-power_law."""
    seed: int = 0
    """Seed of the graph, features and labels."""
    train_fraction: float = 0.1
    """Fraction of nodes in the training set."""
    val_fraction: float = 0.1
    """Fraction of nodes in the validation set."""
    test_fraction: float = 0.2
    """Fraction of nodes in the test set."""

    def __post_init__(self) -> None:
        ints = ("num_nodes", "num_classes", "feature_dim", "seed")
        for key in ints:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"SyntheticSpec.{key} must be an int, got {value!r}")
        checks = {
            "num_classes": self.num_classes >= 2,
            "num_nodes": self.num_nodes >= self.num_classes,
            "avg_degree": 0 < self.avg_degree < self.num_nodes - 1,
            "homophily": 0.0 <= self.homophily <= 1.0,
            "feature_dim": self.feature_dim >= 1,
            "feature_noise": self.feature_noise >= 0.0,
            "power_law": self.power_law == 0.0 or self.power_law > 1.0,
            "seed": self.seed >= 0,
            "train_fraction": 0.0 < self.train_fraction <= 1.0,
            "val_fraction": 0.0 <= self.val_fraction <= 1.0,
            "test_fraction": 0.0 <= self.test_fraction <= 1.0,
        }
        total = self.train_fraction + self.val_fraction + self.test_fraction
        checks["test_fraction"] = checks["test_fraction"] and total <= 1.0 + 1e-9
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"SyntheticSpec.{key}={getattr(self, key)!r} is invalid")


def generate_synthetic(spec: SyntheticSpec, split_seed: int = 0) -> GraphData:
    """Samples a contextual SBM graph; the same ``spec`` gives the same graph.

    ``N * avg_degree / 2`` edges are drawn (source weighted by degree propensity; target of
    the same class with probability ``homophily``, else of a uniform other class, weighted by
    propensity within the class) and then symmetrised. The split is a random fractional one
    seeded by ``(spec.seed, split_seed)``.
    """
    n, c = spec.num_nodes, spec.num_classes
    rng = np.random.default_rng(spec.seed)
    labels = rng.permutation(np.arange(n, dtype=np.int64) % c)
    order = np.argsort(labels, kind="stable")  # nodes grouped by class
    class_ptr = np.zeros(c + 1, dtype=np.int64)
    np.cumsum(np.bincount(labels, minlength=c), out=class_ptr[1:])
    m = int(round(n * spec.avg_degree / 2))
    if spec.power_law > 0:
        # numpy's pareto(a) is Lomax with density ~ (1+x)^-(a+1): shift by 1 for classic Pareto.
        weight = 1.0 + rng.pareto(spec.power_law - 1.0, size=n)
        cum = np.zeros(n + 1)
        np.cumsum(weight[order], out=cum[1:])
        pos = np.searchsorted(cum, rng.random(m) * cum[-1], side="right") - 1
        src = order[pos.clip(0, n - 1)]
    else:
        src = rng.integers(0, n, size=m, dtype=np.int64)
    target_class = labels[src]
    other = rng.random(m) >= spec.homophily
    shift = rng.integers(1, c, size=int(other.sum()), dtype=np.int64)
    target_class[other] = (target_class[other] + shift) % c
    del other, shift
    if spec.power_law > 0:
        lo, hi = cum[class_ptr[target_class]], cum[class_ptr[target_class + 1]]
        pos = np.searchsorted(cum, lo + rng.random(m) * (hi - lo), side="right") - 1
        del lo, hi
    else:
        size = np.diff(class_ptr)[target_class]
        pos = class_ptr[target_class] + (rng.random(m) * size).astype(np.int64)
        del size
    # Rounding can land one past the class end; clamp into the chosen class.
    pos = np.minimum(np.maximum(pos, class_ptr[target_class]), class_ptr[target_class + 1] - 1)
    dst = order[pos]
    del pos, target_class
    homophily = float(np.mean(labels[src] == labels[dst])) if m else 0.0
    indptr, indices = csr_from_edges(src, dst, n, symmetrize=True)
    del src, dst

    centres = rng.standard_normal((c, spec.feature_dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    features = rng.standard_normal((n, spec.feature_dim), dtype=np.float32)
    features *= np.float32(spec.feature_noise)
    features += centres.astype(np.float32)[labels]

    perm = np.random.default_rng([spec.seed, split_seed]).permutation(n)
    fractions = np.cumsum([spec.train_fraction, spec.val_fraction, spec.test_fraction])
    bounds = [0, *np.minimum(np.round(fractions * n), n).astype(int).tolist()]
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    for mask, lo, hi in zip(masks, bounds[:-1], bounds[1:], strict=True):
        mask[perm[lo:hi]] = True
    sizes = [int(mask.sum()) for mask in masks]
    info = {
        "source": "synthetic",
        "generator": "contextual_sbm",
        "params": dataclasses.asdict(spec),
        "split_seed": split_seed,
        "split_sizes": sizes,
        "sampled_edges": m,
        "sampled_edge_homophily": homophily,
        "symmetrized": True,
        "metric": "acc",
    }
    return GraphData("synthetic", indptr, indices, features, labels, *masks, c, info=info)


def _load_builtin(name: str, split_seed: int) -> GraphData:
    path = Path(__file__).parent / "data" / f"{name}.npz"
    if not path.is_file():
        raise FileNotFoundError(f"built-in dataset file {path} is missing from the package")
    with np.load(path, allow_pickle=False) as z:
        adj_shape = tuple(int(s) for s in z["adj_shape"])
        n = adj_shape[0]
        adj_indptr = z["adj_indptr"].astype(np.int64)
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(adj_indptr))
        # The file stores one directed edge per citation; citation direction is irrelevant.
        indptr, indices = csr_from_edges(rows, z["adj_indices"], n, symmetrize=True)
        attr_shape = tuple(int(s) for s in z["attr_shape"])
        features = np.zeros(attr_shape, dtype=np.float32)
        attr_rows = np.repeat(np.arange(attr_shape[0]), np.diff(z["attr_indptr"]))
        features[attr_rows, z["attr_indices"]] = z["attr_data"]
        labels = z["labels"].astype(np.int64)
        class_names = [str(s) for s in z["class_names"]]
    num_classes = len(class_names)
    masks = random_split(labels, num_classes, split_seed)
    info = {
        "source": "builtin",
        "file": path.name,
        "symmetrized": True,
        "split": "random_per_class",
        "split_seed": split_seed,
        "split_sizes": [int(m.sum()) for m in masks],
        "class_names": class_names,
        "metric": "acc",
    }
    return GraphData(name, indptr, indices, features, labels, *masks, num_classes, info=info)


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
    graph = GraphData(name, *(arrays[k] for k in _ARRAYS), int(meta["num classes"]), info=info)
    graph.validate()
    return graph


def _load_ogb(name: str, root: Path) -> GraphData:
    master = _ogb_master()
    supported = _ogb_supported(master)
    if name not in supported:
        raise ValueError(f"unsupported OGB dataset {name!r}; supported: {', '.join(supported)}")
    meta = master[name]
    directory = root / name.replace("-", "_")
    files = _ogb_files(meta)
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


def save_npz(graph: GraphData, path: str | Path) -> None:
    """Writes ``graph`` in the documented ``npz`` format (see the module docstring)."""
    graph.validate()
    with open(path, "wb") as fh:
        np.savez(
            fh,
            **{key: getattr(graph, key) for key in _ARRAYS},
            num_classes=np.int64(graph.num_classes),
            multilabel=np.bool_(graph.multilabel),
            name=np.str_(graph.name),
            info=np.str_(json.dumps(graph.info)),
        )


def _load_npz(path: Path) -> GraphData:
    if not path.is_file():
        raise FileNotFoundError(f"npz dataset file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files}
    except ValueError as exc:  # e.g. object arrays, which would need pickle
        raise ValueError(f"cannot read {path} without pickle: {exc}") from exc
    for key in _ARRAYS:
        if key not in arrays:
            raise ValueError(f"{path} lacks required key {key!r} (required: {_ARRAYS})")
    indptr, indices = arrays["indptr"], arrays["indices"]
    for key, arr in (("indptr", indptr), ("indices", indices)):
        if not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1:
            raise ValueError(f"{path}: {key} must be a 1-D integer array, got {arr.dtype}")
    indptr, indices = indptr.astype(np.int64), indices.astype(np.int64)
    n = indptr.shape[0] - 1
    try:
        _check_csr_structure(indptr, indices, n)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    symmetrize = bool(arrays.get("symmetrize", False))
    if symmetrize or _csr_problem(indptr, indices) is not None:
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        indptr, indices = csr_from_edges(indices, rows, n, symmetrize=symmetrize)
    labels = arrays["labels"]
    try:
        info = json.loads(str(arrays["info"])) if "info" in arrays else {}
    except ValueError as exc:
        raise ValueError(f"{path}: key 'info' is not valid JSON: {exc}") from exc
    return _assemble(
        str(arrays.get("name", path.stem)),
        (indptr, indices, arrays["features"], labels, *(arrays[k] for k in _MASKS)),
        int(arrays["num_classes"]) if "num_classes" in arrays else None,
        bool(arrays.get("multilabel", labels.ndim == 2)),
        {**info, "file": str(path)},
        where=str(path),
    )


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _assemble(
    name: str,
    parts: tuple,
    num_classes: int | None,
    multilabel: bool,
    info: dict,
    *,
    where: str,
) -> GraphData:
    """Casts canonical-CSR ``parts`` (GraphData array order) into a validated GraphData."""
    indptr, indices, features, labels, *masks = (_to_numpy(p) for p in parts)
    if multilabel:
        labels = labels.astype(np.float32)
    else:
        labels = labels.reshape(-1) if labels.ndim == 2 and labels.shape[1] == 1 else labels
        if not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"{where}: labels must be integer, got {labels.dtype}")
        labels = labels.astype(np.int64)
    if num_classes is None:
        num_classes = labels.shape[1] if multilabel else int(labels.max(initial=-1)) + 1
    for i, (key, mask) in enumerate(zip(_MASKS, masks, strict=True)):
        is_binary = np.issubdtype(mask.dtype, np.integer) and np.isin(mask, (0, 1)).all()
        if mask.dtype != np.bool_ and not is_binary:
            raise ValueError(f"{where}: {key} must be boolean, got {mask.dtype}")
        masks[i] = mask.astype(bool)
    arrays = (indptr, indices, np.ascontiguousarray(features, dtype=np.float32), labels, *masks)
    graph = GraphData(name, *arrays, int(num_classes), multilabel=multilabel, info=info)
    try:
        graph.validate()
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    return graph


def _from_edge_list(
    source: str, name: str, edges: tuple, nodes: tuple, symmetrize: bool, num_classes: int | None
) -> GraphData:
    """``edges`` = (src, dst, N); ``nodes`` = (features, labels, train, val, test); tensors ok."""
    src, dst, n = edges
    indptr, indices = csr_from_edges(_to_numpy(src), _to_numpy(dst), n, symmetrize=symmetrize)
    labels = _to_numpy(nodes[1])
    multilabel = labels.ndim == 2 and labels.shape[1] > 1 and labels.dtype.kind == "f"
    info = {"source": source, "symmetrized": symmetrize}
    return _assemble(name, (indptr, indices, *nodes), num_classes, multilabel, info, where=name)


def from_pyg(
    data: Any, name: str = "pyg", *, symmetrize: bool = False, num_classes: int | None = None
) -> GraphData:
    """Converts a ``torch_geometric.data.Data`` (duck-typed; PyG is not imported).

    Uses ``edge_index`` [2, E] (row 0 = source, row 1 = target), ``x`` [N, F], ``y`` [N]
    (or [N, C] float multilabel) and 1-D ``train_mask``/``val_mask``/``test_mask``.
    """
    keys = ("x", "y", *_MASKS)
    missing = [k for k in ("edge_index", *keys) if getattr(data, k, None) is None]
    if missing:
        raise ValueError(f"PyG data object lacks {missing}")
    nodes = tuple(getattr(data, k) for k in keys)
    edges = (*_to_numpy(data.edge_index), int(data.num_nodes))
    return _from_edge_list("pyg", name, edges, nodes, symmetrize, num_classes)


def from_dgl(
    graph: Any, name: str = "dgl", *, symmetrize: bool = False, num_classes: int | None = None
) -> GraphData:
    """Converts a homogeneous DGL graph (duck-typed; untested since DGL is not a dependency).

    Uses ``graph.edges()`` (source, target) and ``graph.ndata`` keys ``feat``, ``label``,
    ``train_mask``, ``val_mask`` and ``test_mask``.
    """
    keys = ("feat", "label", *_MASKS)
    missing = [k for k in keys if k not in graph.ndata]
    if missing:
        raise ValueError(f"DGL graph ndata lacks {missing}")
    nodes = tuple(graph.ndata[k] for k in keys)
    edges = (*graph.edges(), int(graph.num_nodes()))
    return _from_edge_list("dgl", name, edges, nodes, symmetrize, num_classes)


def load_dataset(
    name: str,
    *,
    root: str | Path = "data",
    split_seed: int = 0,
    synthetic: SyntheticSpec | None = None,
    path: str | Path | None = None,
) -> GraphData:
    """Loads a dataset by name into a validated :class:`GraphData`.

    Args:
        name: ``cora``, ``citeseer``, ``synthetic``, ``npz`` or a supported ``ogbn-*`` name.
        root: Directory holding OGB datasets (``root/ogbn_arxiv/...``).
        split_seed: Seed of the random split for ``cora``/``citeseer``/``synthetic``; OGB
            datasets and npz files keep their own split.
        synthetic: Generator parameters for ``synthetic`` (default ``SyntheticSpec()``).
        path: File for ``npz``.

    Raises:
        ValueError: unknown name or inconsistent arguments/data.
        FileNotFoundError: dataset files are absent and cannot be downloaded.
    """
    key = name.lower()
    if synthetic is not None and key != "synthetic":
        raise ValueError(f"synthetic spec given but dataset name is {name!r}")
    if path is not None and key != "npz":
        raise ValueError(f"path given but dataset name is {name!r}, not 'npz'")
    if key in _BUILTIN:
        graph = _load_builtin(key, split_seed)
    elif key == "synthetic":
        graph = generate_synthetic(synthetic or SyntheticSpec(), split_seed)
    elif key == "npz":
        if path is None:
            raise ValueError("dataset 'npz' requires path=")
        return _load_npz(Path(path))  # validated by _assemble
    elif key.startswith("ogbn-"):
        return _load_ogb(key, Path(root))
    else:
        names = [*_BUILTIN, "synthetic", "npz", *_ogb_supported(_ogb_master())]
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(names)}")
    graph.validate()
    logger.info("loaded %r", graph)
    return graph
