"""OGB's binary layout (``ogbn-papers100M``): NumPy archives read without a second copy.

Datasets that OGB's ``master.csv`` marks ``binary`` unpack to

- ``raw/data.npz``: ``edge_index`` (int [2, E], directed as published), ``num_nodes_list``
  and ``num_edges_list`` (one graph: one entry each), ``node_feat`` ([N, F], float16 for
  papers100M), other ``node_*`` / ``edge_*`` arrays (papers100M's ``node_year``), which
  are not used;
- ``raw/node-label.npz``: ``node_label`` (float [N, 1] or [N], NaN for a node without a
  label: most of papers100M's);
- ``split/<split>/{train,valid,test}.csv.gz``: node ids, as in the csv layout.

These are the keys and files ``ogb.io.read_graph_raw.read_binary_graph_raw`` and OGB's
``NodePropPredDataset`` read. Here each array is read the way its size needs
(:mod:`adaqp.data.npz_members`):

- the edges are read twice in blocks, straight from the archive, into the symmetric CSR
  (:func:`~adaqp.data.ogb_csv.csr_from_edge_blocks`): the edge list is never resident;
- the features keep their stored dtype (float16 stays float16, half of float32's bytes):
  mapped (copy-on-write) from the file where the member is stored uncompressed (as
  ``np.savez`` stores it), so they take no process memory until read, and the pages
  read are the file's, which the kernel can drop (they still count in the resident set
  while mapped). The file must then be replaced, not rewritten in place, while a graph
  maps it: a mapped file that shrinks faults its reader. A compressed member is read
  block by block into one array. Other dtypes become float32, block by block;
- the labels become int64 block by block, -1 where the value is NaN; a split that lists
  an unlabelled node loses it with a warning (:func:`~adaqp.data.ogb_csv.split_masks`),
  so such a node is never trained on or scored.

No parse cache is written for this layout: the files are binary already, so loading
costs only the CSR's build, and a cache would copy the dataset's largest arrays (its
features: 28 GB for papers100M) to disk again and read them back whole.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from adaqp.data.npz_members import NpzMember, npz_members
from adaqp.data.ogb_csv import (
    PARSE_BLOCK_VALUES,
    csr_from_edge_blocks,
    edge_id_dtype,
    labels_from_values,
    split_masks,
)

logger = logging.getLogger(__name__)

DATA_FILE = "raw/data.npz"
LABEL_FILE = "raw/node-label.npz"
FEATURE_DTYPES_KEPT = (np.dtype(np.float16), np.dtype(np.float32))
"""Feature dtypes kept as stored; any other real dtype is read as float32."""


def _members(path: Path, required: tuple[str, ...]) -> dict[str, NpzMember]:
    members = npz_members(path)
    lacking = [key for key in required if key not in members]
    if lacking:
        raise ValueError(f"{path} lacks {', '.join(map(repr, lacking))} (holds {sorted(members)})")
    return members


def _small_ints(member: NpzMember) -> np.ndarray:
    if not np.issubdtype(member.dtype, np.integer) or member.size > 1 << 20:
        raise ValueError(f"{member.describe()} must be a short integer array")
    return member.read().reshape(-1)


def _edge_blocks(member: NpzMember, n: int, block_rows: int) -> Iterator[np.ndarray]:
    """Yields ``edge_index``'s columns as [rows, 2] ``(src, dst)`` blocks of node ids in
    :func:`~adaqp.data.ogb_csv.edge_id_dtype`, read from the archive.

    Row-major [2, E] holds every source before every target: two readers walk the two
    rows side by side. Column-major holds each edge's pair together: one reader.
    """
    num_edges = member.shape[1]
    if member.fortran_order:
        flat = member.blocks(0, 2 * num_edges, 2 * block_rows)
        pairs = (block.reshape(-1, 2) for block in flat)
    else:
        sources = member.blocks(0, num_edges, block_rows)
        targets = member.blocks(num_edges, 2 * num_edges, block_rows)
        pairs = (np.stack([s, t], axis=1) for s, t in zip(sources, targets, strict=True))
    id_dtype = edge_id_dtype(n)
    for block in pairs:
        if block.size and (block.min() < 0 or block.max() >= n):
            raise ValueError(f"{member.describe()} holds node ids outside [0, {n})")
        yield block.astype(id_dtype)


def _features(member: NpzMember, n: int, block_values: int) -> np.ndarray:
    """``node_feat`` as [n, F], C order, in its stored dtype where kept (see above)."""
    if member.dtype.kind not in "fiu" or len(member.shape) != 2 or member.shape[0] != n:
        raise ValueError(f"{member.describe()} must be real numbers of shape [{n}, F]")
    if member.fortran_order:
        raise ValueError(f"{member.describe()} is stored in Fortran order; save it C-ordered")
    if member.dtype in FEATURE_DTYPES_KEPT and member.dtype.isnative:
        return member.mapped() if member.stored else member.read(block_values)
    return member.read(block_values, dtype=np.float32)


def _labels(member: NpzMember, n: int, block_values: int) -> np.ndarray:
    """``node_label`` ([n, 1] or [n]) as int64 [n], -1 where NaN, converted block by block."""
    if member.dtype.kind not in "fiu" or member.shape not in ((n,), (n, 1)):
        raise ValueError(f"{member.describe()} must be numbers of shape [{n}, 1]")
    labels = np.empty(n, dtype=np.int64)
    lo = 0
    for block in member.blocks(0, n, block_values):
        labels[lo : lo + block.shape[0]] = labels_from_values(block, member.path)
        lo += block.shape[0]
    return labels


def binary_sizes(directory: Path) -> tuple[int, int, int]:
    """``(N, E, F)`` of the binary layout under ``directory``: nodes, edges as published
    (directed as stored) and features, from ``raw/data.npz``'s member headers and its two
    count arrays; nothing else is read (``python -m adaqp.memory`` sizes papers100M so).

    Raises:
        ValueError: naming the file, where it is not a readable ``.npz`` of one graph.
    """
    data_path = directory / DATA_FILE
    data = _members(data_path, ("num_nodes_list", "num_edges_list", "node_feat"))
    num_nodes_list = _small_ints(data["num_nodes_list"])
    num_edges_list = _small_ints(data["num_edges_list"])
    features = data["node_feat"]
    if num_nodes_list.shape != (1,) or num_edges_list.shape != (1,) or len(features.shape) != 2:
        raise ValueError(f"{data_path} must hold one graph with [N, F] node_feat")
    return int(num_nodes_list[0]), int(num_edges_list[0]), int(features.shape[1])


def parse_binary_layout(
    directory: Path, files: list[str], block_values: int = PARSE_BLOCK_VALUES
) -> dict[str, np.ndarray]:
    """The graph's arrays from the binary layout's ``files`` under ``directory`` (see the
    module docstring), read in blocks of about ``block_values`` values; the result does
    not depend on ``block_values``.

    Raises:
        ValueError: naming the file (and the array), where one is not a readable ``.npz``,
            lacks a key, or holds arrays of the wrong type, shape or range.
    """
    data_path = directory / DATA_FILE
    data = _members(data_path, ("edge_index", "num_nodes_list", "num_edges_list", "node_feat"))
    label_member = _members(directory / LABEL_FILE, ("node_label",))["node_label"]
    num_nodes_list = _small_ints(data["num_nodes_list"])
    num_edges_list = _small_ints(data["num_edges_list"])
    if num_nodes_list.shape != (1,) or num_edges_list.shape != (1,):
        raise ValueError(f"{data_path} must hold one graph (num_nodes_list, num_edges_list)")
    n, num_edges = int(num_nodes_list[0]), int(num_edges_list[0])
    if n < 0 or num_edges < 0:
        raise ValueError(f"{data_path}: negative num_nodes_list or num_edges_list")
    edge_index = data["edge_index"]
    if not np.issubdtype(edge_index.dtype, np.integer) or edge_index.shape != (2, num_edges):
        raise ValueError(f"{edge_index.describe()} must be integers of shape [2, {num_edges}]")
    ignored = sorted(set(data) - {"edge_index", "num_nodes_list", "num_edges_list", "node_feat"})
    if ignored:
        logger.info("%s: not used: %s", data_path, ", ".join(ignored))
    # The cheap arrays first, so that a bad file fails before the CSR's build.
    features = _features(data["node_feat"], n, block_values)
    labels = _labels(label_member, n, block_values)
    masks = split_masks(directory, files[-3:], labels, block_values)
    block_rows = max(1, block_values // 2)
    indptr, indices = csr_from_edge_blocks(
        _edge_blocks(edge_index, n, block_rows),
        _edge_blocks(edge_index, n, block_rows),
        n,
        block_values,
        edge_id_dtype(n),  # int32 where the ids fit: the CSR's largest array halved
    )
    out = {"indptr": indptr, "indices": indices, "features": features, "labels": labels}
    return {**out, **masks, "num_raw_edges": np.int64(num_edges)}
