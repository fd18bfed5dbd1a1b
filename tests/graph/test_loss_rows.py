"""The rows a training step computes (``train.compute_rows = "loss"``), worked out per part
with a flag exchange, against the same sets counted on the whole graph: each layer's
output rows, the halo rows it reads and the rows its peers read, the ring order, and each
layer's cut of the aggregation matrix. Training's exactness under it is
tests/run/test_trainer.py's."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from adaqp.data import GraphData, csr_from_edges
from adaqp.graph.local import LocalGraph
from adaqp.graph.loss_rows import layer_adjacency, layer_rows, order_by_ring, rings
from adaqp.partitioning import schema
from adaqp.partitioning.build import build_parts

NUM_NODES = 40
LAYERS = 3


def _graph(seed: int) -> GraphData:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, NUM_NODES, 70)
    dst = rng.integers(0, NUM_NODES, 70)
    keep = src != dst
    indptr, indices = csr_from_edges(src[keep], dst[keep], NUM_NODES, symmetrize=seed % 2 == 0)
    train = np.zeros(NUM_NODES, dtype=bool)
    train[rng.choice(NUM_NODES, 4, replace=False)] = True
    graph = GraphData(
        name="random",
        indptr=indptr,
        indices=indices,
        features=rng.standard_normal((NUM_NODES, 3)).astype(np.float32),
        labels=rng.integers(0, 3, NUM_NODES),
        train_mask=train,
        val_mask=~train,
        test_mask=np.zeros(NUM_NODES, dtype=bool),
        num_classes=3,
    )
    graph.validate()
    return graph


def _needed(graph: GraphData) -> list[set[int]]:
    """Each layer's output rows on the whole graph: the last layer's the training nodes,
    each earlier one's the next one's and their in-neighbours."""
    out = [set(np.flatnonzero(graph.train_mask).tolist())]
    for _ in range(LAYERS - 1):
        below = set(out[0])
        for u in out[0]:
            below |= set(graph.indices[graph.indptr[u] : graph.indptr[u + 1]].tolist())
        out.insert(0, below)
    return out


def _collectively(locals_: list[LocalGraph], work):
    """Runs ``work(graph, exchange)`` for every part at once (a thread each), with a flag
    exchange between them as the transport's set-up exchange moves them."""
    barrier = threading.Barrier(len(locals_))
    posted: dict[int, np.ndarray] = {}
    results: dict[int, object] = {}

    def exchange_for(me: LocalGraph):
        def exchange(halo_flags: np.ndarray) -> np.ndarray:
            posted[me.rank] = halo_flags
            barrier.wait()
            # Each peer's flags on its halo rows that this rank owns, peers in rank order:
            # aligned with this rank's send list.
            got = [
                posted[peer.rank][np.isin(peer.halo_global_ids, me.global_ids)] for peer in locals_
            ]
            barrier.wait()
            return np.concatenate(got).astype(bool)

        return exchange

    def run(graph: LocalGraph) -> None:
        results[graph.rank] = work(graph, exchange_for(graph))

    threads = [threading.Thread(target=run, args=(g,)) for g in locals_]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == len(locals_), "a part's thread failed"
    return [results[g.rank] for g in locals_]


