"""Writes any :class:`GraphData` in OGB's raw on-disk layout: a local fixture, labelled
synthetic, that the ``ogbn-*`` loader reads without network.

``write_ogb_fixture(graph, root)`` writes ``root/ogbn_products/`` (for the default name) as
OGB's zip unpacks it, in the layout OGB has for the dataset named:

- csv (``ogbn-products``, ``ogbn-arxiv``): ``raw/edge.csv.gz`` (each undirected edge once,
  as ``src,dst`` with ``src < dst``), ``raw/node-feat.csv.gz``, ``raw/node-label.csv.gz``
  (an empty line for an unlabelled node), ``raw/num-node-list.csv.gz``,
  ``raw/num-edge-list.csv.gz``;
- binary (``ogbn-papers100M``): ``raw/data.npz`` with ``edge_index`` (int64 [2, E], each
  undirected edge once, ``src < dst``), ``num_nodes_list``, ``num_edges_list``,
  ``node_feat`` (float16) and, where OGB lists it, ``node_year`` (2017 / 2018 / 2019 for
  the train / valid / test nodes, 2016 for the others: a stand-in); and
  ``raw/node-label.npz`` with ``node_label`` (float32 [N, 1]), NaN for every node in no
  split, as papers100M labels only the nodes of its split. The members are stored
  uncompressed, so the loader maps them, and written a block at a time;

then ``split/<split>/{train,valid,test}.csv.gz``, OGB's ``RELEASE_v<version>.txt`` and
:data:`~adaqp.data.ogb.FIXTURE_MARKER`, which says what generated the folder; the loader
then records ``info["source"] = "synthetic-fixture"`` and the marker's provenance.

Loading the folder gives the graph's arrays back exactly, but for what the layout
changes: edges are written from the CSR row by row, csv features as the shortest
decimal that reads back to the same float32; binary features are float16 and the
labels of nodes in no split are dropped. The marker's ``expected_fingerprint`` is the
:meth:`GraphData.fingerprint` the loaded graph must have (the graph as written, under the
dataset's name and number of classes). Edges, features and labels are written in
blocks, so the writer's scratch stays small beside the graph.

Command line (``--help`` lists the options)::

    python -m adaqp.ogb_fixture --config configs/products-scale-sage.toml --root DIR
    python -m adaqp.ogb_fixture --config ... --root DIR --name ogbn-papers100M
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import itertools
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from adaqp.data.graph import GraphData
from adaqp.data.npz_members import NpzWriter, npz_members
from adaqp.data.ogb import FIXTURE_MARKER, PROVENANCE_PREFIX, is_binary, ogb_source
from adaqp.data.ogb_binary import DATA_FILE, LABEL_FILE

logger = logging.getLogger(__name__)

BLOCK_VALUES = 1 << 22
"""Values formatted per block: bounds the writer's scratch (about 60 bytes a value)."""
_FLOAT_WIDTH = 16  # the longest float32 repr, "-1.1754944e-38", has 14 characters
_INT_WIDTH = 20  # the longest int64, "-9223372036854775808"


def _csv_bytes(values: np.ndarray, width: int) -> bytes:
    """The rows of ``values`` [R, C] as csv text, each value as numpy's shortest repr
    (a float32 reads back to the same float32), without Python's per-value loop."""
    text = values.astype(f"S{width}")  # zero-padded fixed-width strings
    cells = np.zeros((*text.shape, width + 1), dtype=np.uint8)
    cells[..., :width] = text.view(np.uint8).reshape(*text.shape, width)
    if cells[..., width - 1].any():
        raise ValueError(f"a value needs more than {width - 1} characters")
    cells[..., width] = ord(",")
    cells[:, -1, width] = ord("\n")
    return cells[cells != 0].tobytes()


