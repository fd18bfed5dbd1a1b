"""Graph datasets for AdaQP: one in-memory format and loaders that produce it.

Every loader returns a :class:`GraphData` whose adjacency is a CSR of *in-edges*: row ``u``
lists the sources ``v`` of the edges ``v -> u`` (sorted, no duplicates, no self-loops), which
is the layout a GCN aggregation ``h_u = sum_v h_v`` consumes directly.

Sources accepted by :func:`load_dataset`:

* ``cora``, ``citeseer``: shipped in ``adaqp/data``; symmetrised, raw binary bag-of-words
  features (no row normalisation), random 20-per-class / 500 / 1000 split.
* ``synthetic``: a seeded contextual stochastic block model, see :class:`SyntheticSpec`.
  Partition statistics at 20k nodes, average degree 10, 8 classes, ``power_law = 2.5``
  (METIS with training nodes balanced; cut = share of edges between parts, halo = halo
  rows summed over parts / N, central = share of nodes with no in-neighbour elsewhere)::

      communities, inter_community   P   cut     halo/node   central
      0 (no locality)                4   25.9%   1.30        24%
      0 (no locality)                8   30.8%   1.88        20%
      32, 0.04 (synthetic-local)     4    3.1%   0.25        79%
      32, 0.04 (synthetic-local)     8    3.7%   0.32        75%
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
from collections.abc import Callable, Iterator
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
        """Checks that the graph is usable for training; every loader calls it.

        Checks dtypes and shapes (rows of features, labels and masks = N), CSR consistency
        (``indptr`` starts at 0, ends at ``len(indices)`` and never decreases; indices in
        [0, N); rows sorted without duplicates or self-loops), finite features, labels in
        [0, C) (``-1`` = unlabelled, allowed outside the masks) or 0/1 when multilabel,
        disjoint masks and a non-empty training set.

        Raises:
            ValueError: naming the dataset, the offending field and the problem.
        """
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        try:
            self._check()
        except ValueError as exc:
            raise ValueError(f"{_describe(self.name, self.info)}: {exc}") from None

    def _check(self) -> None:
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
        # min and max propagate NaN and expose +-Inf without an [N, F] temporary.
        if self.features.size and not (
            np.isfinite(self.features.min()) and np.isfinite(self.features.max())
        ):
            row = _first_nonfinite_row(self.features)
            raise ValueError(f"features hold NaN or Inf (first at node {row})")
        if not isinstance(self.num_classes, int | np.integer) or self.num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {self.num_classes!r}")
        if self.multilabel:
            _check_array("labels", self.labels, np.float32, 2, rows=n)
            if self.labels.shape[1] != self.num_classes:
                raise ValueError(
                    f"labels has {self.labels.shape[1]} columns but num_classes={self.num_classes}"
                )
            if not np.all((self.labels == 0) | (self.labels == 1)):
                raise ValueError("multilabel labels must be 0 or 1")
        else:
            _check_array("labels", self.labels, np.int64, 1, rows=n)
            bad = np.flatnonzero((self.labels < -1) | (self.labels >= self.num_classes))
            if bad.size:
                raise ValueError(
                    f"labels must lie in [0, {self.num_classes}) (or be -1 = unlabelled), "
                    f"got {self.labels[bad[0]]} at node {bad[0]} ({bad.size} nodes out of range)"
                )
        for key in _MASKS:
            mask = getattr(self, key)
            _check_array(key, mask, np.bool_, 1, rows=n)
            if not self.multilabel and np.any(self.labels[mask] < 0):
                raise ValueError(f"{key} selects nodes with label -1 (unlabelled)")
        if not self.train_mask.any():
            raise ValueError("train_mask is empty: there is nothing to train on")
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
        graph = dataclasses.replace(
            self, indptr=indptr, indices=indices, info={**self.info, "symmetrized": True}
        )
        graph.validate()
        return graph


def _check_array(key: str, arr: Any, dtype: type, ndim: int, rows: int | None = None) -> None:
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{key} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != dtype or arr.ndim != ndim:
        raise ValueError(
            f"{key} must be {np.dtype(dtype).name} with {ndim} dims, got {arr.dtype} {arr.shape}"
        )
    if rows is not None and arr.shape[0] != rows:
        raise ValueError(f"{key} has {arr.shape[0]} rows, expected num_nodes={rows}")


def _describe(name: str, info: Any) -> str:
    """``dataset 'name'``, plus its file when known: the prefix of every data error."""
    file = info.get("file") if isinstance(info, dict) else None
    return f"dataset {name!r}" + (f" ({file})" if file else "")


def _first_nonfinite_row(features: np.ndarray) -> int:
    """Returns the first row of ``features`` holding NaN or Inf, or -1; scans in chunks."""
    step = max(1, _VALIDATE_CHUNK // max(features.shape[1], 1))
    for r0 in range(0, features.shape[0], step):
        bad = np.flatnonzero(~np.isfinite(features[r0 : r0 + step]).all(axis=1))
        if bad.size:
            return r0 + int(bad[0])
    return -1


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

    Without communities the graph has no locality beyond its classes, so METIS cuts it
    badly (a quarter of the edges at P = 4; see the table in the module docstring).
    ``communities`` and ``inter_community`` add the community structure of real graphs:
    ``communities=32, inter_community=0.04`` (``configs/synthetic-local-gcn.toml``) cuts
    3% of the edges at P = 4, with 0.25 halo rows per node and 79% central nodes.
    """

    num_nodes: int = 10000
    """Number of nodes N (classes are balanced)."""
    num_classes: int = 8
    """Number of classes C (at least 2)."""
    avg_degree: float = 20.0
    """Average undirected degree after symmetrisation. Without communities it is approximate
    (duplicate draws are dropped, a few percent under a power law); with communities exact."""
    homophily: float = 0.7
    """Probability that an edge's endpoints share a class."""
    feature_dim: int = 64
    """Feature dimension F."""
    feature_noise: float = 1.0
    """Standard deviation of the Gaussian noise around the class centres."""
    power_law: float = 0.0
    """0: roughly uniform degrees; > 1: degree propensity ~ Pareto density w^-power_law."""
    communities: int = 0
    """Number of communities K; 0 = none, the generator as it was before communities (same
    graph for the same seed). Each community holds an equal share of every class, so its
    (community, class) cells are small communities nested within the classes; labels and
    homophily keep their meaning. Hubs are capped near their community's size (N / K)."""
    inter_community: float = 0.04
    """With K > 0: fraction of edges whose endpoints lie in different communities (the other
    community is uniform, so these are the long-range edges METIS must cut); the rest join
    nodes of one community. Unused when K = 0."""
    seed: int = 0
    """Seed of the graph, features and labels."""
    train_fraction: float = 0.1
    """Fraction of nodes in the training set."""
    val_fraction: float = 0.1
    """Fraction of nodes in the validation set."""
    test_fraction: float = 0.2
    """Fraction of nodes in the test set."""

    def __post_init__(self) -> None:
        ints = ("num_nodes", "num_classes", "feature_dim", "communities", "seed")
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
            # Every (community, class) cell must hold a node; one community is no locality;
            # edge keys (N^2 * 4) must fit in int64.
            "communities": self.communities == 0
            or (
                2 <= self.communities <= self.num_nodes // self.num_classes
                and self.num_nodes <= 1_500_000_000
            ),
            "inter_community": 0.0 <= self.inter_community <= 1.0,
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

    ``N * avg_degree / 2`` edges are drawn and then symmetrised. Each edge's source is
    weighted by degree propensity; its target class is the source's with probability
    ``homophily``, else a uniform other class. Without communities the target is drawn
    from the whole target class and duplicate draws are dropped. With ``communities = K``
    it is drawn from the target class's cell in the source's community, or with
    probability ``inter_community`` in a uniform other community; duplicates are redrawn
    with the same kind (same or other class, same or other community), so the graph has
    exactly ``round(N * avg_degree / 2)`` undirected edges in the sampled proportions.
    Within its class or cell the target is weighted by propensity. The split is a random
    fractional one seeded by ``(spec.seed, split_seed)``.
    """
    n, c, k = spec.num_nodes, spec.num_classes, spec.communities
    rng = np.random.default_rng(spec.seed)
    labels = rng.permutation(np.arange(n, dtype=np.int64) % c)
    order = np.argsort(labels, kind="stable")  # nodes grouped by class
    class_ptr = np.zeros(c + 1, dtype=np.int64)
    np.cumsum(np.bincount(labels, minlength=c), out=class_ptr[1:])
    # Targets are drawn from a contiguous range of `order`: a class, or a (community,
    # class) cell. Cells need no random draws, so K = 0 consumes the generator as it did
    # before communities existed and gives the same graph.
    group_ptr = class_ptr
    if k:
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64) - class_ptr[labels[order]]
        # Node ids within a class are random, so rank-based communities are random sets
        # holding an equal share (to one node) of every class.
        community = rank * k // np.diff(class_ptr)[labels]
        del rank
        cell = community * c + labels
        order = np.argsort(cell, kind="stable")
        group_ptr = np.zeros(k * c + 1, dtype=np.int64)
        np.cumsum(np.bincount(cell, minlength=k * c), out=group_ptr[1:])
        del cell
    m = int(round(n * spec.avg_degree / 2))
    cum = None
    if spec.power_law > 0:
        # numpy's pareto(a) is Lomax with density ~ (1+x)^-(a+1): shift by 1 for classic Pareto.
        weight = 1.0 + rng.pareto(spec.power_law - 1.0, size=n)
        cum = np.zeros(n + 1)
        np.cumsum(weight[order], out=cum[1:])
        del weight

    def draw(count: int, kinds: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Samples ``count`` edges ``(src, dst, kind)``, [count] each, global ids.

        ``kind`` is 2 * (communities differ) + (classes differ); ``kinds`` forces it.
        """
        if cum is not None:
            pos = _locate(cum, rng.random(count) * cum[-1])
            src = order[pos.clip(0, n - 1)]
        else:
            src = rng.integers(0, n, size=count, dtype=np.int64)
        target = labels[src]  # target class, then (with communities) target cell
        other = rng.random(count) >= spec.homophily if kinds is None else (kinds & 1) == 1
        shift = rng.integers(1, c, size=int(other.sum()), dtype=np.int64)
        target[other] = (target[other] + shift) % c
        del shift
        kind = other
        if k:
            target_community = community[src]
            away = rng.random(count) < spec.inter_community if kinds is None else kinds >= 2
            shift = rng.integers(1, k, size=int(away.sum()), dtype=np.int64)
            target_community[away] = (target_community[away] + shift) % k
            del shift
            target += target_community * c
            del target_community
            kind = 2 * away + other
        lo, hi = group_ptr[target], group_ptr[target + 1]
        if cum is not None:
            pos = _locate(cum, cum[lo] + rng.random(count) * (cum[hi] - cum[lo]))
        else:
            pos = lo + (rng.random(count) * (hi - lo)).astype(np.int64)
        # Rounding can land one past the group end; clamp into the chosen group.
        np.clip(pos, lo, hi - 1, out=pos)
        return src, order[pos], kind

    if k:
        src, dst = _draw_distinct(draw, m, n)
    else:
        src, dst, _ = draw(m, None)
    homophily = float(np.mean(labels[src] == labels[dst])) if m else 0.0
    inter = float(np.mean(community[src] != community[dst])) if k and m else 0.0
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
    if k:
        info["sampled_inter_community"] = inter
    graph = GraphData("synthetic", indptr, indices, features, labels, *masks, c, info=info)
    graph.validate()
    return graph


