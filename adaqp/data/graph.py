"""The in-memory graph format every loader produces, and the helpers that build it.

:class:`GraphData` holds one graph: an adjacency stored as a CSR of *in-edges* (row ``u``
lists the sources ``v`` of the edges ``v -> u``, sorted, no duplicates, no self-loops),
features, labels and the train/val/test masks. This module owns its checks
(:meth:`GraphData.validate`), its content hash (:meth:`GraphData.fingerprint`), the canonical
CSR construction from an edge list (:func:`csr_from_edges`), the semi-supervised benchmark
split (:func:`random_split`) and :func:`assemble_graph`, which casts loosely typed arrays
(numpy or torch) into a validated :class:`GraphData` for the npz reader and the PyG/DGL
adapters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adaqp.data.pages import row_blocks

logger = logging.getLogger(__name__)

GRAPH_ARRAYS = ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask")
"""The names of :class:`GraphData`'s arrays, in its field order (and the npz file's keys)."""
MASK_ARRAYS = GRAPH_ARRAYS[4:]
"""The names of the train/val/test masks, in that order."""
FEATURE_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
"""The dtypes ``GraphData.features`` may have: float32, or float16 where a dataset stores
its features so (OGB's ``ogbn-papers100M``), kept at half the bytes through partitioning
and made float32 only where a worker builds its tensors (``adaqp.graph.local``)."""
# Bounds the temporaries of validate() to a few hundred MB even for 100M+ edge graphs.
_VALIDATE_CHUNK = 1 << 24


@dataclass(repr=False)
class GraphData:
    """One in-memory graph.

    Attributes:
        name: Dataset name.
        indptr: int64 [N+1] CSR of in-edges: row ``u`` lists the sources ``v`` of ``v -> u``.
        indices: int64 [E], sorted within each row, no duplicates, no self-loops; int32
            where a loader builds it so (OGB's binary layout, every id fitting: half the
            bytes), which the fingerprint hashes as int64.
        features: float32 or float16 [N, F] (:data:`FEATURE_DTYPES`), C-contiguous;
            possibly a copy-on-write map of a file (OGB's binary layout).
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
            raise ValueError(f"{describe_dataset(self.name, self.info)}: {exc}") from None

    def _check(self) -> None:
        _check_array("indptr", self.indptr, np.int64, 1)
        n = self.num_nodes
        _check_array("indices", self.indices, (np.int64, np.int32), 1)
        check_csr_structure(self.indptr, self.indices, n)
        problem = csr_problem(self.indptr, self.indices)
        if problem is not None:
            raise ValueError(f"indices: {problem}")
        _check_array("features", self.features, FEATURE_DTYPES, 2, rows=n)
        if not self.features.flags.c_contiguous:
            raise ValueError("features must be C-contiguous")
        # min and max propagate NaN and expose +-Inf without an [N, F] temporary; block
        # by block, so that mapped features are not left resident (adaqp.data.pages).
        for block in row_blocks(self.features):
            if block.size and not (np.isfinite(block.min()) and np.isfinite(block.max())):
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
        for key in MASK_ARRAYS:
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
        """Returns a 32-hex-digit content hash of name, num_classes and all arrays:
        int32 ``indices`` hashed as the int64 they stand for, and every array block by
        block (mapped features are not left resident: ``adaqp.data.pages``)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.name}\0{int(self.num_classes)}\0{bool(self.multilabel)}".encode())
        for key in GRAPH_ARRAYS:
            arr = getattr(self, key)
            dtype = np.dtype(np.int64) if key == "indices" else arr.dtype
            h.update(f"\0{key}:{dtype.str}:{arr.shape}\0".encode())
            for block in row_blocks(arr):
                # Raw buffers: hashing runs at memory speed.
                h.update(np.ascontiguousarray(block, dtype=dtype).data)
        return h.hexdigest()

    def normalize_rows(self) -> None:
        """Divides each node's features by their L1 norm, in place (the row normalisation
        of bag-of-words features in Kipf & Welling's GCN); rows of zeros stay zero."""
        for start in range(0, self.num_nodes, 1 << 16):  # bounded scratch on large graphs
            block = self.features[start : start + (1 << 16)]
            # Summed in float32: float16 sums of many values lose digits or overflow.
            norms = np.abs(block).sum(axis=1, keepdims=True, dtype=np.float32)
            np.divide(block, norms, out=block, where=norms > 0)
        self.info = {**self.info, "feature_norm": "row"}

    def symmetrized(self) -> GraphData:
        """Returns a copy whose adjacency is the union of both edge directions."""
        rows = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        indptr, indices = csr_from_edges(self.indices, rows, self.num_nodes, symmetrize=True)
        graph = dataclasses.replace(
            self, indptr=indptr, indices=indices, info={**self.info, "symmetrized": True}
        )
        graph.validate()
        return graph


def _check_array(key: str, arr: Any, dtype: Any, ndim: int, rows: int | None = None) -> None:
    """``dtype``: one dtype, or a tuple of the dtypes allowed."""
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{key} must be a numpy array, got {type(arr).__name__}")
    allowed = [np.dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,))]
    if arr.dtype not in allowed or arr.ndim != ndim:
        names = " or ".join(d.name for d in allowed)
        raise ValueError(f"{key} must be {names} with {ndim} dims, got {arr.dtype} {arr.shape}")
    if rows is not None and arr.shape[0] != rows:
        raise ValueError(f"{key} has {arr.shape[0]} rows, expected num_nodes={rows}")


def describe_dataset(name: str, info: Any) -> str:
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


def check_csr_structure(indptr: np.ndarray, indices: np.ndarray, n: int) -> None:
    """Checks that ``indptr`` ``[n + 1]`` and ``indices`` ``[E]`` form a CSR over ``n`` nodes
    (offsets from 0 to ``E``, non-decreasing; ids in ``[0, n)``); order, duplicates and
    self-loops are :func:`csr_problem`'s.

    Raises:
        ValueError: the arrays are not a CSR over ``n`` nodes.
    """
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


def csr_problem(indptr: np.ndarray, indices: np.ndarray) -> str | None:
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


def to_numpy(value: Any) -> np.ndarray:
    """``value`` as a numpy array; a torch tensor is detached and copied to the CPU first."""
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def assemble_graph(
    name: str,
    parts: tuple,
    num_classes: int | None,
    multilabel: bool,
    info: dict,
) -> GraphData:
    """Casts canonical-CSR ``parts`` (GraphData array order) into a validated GraphData."""
    where = describe_dataset(name, info)
    indptr, indices, features, labels, *masks = (to_numpy(p) for p in parts)
    if multilabel:
        labels = labels.astype(np.float32)
    else:
        labels = labels.reshape(-1) if labels.ndim == 2 and labels.shape[1] == 1 else labels
        if not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"{where}: labels must be integer, got {labels.dtype}")
        labels = labels.astype(np.int64)
    if num_classes is None:
        num_classes = labels.shape[1] if multilabel else int(labels.max(initial=-1)) + 1
    for i, (key, mask) in enumerate(zip(MASK_ARRAYS, masks, strict=True)):
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
