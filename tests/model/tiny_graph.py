"""The 12-node graph the one-worker model tests run on, and its single part.

A random directed edge list without self-loops or duplicates (node 11 isolated), 6
features, 3 classes; ``propagation`` builds the model's propagation over the whole graph
as one part (no exchange), whose local ids are not the global ones.
"""

from __future__ import annotations

import numpy as np

from adaqp.data import GraphData, csr_from_edges
from adaqp.graph.local import LocalGraph
from adaqp.model.gnn import GNN
from adaqp.model.layers import Propagation
from adaqp.partitioning import schema
from adaqp.partitioning.build import build_parts

N, F, C = 12, 6, 3
"""Nodes, features, classes."""


def edges() -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)``: the edge list, global ids."""
    rng = np.random.default_rng(5)
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, N - 1, size=(30, 2)) if a != b}
    src, dst = np.array(sorted(pairs)).T
    return src, dst


def tiny_graph() -> GraphData:
    """The graph: CSR of :func:`edges` (not symmetrised), nodes 0-5 train, the rest test."""
    src, dst = edges()
    indptr, indices = csr_from_edges(src, dst, N, symmetrize=False)
    rng = np.random.default_rng(1)
    train = np.zeros(N, dtype=bool)
    train[:6] = True
    graph = GraphData(
        name="tiny",
        indptr=indptr,
        indices=indices,
        features=rng.standard_normal((N, F)).astype(np.float32),
        labels=np.arange(N, dtype=np.int64) % C,
        train_mask=train,
        val_mask=np.zeros(N, dtype=bool),
        test_mask=~train,
        num_classes=C,
    )
    graph.validate()
    return graph


def propagation(model: GNN) -> tuple[Propagation, LocalGraph]:
    """``model``'s propagation over the whole graph as one part, and that part."""
    arrays, _ = build_parts(tiny_graph(), np.zeros(N, dtype=np.int64))
    graph = LocalGraph.from_part(schema.Part(0, 1, arrays[0]))
    return Propagation(graph, graph.adjacency(model.norm), policy=None), graph
