"""The part-at-a-time build equals the all-at-once build it replaced, bit for bit, and a
lean source (int32 ids, features spilled to disk) gives the same parts as the graph."""

from __future__ import annotations

import numpy as np
import pytest

from adaqp.config import DataConfig, PartitionConfig
from adaqp.data import SyntheticSpec, load_dataset
from adaqp.data.pages import is_mapped
from adaqp.partitioning import schema, store
from adaqp.partitioning import source as source_module
from adaqp.partitioning.build import build_parts, ensure_partition, make_partition
from adaqp.partitioning.cut import assign_parts
from adaqp.partitioning.parts import PartBuilder
from adaqp.partitioning.source import GraphSource


def _reference_parts(graph, parts):
    """The build as it was before parts were built one at a time (all parts at once,
    int64 throughout, halos by ``np.unique(..., return_inverse=True)``, sources sorted
    within rows by ``np.lexsort``): the reference the streaming build must reproduce."""
    num_nodes = graph.num_nodes
    num_parts = int(parts.max()) + 1
    order = np.argsort(parts, kind="stable")
    offsets = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=num_parts), out=offsets[1:])
    owner_local = np.empty(num_nodes, dtype=np.int64)
    owner_local[order] = np.arange(num_nodes, dtype=np.int64) - offsets[parts[order]]
    in_degree = np.diff(graph.indptr)
    structure = []
    for p in range(num_parts):
        inner = order[offsets[p] : offsets[p + 1]]
        lengths = graph.indptr[inner + 1] - graph.indptr[inner]
        local_indptr = np.zeros(len(inner) + 1, dtype=np.int64)
        np.cumsum(lengths, out=local_indptr[1:])
        edge_pos = np.repeat(graph.indptr[inner] - local_indptr[:-1], lengths) + np.arange(
            local_indptr[-1], dtype=np.int64
        )
        src = graph.indices[edge_pos]
        remote = parts[src] != p
        keys = parts[src[remote]] * num_nodes + owner_local[src[remote]]
        halo_keys, halo_pos = np.unique(keys, return_inverse=True)
        halo_owner, halo_owner_local = halo_keys // num_nodes, halo_keys % num_nodes
        local_src = np.empty(len(src), dtype=np.int64)
        local_src[~remote] = owner_local[src[~remote]]
        local_src[remote] = len(inner) + halo_pos
        rows = np.repeat(np.arange(len(inner), dtype=np.int64), np.diff(local_indptr))
        local_src = local_src[np.lexsort((local_src, rows))]
        structure.append(
            {
                "global_ids": inner,
                "indptr": local_indptr,
                "indices": local_src,
                "halo_global_ids": order[offsets[halo_owner] + halo_owner_local],
                "halo_owner": halo_owner,
                "halo_owner_local": halo_owner_local,
                "recv_counts": np.bincount(halo_owner, minlength=num_parts).astype(np.int64),
            }
        )
    result = []
    for q, mine in enumerate(structure):
        sends = [s["halo_owner_local"][s["halo_owner"] == q] for s in structure]
        inner = mine["global_ids"]
        result.append(
            {
                **mine,
                "send_idx": np.concatenate(sends).astype(np.int64),
                "send_counts": np.array([len(s) for s in sends], dtype=np.int64),
                "features": np.ascontiguousarray(graph.features[inner], dtype=np.float32),
                "labels": graph.labels[inner],
                "train_mask": graph.train_mask[inner],
                "val_mask": graph.val_mask[inner],
                "test_mask": graph.test_mask[inner],
                "in_degree": in_degree[inner].astype(np.int64),
                "halo_degree": in_degree[mine["halo_global_ids"]].astype(np.int64),
            }
        )
    return result


def _assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)  # the same arrays in the same order in the .npz
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


def _graph(communities: int = 6):
    spec = SyntheticSpec(
        num_nodes=1500, num_classes=5, avg_degree=9.0, feature_dim=7, seed=11,
        communities=communities, inter_community=0.2, power_law=2.5 if communities else 0.0,
    )  # fmt: skip
    return load_dataset("synthetic", synthetic=spec)