def _row_blocks(indptr: np.ndarray, max_entries: int) -> Iterator[tuple[int, int]]:
    """Row ranges [r0, r1) of about ``max_entries`` CSR entries each, covering all rows."""
    n = indptr.shape[0] - 1
    cuts = np.searchsorted(indptr, np.arange(0, indptr[-1], max_entries), side="right") - 1
    bounds = np.unique(np.concatenate([cuts.clip(0, n), [0, n]]))
    yield from zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)


def _has_mirror(
    indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    """bool [K]: whether row ``cols[k]`` holds ``rows[k]`` (a binary search per entry, all
    entries at once; rows are sorted in a canonical CSR)."""
    lo, end = indptr[cols], indptr[cols + 1]
    hi = end.copy()
    last = max(indices.shape[0] - 1, 0)
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) >> 1
        right = active & (indices[np.minimum(mid, last)] < rows)
        lo = np.where(right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)
    return (lo < end) & (indices[np.minimum(lo, last)] == rows)


def _upper_edges(graph: GraphData, block_values: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields each undirected edge once, as ``(u, v)`` blocks with ``u < v`` in CSR order
    (int64 each); refuses a graph that is not symmetric, which the loader could not give
    back, once its blocks are spent."""
    indptr, indices = graph.indptr, graph.indices
    upper = 0
    for r0, r1 in _row_blocks(indptr, block_values):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        rows = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(indptr[r0 : r1 + 1]))
        cols = indices[e0:e1]
        keep = cols > rows
        rows, cols = rows[keep], cols[keep]
        missing = np.flatnonzero(~_has_mirror(indptr, indices, rows, cols))
        if missing.size:
            u, v = int(rows[missing[0]]), int(cols[missing[0]])
            raise ValueError(
                f"the graph is not symmetric (node {v} lists {u}, node {u} does not list "
                f"{v}); OGB's edge list holds undirected edges: write graph.symmetrized()"
            )
        upper += rows.size
        if rows.size:
            yield rows, cols
    # Each upper entry has its mirror, so equal counts mean every lower entry has one too.
    if 2 * upper != graph.num_edges:
        raise ValueError("the graph is not symmetric: write graph.symmetrized()")


def _write_rows(values: np.ndarray, out, width: int, block_values: int) -> None:
    """Writes ``values`` [R, C] as csv in blocks of about ``block_values`` values."""
    step = max(1, block_values // max(values.shape[1], 1))
    for r0 in range(0, values.shape[0], step):
        out.write(_csv_bytes(values[r0 : r0 + step], width))


def _labels_bytes(labels: np.ndarray) -> bytes:
    """One label a line; an unlabelled node (-1) is an empty line, as OGB writes NaN."""
    text = labels.reshape(-1, 1).astype(f"S{_INT_WIDTH}")
    text[labels < 0] = b""
    cells = np.zeros((labels.shape[0], _INT_WIDTH + 1), dtype=np.uint8)
    cells[:, :_INT_WIDTH] = text.view(np.uint8).reshape(-1, _INT_WIDTH)
    cells[:, _INT_WIDTH] = ord("\n")
    return cells[cells != 0].tobytes()


@contextlib.contextmanager
def _gzip_writer(path: Path, compresslevel: int) -> Iterator[gzip.GzipFile]:
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime 0 and no file name in the header: the same graph gives the same bytes.
    with open(path, "wb") as raw, gzip.GzipFile("", "wb", compresslevel, raw, mtime=0) as out:
        yield out


def _write_csv_raw(graph: GraphData, tmp: Path, gz, block_values: int) -> None:
    """The csv layout's ``raw/`` files (see the module docstring)."""
    raw = tmp / "raw"
    num_undirected = 0
    with gz(raw / "edge.csv.gz") as out:
        for rows, cols in _upper_edges(graph, block_values):
            out.write(_csv_bytes(np.stack([rows, cols], axis=1), _INT_WIDTH))
            num_undirected += rows.size
    with gz(raw / "num-edge-list.csv.gz") as out:
        out.write(f"{num_undirected}\n".encode())
    with gz(raw / "num-node-list.csv.gz") as out:
        out.write(f"{graph.num_nodes}\n".encode())
    with gz(raw / "node-feat.csv.gz") as out:
        _write_rows(graph.features, out, _FLOAT_WIDTH, block_values)
    with gz(raw / "node-label.csv.gz") as out:
        out.write(_labels_bytes(graph.labels))


def _masks(graph: GraphData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return graph.train_mask, graph.val_mask, graph.test_mask


def _in_split(graph: GraphData) -> np.ndarray:
    """bool [N]: the nodes of the split, the only ones the binary layout labels."""
    train, val, test = _masks(graph)
    return train | val | test


def _row_slices(num_rows: int, step: int) -> Iterator[slice]:
    """``[r0, r1)`` slices of at most ``step`` rows covering ``num_rows`` rows."""
    step = max(1, step)
    return (slice(r0, min(r0 + step, num_rows)) for r0 in range(0, num_rows, step))


def _float16_blocks(features: np.ndarray, block_values: int) -> Iterator[np.ndarray]:
    """``features`` as float16, a block of rows at a time; refuses values float16 cannot
    hold (beyond 65504 they would become infinite, which no graph may hold)."""
    for rows in _row_slices(features.shape[0], block_values // max(features.shape[1], 1)):
        with np.errstate(over="ignore"):  # checked below, naming the node
            block = features[rows].astype(np.float16)
        if not np.isfinite(block).all():
            bad = rows.start + int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
            raise ValueError(f"node {bad}'s features exceed float16's range (|x| <= 65504)")
        yield block


def _label_blocks(graph: GraphData, block_values: int) -> Iterator[np.ndarray]:
    """float32 labels, NaN for every node outside the split (and any unlabelled one)."""
    for rows in _row_slices(graph.num_nodes, block_values):
        labels = graph.labels[rows].astype(np.float32)
        outside = np.ones(rows.stop - rows.start, dtype=bool)
        for mask in _masks(graph):
            outside &= ~mask[rows]
        labels[outside | (graph.labels[rows] < 0)] = np.nan
        yield labels


def _year_blocks(graph: GraphData, block_values: int) -> Iterator[np.ndarray]:
    """A stand-in ``node_year`` consistent with a time split: train 2017, valid 2018,
    test 2019, others 2016."""
    for rows in _row_slices(graph.num_nodes, block_values):
        year = np.full(rows.stop - rows.start, 2016, dtype=np.int64)
        for value, mask in zip((2017, 2018, 2019), _masks(graph), strict=True):
            year[mask[rows]] = value
        yield year


def _write_binary_raw(graph: GraphData, tmp: Path, meta, block_values: int) -> None:
    """The binary layout's ``raw/`` files (see the module docstring), member by member in
    blocks: the edges in two passes over the CSR (sources, then targets)."""
    n, num_undirected = graph.num_nodes, graph.num_edges // 2
    (tmp / DATA_FILE).parent.mkdir(parents=True, exist_ok=True)
    with NpzWriter(tmp / DATA_FILE) as npz:
        sources = (rows for rows, _ in _upper_edges(graph, block_values))
        targets = (cols for _, cols in _upper_edges(graph, block_values))
        npz.write("edge_index", np.int64, (2, num_undirected), itertools.chain(sources, targets))
        npz.write("num_nodes_list", np.int64, (1,), [np.array([n])])
        npz.write("num_edges_list", np.int64, (1,), [np.array([num_undirected])])
        npz.write(
            "node_feat",
            np.float16,
            graph.features.shape,
            _float16_blocks(graph.features, block_values),
        )
        if "node_year" in meta["additional node files"].split(","):
            npz.write("node_year", np.int64, (n, 1), _year_blocks(graph, block_values))
    with NpzWriter(tmp / LABEL_FILE) as npz:
        npz.write("node_label", np.float32, (n, 1), _label_blocks(graph, block_values))


def _marker_text(provenance: dict) -> str:
    return (
        "This folder is NOT an OGB dataset. It is a synthetic fixture in OGB's raw layout,\n"
        "written by adaqp.data.ogb_fixture from the graph described on the provenance line,\n"
        "so that the OGB loader can be run without the dataset. Results on it are results\n"
        "on that synthetic graph, never on the dataset whose name the folder carries.\n\n"
        f"{PROVENANCE_PREFIX}{json.dumps(provenance, sort_keys=True)}\n"
    )


def write_ogb_fixture(
    graph: GraphData,
    root: str | Path,
    name: str = "ogbn-products",
    *,
    written_by: str = "adaqp.data.ogb_fixture.write_ogb_fixture",
    compresslevel: int = 1,
    block_values: int = BLOCK_VALUES,
) -> Path:
    """Writes ``graph`` as OGB dataset ``name``'s raw layout under ``root`` (see above).

    The folder is built beside its final place and renamed into it once complete, so the
    loader, which takes a folder holding every raw file as complete, never reads half a
    fixture.

    Args:
        graph: A symmetric, single-label graph with at most ``name``'s number of classes.
        root: The loader's ``root``; the fixture becomes ``root/<name with _>/``.
        name: The OGB dataset whose layout, split name and class count are used.
        written_by: What generated the graph, recorded in the marker.
        compresslevel: gzip level, 1 (fastest) to 9.
        block_values: Values formatted at a time.

    Returns:
        The fixture's folder.

    Raises:
        ValueError: the graph cannot pass for ``name`` (multilabel, too many classes, not
            symmetric), or ``name`` is not a supported OGB dataset.
        FileExistsError: the folder exists; it is never overwritten.
    """
    meta, directory, files = ogb_source(name, Path(root))
    name = meta.name  # OGB's spelling, which the loader gives the graph
    num_classes = int(meta["num classes"])
    if graph.multilabel:
        raise ValueError(f"{name} is single-label; a multilabel graph cannot pass for it")
    if graph.num_classes > num_classes:
        raise ValueError(f"{name} has {num_classes} classes, the graph {graph.num_classes}")
    if directory.exists():
        raise FileExistsError(f"{directory} exists; remove it to write a fixture there")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}-fixture-", dir=directory.parent))
    tmp.chmod(0o755)  # mkdtemp's 0o700 would outlive the rename
    try:
        gz = functools.partial(_gzip_writer, compresslevel=compresslevel)
        as_loaded = graph
        if is_binary(meta):
            _write_binary_raw(graph, tmp, meta, block_values)
            # As loaded: float16 features (the file's, mapped: not held twice) and no
            # label outside the split.
            as_loaded = dataclasses.replace(
                graph,
                features=npz_members(tmp / DATA_FILE)["node_feat"].mapped(),
                labels=np.where(_in_split(graph), graph.labels, -1),
            )
        else:
            _write_csv_raw(graph, tmp, gz, block_values)
        for rel, mask in zip(files[-3:], _masks(graph), strict=True):
            with gz(tmp / rel) as out:
                _write_rows(np.flatnonzero(mask).reshape(-1, 1), out, _INT_WIDTH, block_values)
        as_loaded = dataclasses.replace(as_loaded, name=name, num_classes=num_classes)
        provenance = {
            "written_by": written_by,
            "graph": graph.name,
            "graph_info": graph.info,
            "layout": "binary" if is_binary(meta) else "csv",
            "expected_fingerprint": as_loaded.fingerprint(),
        }
        del as_loaded  # and with it the map of the features written
        # OGB's own loader asks before it reads a folder without this file.
        (tmp / f"RELEASE_v{meta['version']}.txt").write_text(f"{name} fixture\n")
        (tmp / FIXTURE_MARKER).write_text(_marker_text(provenance))
        tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote %s (%d undirected edges) to %s", graph.name, graph.num_edges // 2, directory)
    return directory