def _locate(cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Returns ``np.searchsorted(cum, x, side="right") - 1``, computed on sorted queries.

    Searching random queries in a large ``cum`` misses the cache at every step; sorting
    them first measured 2 to 3 times faster (10M queries, 1M entries) for the same result.
    """
    perm = np.argsort(x)
    out = np.empty(x.shape[0], dtype=np.int64)
    out[perm] = np.searchsorted(cum, x[perm], side="right")
    out -= 1
    return out


def _edge_keys(src: np.ndarray, dst: np.ndarray, kind: np.ndarray, n: int) -> np.ndarray:
    """Sorted distinct ``(min * n + max) * 4 + kind`` of the non-loop edges, int64."""
    keep = src != dst
    lo, hi = np.minimum(src[keep], dst[keep]), np.maximum(src[keep], dst[keep])
    keys = (lo * n + hi) * 4 + kind[keep]
    keys.sort()  # np.unique's hash path is several times slower on int64 here
    return keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if keys.size else keys


def _contains(sorted_keys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """bool [len(x)]: whether each ``x`` occurs in the sorted array ``sorted_keys``."""
    if sorted_keys.size == 0:
        return np.zeros(x.shape[0], dtype=bool)
    pos = np.searchsorted(sorted_keys, x).clip(max=sorted_keys.shape[0] - 1)
    return sorted_keys[pos] == x


def _draw_distinct(
    draw: Callable[[int, np.ndarray | None], tuple[np.ndarray, np.ndarray, np.ndarray]],
    m: int,
    n: int,
    max_rounds: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """Draws ``m`` distinct undirected non-loop edges in the proportions of one draw.

    Dropping duplicates alone would remove mostly edges inside small cells and between
    hubs, skewing homophily and the inter-community share; so the first ``m`` draws fix
    how many edges of each kind (0..3, the third output of ``draw``) there are, and each
    duplicate or self-loop is replaced by a new draw forced to the same kind.

    Returns:
        ``(src, dst)``, int64 [m] each with ``src < dst``, global ids in [0, n); fewer
        edges, with a warning, if ``max_rounds`` redraws do not find enough.
    """
    src, dst, kind = draw(m, None)
    want = np.bincount(kind, minlength=4)
    keys = _edge_keys(src, dst, kind, n)  # the kind rides in the low two bits
    del src, dst, kind
    have = np.bincount(keys & 3, minlength=4)
    extra = np.zeros(0, dtype=np.int64)  # sorted keys found by redraws, merged at the end
    for _ in range(max_rounds):
        short = want - have
        if not short.any():
            break
        kind = np.repeat(np.arange(4, dtype=np.int64), short)
        src, dst, _ = draw(kind.shape[0], kind)
        new = _edge_keys(src, dst, kind, n)
        new = new[~_contains(keys, new) & ~_contains(extra, new)]
        have += np.bincount(new & 3, minlength=4)
        extra = np.sort(np.concatenate([extra, new]))
    if (want - have).any():
        logger.warning(
            "synthetic graph: %d of %d edges missing after %d redraws; the communities are "
            "too small for this average degree",
            int((want - have).sum()),
            m,
            max_rounds,
        )
    keys = np.concatenate([keys, extra])
    keys >>= 2
    return keys // n, keys % n


def _load_builtin(name: str, split_seed: int) -> GraphData:
    path = Path(__file__).parent / f"{name}.npz"
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
    graph = GraphData(name, indptr, indices, features, labels, *masks, num_classes, info=info)
    graph.validate()
    return graph


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
    name = str(arrays.get("name", path.stem))
    where = _describe(name, {"file": str(path)})
    indptr, indices = arrays["indptr"], arrays["indices"]
    for key, arr in (("indptr", indptr), ("indices", indices)):
        if not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1:
            raise ValueError(
                f"{where}: {key} must be a 1-D integer array, got {arr.dtype} {arr.shape}"
            )
    indptr, indices = indptr.astype(np.int64), indices.astype(np.int64)
    n = indptr.shape[0] - 1
    try:
        _check_csr_structure(indptr, indices, n)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    symmetrize = bool(arrays.get("symmetrize", False))
    if symmetrize or _csr_problem(indptr, indices) is not None:
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        indptr, indices = csr_from_edges(indices, rows, n, symmetrize=symmetrize)
    labels = arrays["labels"]
    try:
        info = json.loads(str(arrays["info"])) if "info" in arrays else {}
    except ValueError as exc:
        raise ValueError(f"{where}: key 'info' is not valid JSON: {exc}") from exc
    return _assemble(
        name,
        (indptr, indices, arrays["features"], labels, *(arrays[k] for k in _MASKS)),
        int(arrays["num_classes"]) if "num_classes" in arrays else None,
        bool(arrays.get("multilabel", labels.ndim == 2)),
        {**info, "file": str(path)},
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
) -> GraphData:
    """Casts canonical-CSR ``parts`` (GraphData array order) into a validated GraphData."""
    where = _describe(name, info)
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
    if not np.issubdtype(features.dtype, np.number) or features.dtype.kind == "c":
        raise ValueError(f"{where}: features must be real numbers, got {features.dtype}")
    arrays = (indptr, indices, np.ascontiguousarray(features, dtype=np.float32), labels, *masks)
    graph = GraphData(name, *arrays, int(num_classes), multilabel=multilabel, info=info)
    graph.validate()
    return graph


def _from_edge_list(
    source: str, name: str, edges: tuple, nodes: tuple, symmetrize: bool, num_classes: int | None
) -> GraphData:
    """``edges`` = (src, dst, N); ``nodes`` = (features, labels, train, val, test); tensors ok."""
    src, dst, n = edges
    try:
        indptr, indices = csr_from_edges(_to_numpy(src), _to_numpy(dst), n, symmetrize=symmetrize)
    except ValueError as exc:
        raise ValueError(f"{_describe(name, None)} from {source}: edges: {exc}") from None
    labels = _to_numpy(nodes[1])
    multilabel = labels.ndim == 2 and labels.shape[1] > 1 and labels.dtype.kind == "f"
    info = {"source": source, "symmetrized": symmetrize}
    return _assemble(name, (indptr, indices, *nodes), num_classes, multilabel, info)


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
    # Every loader validates the graph where it builds it (GraphData.validate).
    if key in _BUILTIN:
        graph = _load_builtin(key, split_seed)
    elif key == "synthetic":
        graph = generate_synthetic(synthetic or SyntheticSpec(), split_seed)
    elif key == "npz":
        if path is None:
            raise ValueError("dataset 'npz' requires path=")
        graph = _load_npz(Path(path))
    elif key.startswith("ogbn-"):
        graph = _load_ogb(key, Path(root))
    else:
        names = [*_BUILTIN, "synthetic", "npz", *_ogb_supported(_ogb_master())]
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(names)}")
    logger.info("loaded %r", graph)
    return graph