def _parts(graph: GraphData, num_parts: int, seed: int) -> list[LocalGraph]:
    parts = np.random.default_rng(seed).integers(0, num_parts, NUM_NODES)
    parts[:num_parts] = np.arange(num_parts)  # no empty part
    arrays, _ = build_parts(graph, parts)
    return [LocalGraph.from_part(schema.Part(r, len(arrays), a)) for r, a in enumerate(arrays)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("num_parts", [1, 2, 3])
@pytest.mark.parametrize("cached_input", [True, False])
def test_each_layer_computes_and_exchanges_exactly_what_the_loss_reads(
    seed, num_parts, cached_input
):
    graph = _graph(seed)
    needed = _needed(graph)
    locals_ = _parts(graph, num_parts, seed)
    full = {g.rank: g.adjacency("gcn").forward.to_dense().numpy() for g in locals_}
    old_ids = {g.rank: np.concatenate([g.global_ids, g.halo_global_ids]) for g in locals_}

    def work(g: LocalGraph, exchange):
        ring = rings(g, LAYERS, exchange)
        # Ring r: the layers from the last whose output reads the row, as counted globally.
        for i, u in enumerate(g.global_ids.tolist()):
            expected = next(
                (LAYERS - 1 - ell for ell in range(LAYERS - 1, -1, -1) if u in needed[ell]), LAYERS
            )
            assert ring[i] == expected, f"node {u}"
        order = order_by_ring(g, ring)
        g.reorder(order)
        return layer_rows(g, ring[order], LAYERS, cached_input, exchange)

    per_part = _collectively(locals_, work)
    sent_to: dict[tuple[int, int], set[int]] = {}
    for g, rows in zip(locals_, per_part, strict=True):
        assert np.all(np.diff([r.num_out for r in rows]) <= 0), "nested, shrinking"
        for layer, r in enumerate(rows):
            mine = set(g.global_ids.tolist())
            assert set(g.global_ids[: r.num_out].tolist()) == needed[layer] & mine
            reads = set()
            for u in g.global_ids[: r.num_out].tolist():
                reads |= set(graph.indices[graph.indptr[u] : graph.indptr[u + 1]].tolist())
            if layer == 0 and cached_input:
                assert r.halo_keep is None and r.num_halo == g.num_halo
            else:
                assert set(g.halo_global_ids[r.halo_keep].tolist()) == reads - mine
                sent_to[(g.rank, layer)] = set(g.global_ids[r.send_idx.numpy()].tolist())
            # The layer's cut of the matrix: its rows, its inner inputs and halo columns.
            cut = layer_adjacency(g.adjacency("gcn"), r, g.num_inner).forward.to_dense().numpy()
            halo = g.halo_global_ids if r.halo_keep is None else g.halo_global_ids[r.halo_keep]
            cols = np.concatenate([g.global_ids[: r.num_in], halo])
            rows_old = [
                int(np.flatnonzero(old_ids[g.rank] == u)[0]) for u in g.global_ids[: r.num_out]
            ]
            cols_old = [int(np.flatnonzero(old_ids[g.rank] == u)[0]) for u in cols]
            np.testing.assert_array_equal(cut, full[g.rank][np.ix_(rows_old, cols_old)])
            # Nothing a row reads is left out of the cut.
            np.testing.assert_allclose(cut.sum(1), full[g.rank][rows_old].sum(1), rtol=1e-6)
    # A rank sends a layer the rows its peers' output rows read, and no other.
    for g in locals_:
        for layer in range(LAYERS):
            if (g.rank, layer) not in sent_to:
                continue
            wanted = set()
            for peer in locals_:
                if peer.rank == g.rank:
                    continue
                for u in needed[layer] & set(peer.global_ids.tolist()):
                    wanted |= set(graph.indices[graph.indptr[u] : graph.indptr[u + 1]].tolist())
            assert sent_to[(g.rank, layer)] == wanted & set(g.global_ids.tolist())


@pytest.mark.parametrize("block", [7, 1 << 22])
def test_reorder_keeps_every_row_and_counts_the_leading_central_rows(block, monkeypatch):
    """Also rebuilt a few entries at a time (``block``), as a large part is."""
    monkeypatch.setattr("adaqp.graph.local._REORDER_BLOCK", block)
    graph = _graph(0)
    for g in _parts(graph, 3, 0):
        before = g.adjacency("mean").forward.to_dense().numpy()
        ids = g.global_ids.copy()
        sent = g.global_ids[g.send_idx.numpy()]
        order = np.random.default_rng(1).permutation(g.num_inner)
        g.reorder(order)
        np.testing.assert_array_equal(g.global_ids, ids[order])
        after = g.adjacency("mean").forward.to_dense().numpy()
        halo = np.arange(g.num_inner, g.num_inner + g.num_halo)
        np.testing.assert_array_equal(after, before[order][:, np.concatenate([order, halo])])
        reads_halo = (after[:, g.num_inner :] != 0).any(1)
        assert not reads_halo[: g.num_central].any()
        assert g.num_central == g.num_inner or reads_halo[g.num_central]
        np.testing.assert_array_equal(g.global_ids[g.send_idx.numpy()], sent)