@pytest.mark.parametrize("method", ["metis", "random", "contiguous"])
@pytest.mark.parametrize("num_parts", [1, 3, 5])
def test_each_part_equals_the_all_at_once_build(method: str, num_parts: int) -> None:
    graph = _graph()
    parts = assign_parts(graph.indptr, graph.indices, num_parts, method=method, seed=2)
    want = _reference_parts(graph, parts)
    got, edge_cut = build_parts(graph, parts)
    assert len(got) == num_parts
    for g, w in zip(got, want, strict=True):
        _assert_same(g, w)
    assert edge_cut == sum(int((w["indices"] >= len(w["global_ids"])).sum()) for w in want)


def test_a_lean_source_builds_the_same_parts(tmp_path, monkeypatch) -> None:
    # Blocks of 64 rows: the spill is read across many block boundaries.
    monkeypatch.setattr(source_module, "_ROWS_PER_READ", 64)
    monkeypatch.setattr(source_module, "_IDS_PER_CAST", 1000)
    graph = _graph(communities=0)
    parts = assign_parts(graph.indptr, graph.indices, 4, method="metis", seed=0)
    want = _reference_parts(graph, parts)
    fingerprint = graph.fingerprint()
    indices = graph.indices.copy()
    source = GraphSource.take(graph, tmp_path)
    assert source.indices.dtype == np.int32 and np.array_equal(source.indices, indices)
    assert is_mapped(source.indices)  # spilled: not resident beside the partitioner
    assert source.features is None and source.features_file.is_file()
    assert graph.indices.size == 0 and graph.features.size == 0  # taken over
    assert source.record["fingerprint"] == fingerprint
    with source:
        for got, w in zip(PartBuilder(source, parts), want, strict=True):
            _assert_same(got, w)
    assert not any(tmp_path.iterdir())  # the scratch directory is gone


def test_spilled_ids_keep_every_value_and_a_wide_graph_its_width(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(source_module, "_IDS_PER_CAST", 100)  # written in many blocks
    ids = np.arange(0, 5000, 7, dtype=np.int64)
    (tmp_path / "narrow").mkdir()
    (tmp_path / "wide").mkdir()
    narrow = source_module._spill_ids(ids, 5000, tmp_path / "narrow")
    assert narrow.dtype == np.int32 and np.array_equal(narrow, ids)
    wide = source_module._spill_ids(ids, 2**31, tmp_path / "wide")
    assert wide.dtype == np.int64 and np.array_equal(wide, ids)


def test_python_m_partition_path_writes_what_make_partition_writes(tmp_path) -> None:
    """ensure_partition takes the graph over lean; its parts equal make_partition's from
    the graph in memory, and its metadata records each stage's time and peak."""
    data = DataConfig(dataset="cora")
    part = PartitionConfig(method="metis")
    lean = ensure_partition(data, part, 3, tmp_path / "lean", tool=True)
    plain = make_partition(load_dataset("cora"), tmp_path / "plain", num_parts=3, spec=data.spec())
    assert lean["dataset"]["fingerprint"] == plain["dataset"]["fingerprint"]
    assert lean["stats"] == plain["stats"]
    for rank in range(3):
        _assert_same(
            store.load_part(tmp_path / "lean", rank).arrays,
            store.load_part(tmp_path / "plain", rank).arrays,
        )
    names = [s["name"] for s in lean["stages"]]
    assert names == ["load", "take over", "cut", "halos", "build and write"]
    assert all(s["seconds"] >= 0 and s["peak_memory_bytes"] > 0 for s in lean["stages"])
    # The tool resets the high-water mark per stage; a library call, inside a process
    # whose own peak is reported (a training rank), leaves it alone.
    assert not any(s["peak_since_start"] for s in lean["stages"])
    assert all(s["peak_since_start"] for s in plain["stages"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lean", "plain"]  # no scratch left


def test_a_full_disk_while_spilling_leaves_nothing_behind(tmp_path, monkeypatch) -> None:
    def no_space(path, mode="r"):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(source_module, "open", no_space, raising=False)
    with pytest.raises(schema.PartitionError, match="No space left"):
        ensure_partition(DataConfig(dataset="cora"), PartitionConfig(), 2, tmp_path / "p")
    assert not any(tmp_path.iterdir())
