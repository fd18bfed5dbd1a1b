"""OGB's csv layout (``raw/*.csv.gz``), parsed block by block into arrays allocated once.

The parse needs little memory beyond the arrays it returns, whatever the dataset's size.
Its pieces also serve the binary layout (:mod:`adaqp.data.ogb_binary`), whose splits are
csv.gz files too and whose edges build the same CSR: :func:`read_csv_blocks`,
:func:`csr_from_edge_blocks`, :func:`labels_from_values` and :func:`split_masks`.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

PARSE_BLOCK_VALUES = 1 << 22
"""Values the raw-file parser reads at a time: its scratch beside the arrays it returns."""


def read_csv_blocks(path: Path, dtype: Any, block_rows: int, **kwargs: Any) -> Iterator[np.ndarray]:
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


def read_csv(path: Path, dtype: Any, block_values: int, **kwargs: Any) -> np.ndarray:
    """The whole csv.gz ``path``, parsed in blocks (for the small files: counts, splits)."""
    return np.concatenate(list(read_csv_blocks(path, dtype, block_values, **kwargs)))


def edge_id_dtype(num_nodes: int) -> type[np.integer]:
    """int32 where ``num_nodes`` allows (half an edge block's memory), else int64."""
    return np.int32 if num_nodes <= np.iinfo(np.int32).max else np.int64


def _read_edges(path: Path, n: int, block_rows: int) -> list[np.ndarray]:
    """``path``'s edges as [rows, 2] blocks, in :func:`edge_id_dtype`."""
    id_dtype = edge_id_dtype(n)
    blocks = []
    for block in read_csv_blocks(path, np.int64, block_rows):
        if block.ndim != 2 or block.shape[1] != 2:
            raise ValueError(f"{path} must have 2 columns")
        if block.size and (block.min() < 0 or block.max() >= n):
            raise ValueError(f"{path} holds node ids outside [0, {n})")
        blocks.append(block.astype(id_dtype))
    return blocks


def _drain(blocks: list[np.ndarray]) -> Iterator[np.ndarray]:
    """Yields ``blocks`` in order, dropping the list's reference to each as it goes."""
    for i in range(len(blocks)):
        block, blocks[i] = blocks[i], None
        yield block


def csr_from_edge_blocks(
    degree_pass: Iterable[np.ndarray],
    place_pass: Iterable[np.ndarray],
    n: int,
    block_entries: int,
    id_dtype: type[np.integer] = np.int64,
) -> tuple[np.ndarray, np.ndarray]:
    """The canonical symmetric in-edge CSR of an edge list given as [rows, 2] ``(src, dst)``
    blocks: the arrays ``csr_from_edges(src, dst, n, symmetrize=True)`` returns, built in
    place in one ``indices`` array instead of sorting every edge's key at once; its ids
    of ``id_dtype`` (int32 where every id fits, :func:`edge_id_dtype`: half the bytes).

    The edges are read twice, as two iterables of the same blocks: ``degree_pass`` counts
    each row's entries, ``place_pass`` places them. Neither needs to hold the edge list:
    a reader may produce each block afresh (from a file) and drop it once used.
    """
    degree = np.zeros(n, dtype=np.int64)
    for block in degree_pass:
        degree += np.bincount(block[:, 0], minlength=n)
        degree += np.bincount(block[:, 1], minlength=n)
    start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=start[1:])
    del degree
    # Scatter both directions of every edge into its row, in any order within the row.
    if np.dtype(id_dtype) != np.int64 and n > np.iinfo(id_dtype).max:
        raise ValueError(f"{n} nodes do not fit {np.dtype(id_dtype).name} ids")
    indices = np.empty(int(start[-1]), dtype=id_dtype)
    cursor = start[:-1].copy()
    for block in place_pass:
        rows = np.concatenate([block[:, 1], block[:, 0]])
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        counts = np.bincount(rows, minlength=n)
        rank = np.arange(rows.shape[0]) - (np.cumsum(counts) - counts)[rows]
        indices[cursor[rows] + rank] = np.concatenate([block[:, 0], block[:, 1]])[order]
        cursor += counts
        del block  # a drained block is freed as its rows fill
    if not np.array_equal(cursor, start[1:]):
        raise ValueError("the edge blocks changed between the two passes over them")
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
    for block in read_csv_blocks(path, np.float32, max(1, block_values // 128)):
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


def labels_from_values(values: np.ndarray, path: Path) -> np.ndarray:
    """int64 labels of OGB's label values (float, NaN for an unlabelled node): -1 for NaN.

    Raises:
        ValueError: naming ``path``, where a value is not a whole number or NaN.
    """
    if np.issubdtype(values.dtype, np.integer):
        return values.astype(np.int64)
    missing = np.isnan(values)
    bad = np.flatnonzero(~missing & ~(np.isfinite(values) & (values == np.floor(values))))
    if bad.size:
        raise ValueError(f"{path}: label {values[bad[0]]} is not a class number (or NaN)")
    return np.where(missing, -1, values).astype(np.int64)


def split_masks(
    directory: Path, split_files: list[str], labels: np.ndarray, block_values: int
) -> dict[str, np.ndarray]:
    """``train_mask``, ``val_mask``, ``test_mask`` from the split's three csv.gz files of
    node ids (train, valid, test); an unlabelled node (label -1) listed there is dropped
    with a warning, so that it is never trained on or scored.

    Raises:
        ValueError: naming the file, where it holds ids outside ``[0, N)``.
    """
    n = labels.shape[0]
    masks = {}
    for key, rel in zip(("train_mask", "val_mask", "test_mask"), split_files, strict=True):
        ids = read_csv(directory / rel, np.int64, block_values).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"{directory / rel} holds node ids outside [0, {n})")
        mask = np.zeros(n, dtype=bool)
        mask[ids] = True
        dropped = int(np.count_nonzero(mask & (labels < 0)))
        if dropped:
            logger.warning("%s: dropping %d unlabelled nodes from %s", directory, dropped, key)
            mask &= labels >= 0
        masks[key] = mask
    return masks


def parse_csv_layout(
    directory: Path, files: list[str], block_values: int = PARSE_BLOCK_VALUES
) -> dict[str, np.ndarray]:
    """The graph's arrays from the csv layout's ``files`` under ``directory`` (see
    ``adaqp.data.ogb``), parsed in blocks of about ``block_values`` values; the result
    does not depend on ``block_values``."""
    n = int(read_csv(directory / "raw/num-node-list.csv.gz", np.int64, block_values).reshape(-1)[0])
    blocks = _read_edges(directory / "raw/edge.csv.gz", n, max(1, block_values // 2))
    num_raw_edges = sum(block.shape[0] for block in blocks)
    indptr, indices = csr_from_edge_blocks(blocks, _drain(blocks), n, block_values)
    features = _read_features(directory / "raw/node-feat.csv.gz", n, block_values)
    # An unlabelled node may be written as an empty line, which must still count as a row.
    label_path = directory / "raw/node-label.csv.gz"
    raw_labels = read_csv(label_path, np.float64, block_values, names=[0], skip_blank_lines=False)
    if raw_labels.shape != (n, 1):
        raise ValueError(f"{label_path} must be [{n}, 1]")
    labels = labels_from_values(raw_labels[:, 0], label_path)
    out = {"indptr": indptr, "indices": indices, "features": features, "labels": labels}
    out.update(split_masks(directory, files[-3:], labels, block_values))
    out["num_raw_edges"] = np.int64(num_raw_edges)
    return out
