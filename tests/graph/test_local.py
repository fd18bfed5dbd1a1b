"""LocalGraph.from_part on a hand-made graph: central rows first, the local CSR is the
part's in-edges, and the aggregation matrix is the global one restricted to the part."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaqp.data import GraphData, csr_from_edges
from adaqp.graph.local import LocalGraph
from adaqp.partitioning import schema, store
from adaqp.partitioning.build import build_parts, make_partition

NUM_NODES = 10
# Undirected edges, plus one directed edge 3 -> 7 (7 has 3 as in-neighbour, not the other
# way round). Node 9 is isolated.
UNDIRECTED = [(0, 1), (1, 2), (2, 3), (3, 0), (2, 4), (4, 5), (5, 6), (6, 7), (7, 4), (1, 6)]
DIRECTED = [(3, 7), (8, 5)]

# Hand-picked assignments: interleaved so that the local order differs from the global.
ASSIGNMENTS = {
    "two-interleaved": [0, 1, 0, 0, 1, 1, 0, 1, 0, 1],
    "three": [2, 0, 1, 1, 0, 2, 2, 0, 1, 0],
    "one": [0] * NUM_NODES,
}


def _graph() -> GraphData:
    src = [a for a, b in UNDIRECTED] + [b for a, b in UNDIRECTED] + [a for a, _ in DIRECTED]
    dst = [b for a, b in UNDIRECTED] + [a for a, b in UNDIRECTED] + [b for _, b in DIRECTED]
    indptr, indices = csr_from_edges(np.array(src), np.array(dst), NUM_NODES, symmetrize=False)
    rng = np.random.default_rng(0)
    train = np.zeros(NUM_NODES, dtype=bool)
    train[:4] = True
    val = np.zeros(NUM_NODES, dtype=bool)
    val[4:6] = True
    graph = GraphData(
        name="tiny",
        indptr=indptr,
        indices=indices,
        features=rng.standard_normal((NUM_NODES, 3)).astype(np.float32),
        labels=np.arange(NUM_NODES, dtype=np.int64) % 3,
        train_mask=train,
        val_mask=val,
        test_mask=~(train | val),
        num_classes=3,
    )
    graph.validate()
    return graph


def _dense_adjacency() -> np.ndarray:
    """A[u, v] = 1 for every edge v -> u, built from the edge lists, not the CSR."""
    a = np.zeros((NUM_NODES, NUM_NODES))
    for u, v in UNDIRECTED:
        a[u, v] = a[v, u] = 1.0
    for v, u in DIRECTED:
        a[u, v] = 1.0
    return a


def _in_neighbours(node: int) -> set[int]:
    return set(np.flatnonzero(_dense_adjacency()[node]).tolist())


def _locals(name: str) -> tuple[np.ndarray, list[LocalGraph]]:
    graph = _graph()
    parts = np.array(ASSIGNMENTS[name], dtype=np.int64)
    arrays, _ = build_parts(graph, parts)
    num_parts = len(arrays)
    return parts, [
        LocalGraph.from_part(schema.Part(rank, num_parts, a)) for rank, a in enumerate(arrays)
    ]


@pytest.fixture(params=sorted(ASSIGNMENTS))
def parted(request):
    return _locals(request.param)


def test_every_node_is_inner_in_exactly_one_part(parted):
    parts, locals_ = parted
    ids = np.concatenate([g.global_ids for g in locals_])
    assert np.array_equal(np.sort(ids), np.arange(NUM_NODES))
    for g in locals_:
        assert (parts[g.global_ids] == g.rank).all()
        assert g.num_parts == len(locals_)
        assert g.num_inner == len(g.global_ids)
        assert g.num_halo == len(g.halo_global_ids)


def test_central_rows_first_and_marginal_after(parted):
    parts, locals_ = parted
    for g in locals_:
        # Independently: inner nodes with an in-neighbour owned by another part.
        marginal = {
            u for u in g.global_ids.tolist() if any(parts[list(_in_neighbours(u))] != g.rank)
        }
        assert g.num_marginal == len(marginal)
        assert g.num_central + g.num_marginal == g.num_inner
        assert set(g.global_ids[g.num_central :].tolist()) == marginal
        for i in range(g.num_inner):
            cols = g.indices[g.indptr[i] : g.indptr[i + 1]]
            if i < g.num_central:
                assert (cols < g.num_inner).all(), f"central row {i} reads a halo row"
            else:
                assert (cols >= g.num_inner).any(), f"marginal row {i} reads no halo row"
        # Each class keeps ascending global ids (a deterministic order).
        central, rest = g.global_ids[: g.num_central], g.global_ids[g.num_central :]
        assert (np.diff(central) > 0).all() and (np.diff(rest) > 0).all()


def test_local_csr_is_the_inner_nodes_in_edges(parted):
    _, locals_ = parted
    for g in locals_:
        to_global = np.concatenate([g.global_ids, g.halo_global_ids])
        assert len(g.indptr) == g.num_inner + 1 and g.indptr[0] == 0
        assert g.indptr[-1] == len(g.indices)
        assert g.indices.dtype == np.int32  # local ids: half the bytes of int64
        for i, u in enumerate(g.global_ids.tolist()):
            cols = g.indices[g.indptr[i] : g.indptr[i + 1]]
            assert (np.diff(cols) > 0).all(), "row not sorted or duplicated"
            assert set(to_global[cols].tolist()) == _in_neighbours(u)
            assert len(cols) == len(_in_neighbours(u))


def test_halo_nodes_are_remote_in_neighbours_by_owner(parted):
    parts, locals_ = parted
    for g in locals_:
        remote = set()
        for u in g.global_ids.tolist():
            remote |= {v for v in _in_neighbours(u) if parts[v] != g.rank}
        assert set(g.halo_global_ids.tolist()) == remote
        assert len(g.halo_global_ids) == len(remote)
        # By owner, then (owner-local order) ascending global id.
        key = parts[g.halo_global_ids] * NUM_NODES + g.halo_global_ids
        assert (np.diff(key) > 0).all()
        assert (
            g.recv_counts == np.bincount(parts[g.halo_global_ids], minlength=g.num_parts).tolist()
        )


def test_degrees_data_and_masks_follow_the_local_order(parted):
    _, locals_ = parted
    graph = _graph()
    in_degree = _dense_adjacency().sum(1).astype(np.int64)
    for g in locals_:
        to_global = np.concatenate([g.global_ids, g.halo_global_ids])
        np.testing.assert_array_equal(g.in_degree, in_degree[to_global])
        np.testing.assert_array_equal(g.features.numpy(), graph.features[g.global_ids])
        np.testing.assert_array_equal(g.labels.numpy(), graph.labels[g.global_ids])
        np.testing.assert_array_equal(g.train_mask.numpy(), graph.train_mask[g.global_ids])
        np.testing.assert_array_equal(g.val_mask.numpy(), graph.val_mask[g.global_ids])
        np.testing.assert_array_equal(g.test_mask.numpy(), graph.test_mask[g.global_ids])
        assert g.device == torch.device("cpu")


def test_send_lists_deliver_each_peers_halo_rows_in_order(parted):
    _, locals_ = parted
    for p in locals_:
        assert len(p.send_idx) == sum(p.send_counts)
        offsets = np.concatenate([[0], np.cumsum(p.send_counts)])
        for q in locals_:
            sent = p.send_idx[offsets[q.rank] : offsets[q.rank + 1]].numpy()
            assert (sent < p.num_inner).all()
            owned = q.halo_global_ids[np.isin(q.halo_global_ids, p.global_ids)]
            np.testing.assert_array_equal(p.global_ids[sent], owned)
            assert p.send_counts[q.rank] == q.recv_counts[p.rank]


def _reference(norm: str) -> np.ndarray:
    a = _dense_adjacency()
    deg = a.sum(1)
    if norm == "gcn":
        d = 1.0 / np.sqrt(deg + 1.0)
        return d[:, None] * (a + np.eye(NUM_NODES)) * d[None, :]
    return a / np.maximum(deg, 1.0)[:, None]


@pytest.mark.parametrize("norm", ["gcn", "mean"])
def test_adjacency_is_the_global_matrix_restricted_to_the_part(parted, norm):
    _, locals_ = parted
    full = _reference(norm)
    for g in locals_:
        adjacency = g.adjacency(norm)
        assert adjacency.shape == (g.num_inner, g.num_inner + g.num_halo)
        to_global = np.concatenate([g.global_ids, g.halo_global_ids])
        expected = full[np.ix_(g.global_ids, to_global)]
        got = adjacency.forward.to_dense().numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
        np.testing.assert_allclose(adjacency.transpose.to_dense().numpy(), expected.T, rtol=1e-6)
        # Every (row, column) of the global matrix in the part's rows is present locally:
        # the local rows lose nothing of the global aggregation.
        np.testing.assert_allclose(got.sum(1), full[g.global_ids].sum(1), rtol=1e-6)


def test_edge_keys_name_each_edge_by_global_ids_in_every_part_and_block(parted):
    """Attention dropout keys an edge's weights by ``(dst << 32) | src`` of global ids: the
    parts' edges together are the whole graph's (self-loops included), each keyed as the
    whole graph keys it, and the central and marginal row blocks keep their rows' keys."""
    _, locals_ = parted
    full = _locals("one")[1][0].adjacency("gat")
    keys = []
    for g in locals_:
        adjacency = g.adjacency("gat")
        dst, src, _ = adjacency.edges()
        to_global = g.local_global_ids
        expected = (to_global[dst.numpy()].astype(np.uint64) << np.uint64(32)) | to_global[
            src.numpy()
        ].astype(np.uint64)
        np.testing.assert_array_equal(adjacency.edge_keys(), expected)
        central = adjacency.row_slice(0, g.num_central, num_cols=g.num_inner)
        marginal = adjacency.row_slice(g.num_central, g.num_inner)
        np.testing.assert_array_equal(
            np.concatenate([central.edge_keys(), marginal.edge_keys()]), expected
        )
        keys.append(expected)
    assert sorted(np.concatenate(keys).tolist()) == sorted(full.edge_keys().tolist())
    assert len(set(full.edge_keys().tolist())) == full.edge_keys().size


