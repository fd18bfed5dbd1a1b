"""The graph as the partition build reads it: held in memory, or lean.

Partitioning a graph of ogbn-products' size holds its adjacency (123.7M directed edges:
1 GB as int64) and features (2.45M x 100 float32: 1 GB) while the partitioner runs and
while each part is built. A lean input (:meth:`GraphSource.take`, what
``python -m partition`` uses) takes the graph's arrays over and keeps only what each stage
needs:

- node ids as int32 where they fit (half the adjacency's bytes);
- the features spilled to a scratch file beside the partition, in their own dtype
  (float16 stays float16), and read back block by block for one part at a time, so the
  ``[N, F]`` matrix is never resident during the cut or the build;
- the adjacency's ids (``indices``, the graph's largest array: 4 bytes a directed edge)
  spilled too, narrowed as they are written, and mapped back: a stage reads the rows it
  needs and hands their pages back when done (``adaqp.data.pages``), so that the
  partitioner, which holds its own copy of the graph, runs beside none of it.

A source made with :meth:`GraphSource.of` reads the graph as it is and changes nothing: the
graph stays usable, for callers that keep it (tests, benchmarks).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adaqp.data import GraphData
from adaqp.data.ogb_csv import edge_id_dtype
from adaqp.data.pages import row_blocks
from adaqp.partitioning.scratch import SCRATCH, make_owned_dir

_ROWS_PER_READ = 1 << 16
"""Feature rows read per block from a spilled feature file."""

_IDS_PER_CAST = 1 << 24
"""Node ids narrowed per block (bounded scratch)."""


@dataclass
class GraphSource:
    """What the cut and the build read: CSR, per-node columns, and the dataset record.

    ``indices`` may be int32 (a lean source); ``features`` is None when spilled to
    ``features_file`` (raw rows of ``feature_dtype``, C order).
    """

    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray | None
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    record: dict[str, Any]
    """The dataset fields of a partition's metadata (fingerprint, sizes, provenance),
    taken from the graph before anything changed."""
    feature_dim: int
    feature_dtype: np.dtype
    """The features' dtype (``adaqp.data.graph.FEATURE_DTYPES``), which the parts keep."""
    features_file: Path | None = None
    scratch: Path | None = None
    """The directory this source owns for its scratch files (removed by ``close``)."""
    in_degree: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.in_degree = np.diff(self.indptr)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @classmethod
    def of(cls, graph: GraphData) -> GraphSource:
        """The graph's own arrays, unchanged (no copy)."""
        return cls(
            graph.indptr,
            graph.indices,
            graph.features,
            graph.labels,
            graph.train_mask,
            graph.val_mask,
            graph.test_mask,
            _record(graph),
            graph.feature_dim,
            graph.features.dtype,
        )

    @classmethod
    def take(cls, graph: GraphData, scratch_parent: Path) -> GraphSource:
        """Takes the graph's arrays over, lean (see the module docstring): the graph is
        left without its adjacency and features, which the caller must not use again.

        ``scratch_parent``: where the scratch directory goes (beside the partition, so
        the spill lands on the partition's file system, not in a memory-backed /tmp);
        its name says which process owns it (``adaqp.partitioning.scratch``).

        Raises:
            OSError: the spill cannot be written (a full disk, say); nothing is left
                behind.
        """
        record = _record(graph)  # the fingerprint hashes the arrays as loaded
        scratch_parent.mkdir(parents=True, exist_ok=True)
        scratch = make_owned_dir(scratch_parent, SCRATCH)
        try:
            feature_dim, feature_dtype = graph.feature_dim, graph.features.dtype
            features_file = scratch / f"features.{feature_dtype.name}"
            with open(features_file, "wb") as fh:  # scratch: no fsync, it never outlives us
                # C-contiguous (GraphData's rule): no copy; mapped features (OGB's binary
                # layout) are not left resident as they are read (adaqp.data.pages).
                for block in row_blocks(graph.features):
                    block.tofile(fh)
            graph.features = np.zeros((0, feature_dim), dtype=feature_dtype)
            indices = _spill_ids(graph.indices, graph.num_nodes, scratch)
            graph.indices = np.zeros(0, dtype=np.int64)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return cls(
            graph.indptr,
            indices,
            None,
            graph.labels,
            graph.train_mask,
            graph.val_mask,
            graph.test_mask,
            record,
            feature_dim,
            feature_dtype,
            features_file,
            scratch,
        )

    def feature_rows(self, ids: np.ndarray) -> np.ndarray:
        """``feature_dtype`` [len(ids), F], C-contiguous: the features of the nodes ``ids``
        (global, ascending), read block by block from the spill where there is one."""
        if self.features is not None:
            return np.ascontiguousarray(self.features[ids])
        out = np.empty((len(ids), self.feature_dim), dtype=self.feature_dtype)
        row_bytes = self.feature_dtype.itemsize * self.feature_dim
        bounds = np.searchsorted(ids, np.arange(0, self.num_nodes + _ROWS_PER_READ, _ROWS_PER_READ))
        with open(self.features_file, "rb") as fh:
            for block, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=False)):
                if lo == hi:
                    continue
                first = block * _ROWS_PER_READ
                count = min(_ROWS_PER_READ, self.num_nodes - first)
                fh.seek(first * row_bytes)
                rows = np.fromfile(fh, dtype=self.feature_dtype, count=count * self.feature_dim)
                if rows.shape[0] != count * self.feature_dim:
                    raise OSError(f"{self.features_file} is shorter than its {self.num_nodes} rows")
                out[lo:hi] = rows.reshape(count, self.feature_dim)[ids[lo:hi] - first]
        return out

    def close(self) -> None:
        """Removes the scratch directory, if any."""
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def __enter__(self) -> GraphSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _spill_ids(ids: np.ndarray, num_nodes: int, scratch: Path) -> np.ndarray:
    """``ids`` written to ``scratch`` as int32 where every node id fits (block by block,
    never a second copy in memory), mapped back read-only; an empty array as it is."""
    dtype = np.dtype(edge_id_dtype(num_nodes))
    if ids.size == 0:
        return ids.astype(dtype)
    path = scratch / f"indices.{dtype.name}"
    with open(path, "wb") as fh:  # scratch: no fsync, it never outlives us
        for start in range(0, ids.shape[0], _IDS_PER_CAST):
            ids[start : start + _IDS_PER_CAST].astype(dtype).tofile(fh)
    return np.memmap(path, dtype, "r", 0, ids.shape)


def _record(graph: GraphData) -> dict[str, Any]:
    return {
        "fingerprint": graph.fingerprint(),
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "feature_dim": graph.feature_dim,
        "feature_dtype": graph.features.dtype.name,
        "num_classes": graph.num_classes,
        "multilabel": graph.multilabel,
        "info": graph.info,
    }
