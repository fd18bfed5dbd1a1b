"""Adapters from in-memory PyG and DGL graphs to :class:`~adaqp.data.graph.GraphData`.

Both are duck-typed, so neither library is imported here; tensors are converted to numpy.
"""

from __future__ import annotations

from typing import Any

from adaqp.data.graph import (
    MASK_ARRAYS,
    GraphData,
    assemble_graph,
    csr_from_edges,
    describe_dataset,
    to_numpy,
)


def _from_edge_list(
    source: str, name: str, edges: tuple, nodes: tuple, symmetrize: bool, num_classes: int | None
) -> GraphData:
    """``edges`` = (src, dst, N); ``nodes`` = (features, labels, train, val, test); tensors ok."""
    src, dst, n = edges
    try:
        indptr, indices = csr_from_edges(to_numpy(src), to_numpy(dst), n, symmetrize=symmetrize)
    except ValueError as exc:
        raise ValueError(f"{describe_dataset(name, None)} from {source}: edges: {exc}") from None
    labels = to_numpy(nodes[1])
    multilabel = labels.ndim == 2 and labels.shape[1] > 1 and labels.dtype.kind == "f"
    info = {"source": source, "symmetrized": symmetrize}
    return assemble_graph(name, (indptr, indices, *nodes), num_classes, multilabel, info)


def from_pyg(
    data: Any, name: str = "pyg", *, symmetrize: bool = False, num_classes: int | None = None
) -> GraphData:
    """Converts a ``torch_geometric.data.Data`` (duck-typed; PyG is not imported).

    Uses ``edge_index`` [2, E] (row 0 = source, row 1 = target), ``x`` [N, F], ``y`` [N]
    (or [N, C] float multilabel) and 1-D ``train_mask``/``val_mask``/``test_mask``.
    """
    keys = ("x", "y", *MASK_ARRAYS)
    missing = [k for k in ("edge_index", *keys) if getattr(data, k, None) is None]
    if missing:
        raise ValueError(f"PyG data object lacks {missing}")
    nodes = tuple(getattr(data, k) for k in keys)
    edges = (*to_numpy(data.edge_index), int(data.num_nodes))
    return _from_edge_list("pyg", name, edges, nodes, symmetrize, num_classes)


def from_dgl(
    graph: Any, name: str = "dgl", *, symmetrize: bool = False, num_classes: int | None = None
) -> GraphData:
    """Converts a homogeneous DGL graph (duck-typed; untested since DGL is not a dependency).

    Uses ``graph.edges()`` (source, target) and ``graph.ndata`` keys ``feat``, ``label``,
    ``train_mask``, ``val_mask`` and ``test_mask``.
    """
    keys = ("feat", "label", *MASK_ARRAYS)
    missing = [k for k in keys if k not in graph.ndata]
    if missing:
        raise ValueError(f"DGL graph ndata lacks {missing}")
    nodes = tuple(graph.ndata[k] for k in keys)
    edges = (*graph.edges(), int(graph.num_nodes()))
    return _from_edge_list("dgl", name, edges, nodes, symmetrize, num_classes)