def test_mean_rows_without_in_edges_aggregate_to_zero():
    _, (g,) = _locals("one")
    i = int(np.flatnonzero(g.global_ids == 9)[0])  # isolated node
    assert g.in_degree[i] == 0
    assert i < g.num_central
    dense = g.adjacency("mean").forward.to_dense()
    assert (dense[i] == 0).all()
    # GCN keeps its self-loop: coefficient 1 / (0 + 1).
    assert g.adjacency("gcn").forward.to_dense()[i, i] == 1.0


def test_unknown_norm_is_rejected():
    _, (g,) = _locals("one")
    with pytest.raises(ValueError, match="unknown norm 'max'"):
        g.adjacency("max")


def test_one_part_has_no_halo_and_everything_central():
    _, (g,) = _locals("one")
    assert g.num_halo == 0 and g.num_marginal == 0 and g.num_central == NUM_NODES
    assert g.send_counts == [0] and g.recv_counts == [0] and len(g.send_idx) == 0
    np.testing.assert_array_equal(g.global_ids, np.arange(NUM_NODES))


def test_from_a_partition_on_disk(tmp_path):
    graph = _graph()
    meta = make_partition(
        graph, tmp_path / "parts", num_parts=2, spec={"name": "tiny"}, method="random"
    )
    locals_ = [LocalGraph.from_part(store.load_part(tmp_path / "parts", r, meta)) for r in (0, 1)]
    parts = np.empty(NUM_NODES, dtype=np.int64)
    for g in locals_:
        parts[g.global_ids] = g.rank
    test_every_node_is_inner_in_exactly_one_part((parts, locals_))
    test_central_rows_first_and_marginal_after((parts, locals_))
    test_local_csr_is_the_inner_nodes_in_edges((parts, locals_))
    test_halo_nodes_are_remote_in_neighbours_by_owner((parts, locals_))
    test_send_lists_deliver_each_peers_halo_rows_in_order((parts, locals_))
    for norm in ("gcn", "mean"):
        test_adjacency_is_the_global_matrix_restricted_to_the_part((parts, locals_), norm)
    # The partition's own statistics agree with the local graphs.
    for g, entry in zip(locals_, meta["stats"]["parts"], strict=True):
        assert (g.num_central, g.num_halo) == (entry["num_central"], entry["num_halo"])
