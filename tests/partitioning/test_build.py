"""Partition invariants: the parts, with their halos, hold exactly the whole graph."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from adaqp.config import load_config
from adaqp.data import SyntheticSpec, load_dataset
from adaqp.graph.local import LocalGraph
from adaqp.partitioning import schema, store
from adaqp.partitioning.build import ensure_partition, make_partition
from adaqp.partitioning.cut import assign_parts
from partition.__main__ import main as partition_main


@pytest.fixture(scope="module")
def graph():
    spec = SyntheticSpec(num_nodes=600, num_classes=4, avg_degree=8, feature_dim=12, seed=3)
    return load_dataset("synthetic", synthetic=spec)


def _spec(graph):
    return {"name": graph.name, "test": True}


@pytest.fixture(scope="module", params=["metis", "kaminpar", "random", "contiguous"])
def parted(request, graph, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "parts"
    meta = make_partition(graph, out, num_parts=4, spec=_spec(graph), method=request.param)
    parts = [store.load_part(out, rank) for rank in range(4)]
    return out, meta, parts


def test_every_node_is_inner_exactly_once_and_data_rebuilds(graph, parted):
    _, _, parts = parted
    ids = np.concatenate([p.global_ids for p in parts])
    assert np.array_equal(np.sort(ids), np.arange(graph.num_nodes))
    features = np.zeros_like(graph.features)
    labels = np.full_like(graph.labels, -1)
    masks = np.zeros((3, graph.num_nodes), dtype=bool)
    for p in parts:
        features[p.global_ids] = p.features
        labels[p.global_ids] = p.labels
        masks[:, p.global_ids] = [p.train_mask, p.val_mask, p.test_mask]
    np.testing.assert_array_equal(features, graph.features)
    np.testing.assert_array_equal(labels, graph.labels)
    np.testing.assert_array_equal(masks[0], graph.train_mask)
    np.testing.assert_array_equal(masks[1], graph.val_mask)
    np.testing.assert_array_equal(masks[2], graph.test_mask)


def test_halo_lists_match_owner_send_lists(parted):
    _, _, parts = parted
    for p in parts:
        assert not np.isin(p.halo_global_ids, p.global_ids).any()
        assert np.array_equal(p.halo_owner, np.sort(p.halo_owner, kind="stable"))
        for q in parts:
            # What q sends to p, in order, is exactly p's halo rows owned by q.
            start = int(q.send_counts[: p.rank].sum())
            sent = q.send_idx[start : start + int(q.send_counts[p.rank])]
            owned = p.halo_owner == q.rank
            np.testing.assert_array_equal(q.global_ids[sent], p.halo_global_ids[owned])
            assert int(p.recv_counts[q.rank]) == int(owned.sum())


def test_local_aggregation_equals_full_graph_aggregation(graph, parted):
    _, _, parts = parted
    n = graph.num_nodes
    a = sp.csr_matrix((np.ones(graph.num_edges), graph.indices, graph.indptr), shape=(n, n))
    deg = np.asarray(a.sum(1)).ravel()
    d = 1.0 / np.sqrt(deg + 1.0)
    full = {
        "gcn": sp.diags(d) @ (a + sp.eye(n)) @ sp.diags(d),
        "mean": sp.diags(1.0 / np.maximum(deg, 1.0)) @ a,
    }
    x = np.random.default_rng(0).standard_normal((n, 5)).astype(np.float32)
    for norm, matrix in full.items():
        expected = matrix @ x
        for part in parts:
            local = LocalGraph.from_part(part)
            # Halo rows come from their owners; inner rows from this part.
            h = np.concatenate([x[local.global_ids], x[local.halo_global_ids]])
            got = local.adjacency(norm).forward @ torch.from_numpy(h)
            np.testing.assert_allclose(
                got.numpy(), expected[local.global_ids], rtol=1e-5, atol=1e-6
            )
            # Central rows read no halo column: they can run before the exchange lands.
            central = local.adjacency(norm).row_slice(0, local.num_central)
            assert (central.forward.col_indices() < local.num_inner).all()


def test_metadata_counts_and_edge_cut(graph, parted):
    out, meta, parts = parted
    again = schema.read_metadata(out)
    assert again == json.loads(json.dumps(meta))
    assert sum(e["num_inner"] for e in meta["parts"]) == graph.num_nodes
    assert sum(e["num_edges"] for e in meta["parts"]) == graph.num_edges
    assert meta["edge_cut"] == sum(int((p.indices >= p.num_inner).sum()) for p in parts)
    assert meta["dataset"]["fingerprint"] == graph.fingerprint()


def test_metis_cuts_fewer_edges_than_random(graph, tmp_path):
    cuts = {}
    for method in ("metis", "random"):
        meta = make_partition(
            graph, tmp_path / method, num_parts=4, spec=_spec(graph), method=method
        )
        cuts[method] = meta["edge_cut"]
    assert cuts["metis"] < 0.7 * cuts["random"]


def test_metis_balances_training_nodes(graph):
    parts = assign_parts(graph.indptr, graph.indices, 4, train_mask=graph.train_mask)
    per_part = np.bincount(parts[graph.train_mask], minlength=4)
    assert per_part.max() <= 1.35 * per_part.mean()
    assert np.bincount(parts, minlength=4).max() <= 1.1 * graph.num_nodes / 4


def test_tampered_part_file_is_rejected(graph, tmp_path):
    out = tmp_path / "parts"
    make_partition(graph, out, num_parts=2, spec=_spec(graph))
    path = out / schema.part_file(1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    store.load_part(out, 0)
    with pytest.raises(schema.PartitionError, match="checksum"):
        store.load_part(out, 1)
    path.unlink()
    with pytest.raises(schema.PartitionError, match="missing"):
        store.load_part(out, 1)


def test_missing_and_foreign_metadata_are_rejected(tmp_path):
    with pytest.raises(schema.PartitionError, match="no partition"):
        schema.read_metadata(tmp_path)
    (tmp_path / schema.METADATA_FILE).write_text("{not json")
    with pytest.raises(schema.PartitionError, match="not valid JSON"):
        schema.read_metadata(tmp_path)
    (tmp_path / schema.METADATA_FILE).write_text('{"format": "something-else"}')
    with pytest.raises(schema.PartitionError, match="not an AdaQP partition"):
        schema.read_metadata(tmp_path)


def test_partition_made_for_other_graph_or_params_is_not_reused(tmp_path):
    out = tmp_path / "parts"
    config = load_config(None, ["data.dataset=cora"])
    ensure_partition(config.data, config.partition, 2, out)
    stamp = (out / schema.METADATA_FILE).stat().st_mtime_ns
    ensure_partition(config.data, config.partition, 2, out)  # same: reused, not rewritten
    assert (out / schema.METADATA_FILE).stat().st_mtime_ns == stamp
    with pytest.raises(schema.PartitionError, match="world size is 4"):
        ensure_partition(config.data, config.partition, 4, out)
    other = load_config(None, ["data.dataset=cora", "data.split_seed=7"])
    with pytest.raises(schema.PartitionError, match="made from dataset"):
        ensure_partition(other.data, other.partition, 2, out)
    random = load_config(None, ["data.dataset=cora", "partition.method=random"])
    with pytest.raises(schema.PartitionError, match="made with"):
        ensure_partition(random.data, random.partition, 2, out)
    meta = ensure_partition(other.data, other.partition, 2, out, force=True)
    assert meta["dataset"]["spec"]["split_seed"] == 7


def test_a_partition_of_row_normalised_features_stores_them(tmp_path):
    config = load_config(None, ["data.dataset=cora", "data.feature_norm=row"])
    meta = ensure_partition(config.data, config.partition, 2, tmp_path / "parts")
    assert meta["dataset"]["spec"]["feature_norm"] == "row"
    for rank in range(2):
        features = store.load_part(tmp_path / "parts", rank, meta).features
        np.testing.assert_allclose(features.sum(axis=1), 1.0, rtol=1e-5)


def test_command_line_writes_partition_and_reports_cut(tmp_path, capsys):
    out = tmp_path / "cora4"
    assert partition_main(["--dataset", "cora", "--num-parts", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "edge cut" in printed and "balance" in printed
    assert schema.read_metadata(out)["params"]["num_parts"] == 4
    assert (
        partition_main(["--dataset", "nope", "--num-parts", "2", "--out", str(tmp_path / "x")]) == 2
    )
    assert "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        partition_main(["--num-parts", "0", "--out", str(tmp_path / "y")])
    assert (
        exit_.value.code == 2 and "--num-parts must be at least 1, got 0" in capsys.readouterr().err
    )
    assert not (tmp_path / "y").exists()


def test_stats_count_cut_halo_rows_and_central_nodes(graph, parted):
    _, meta, parts = parted
    stats = meta["stats"]
    assert len(stats["parts"]) == len(parts)
    for part, entry in zip(parts, stats["parts"], strict=True):
        local = LocalGraph.from_part(part)
        assert entry["edge_cut"] == int((part.indices >= part.num_inner).sum())
        assert entry["num_halo"] == part.num_halo
        # LocalGraph orders central nodes first by its own count: the two must agree.
        assert entry["num_central"] == local.num_central
        assert entry["central_fraction"] == pytest.approx(local.num_central / part.num_inner)
    assert stats["edge_cut"] == meta["edge_cut"]
    assert stats["halo_rows"] == sum(p.num_halo for p in parts)
    assert stats["halo_rows_per_node"] == pytest.approx(stats["halo_rows"] / graph.num_nodes)
    assert stats["central_fraction"] == pytest.approx(
        sum(e["num_central"] for e in stats["parts"]) / graph.num_nodes
    )
    assert 0 < stats["central_fraction"] < 1 and stats["halo_rows"] > 0


def test_volume_objective_reaches_metis(graph, monkeypatch):
    import pymetis

    seen = []
    real = pymetis.part_graph

    def spy(*args, **kwargs):
        seen.append((kwargs["options"].objtype, kwargs.get("recursive")))
        return real(*args, **kwargs)

    monkeypatch.setattr(pymetis, "part_graph", spy)
    for objective in ("cut", "volume"):
        parts = assign_parts(graph.indptr, graph.indices, 4, objective=objective)
        assert np.bincount(parts, minlength=4).max() <= 1.1 * graph.num_nodes / 4
    # cut: METIS's default objective (-1) and pymetis's choice of scheme; volume: k-way.
    assert seen == [(-1, None), (1, False)]
    with pytest.raises(ValueError, match="objective"):
        assign_parts(graph.indptr, graph.indices, 4, objective="speed")


def test_partition_made_with_another_objective_is_not_reused(tmp_path):
    out = tmp_path / "parts"
    cut = load_config(None, ["data.dataset=cora"])
    volume = load_config(None, ["data.dataset=cora", "partition.objective=volume"])
    meta = ensure_partition(volume.data, volume.partition, 2, out)
    assert meta["params"]["objective"] == "volume"
    assert ensure_partition(volume.data, volume.partition, 2, out) == schema.read_metadata(out)
    with pytest.raises(schema.PartitionError, match="'objective': 'volume'"):
        ensure_partition(cut.data, cut.partition, 2, out)
    # Metadata from before the option has no objective: it counts as cut.
    old = {**meta, "params": {k: v for k, v in meta["params"].items() if k != "objective"}}
    kwargs = {"spec": cut.data.spec(), "num_parts": 2, "method": "metis", "seed": 0}
    schema.check_matches(old, out, **kwargs, balance_train=True, objective="cut")
    with pytest.raises(schema.PartitionError, match="made with"):
        schema.check_matches(old, out, **kwargs, balance_train=True, objective="volume")


def test_ensure_partition_never_removes_foreign_files(tmp_path):
    out = tmp_path / "scratch"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("keep")
    config = load_config(None, ["data.dataset=cora"])
    for force in (False, True):
        with pytest.raises(schema.PartitionError, match="nothing was removed"):
            ensure_partition(config.data, config.partition, 2, out, force=force)
        assert (out / "notes.txt").read_text() == "keep" and (out / "sub").is_dir()


def test_ensure_partition_refuses_an_older_format_until_forced(tmp_path):
    out = tmp_path / "parts"
    config = load_config(None, ["data.dataset=cora"])
    ensure_partition(config.data, config.partition, 2, out)
    meta = json.loads((out / schema.METADATA_FILE).read_text())
    meta["format_version"] = 1
    del meta[schema.CHECKSUM_KEY]
    (out / schema.METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(schema.PartitionError, match="format version 1.*re-create"):
        ensure_partition(config.data, config.partition, 2, out)
    again = ensure_partition(config.data, config.partition, 2, out, force=True)
    assert again["format_version"] == schema.FORMAT_VERSION
    store.load_part(out, 1)


def test_command_line_objective_stats_and_refusals(tmp_path, capsys):
    out = tmp_path / "cora4"
    args = ["--dataset", "cora", "--num-parts", "4", "--out", str(out)]
    assert partition_main([*args, "--objective", "volume"]) == 0
    printed = capsys.readouterr().out
    meta = schema.read_metadata(out)
    assert meta["params"]["objective"] == "volume"
    assert "objective volume" in printed and "halo rows" in printed and "central" in printed
    assert printed.count("  part ") == 4
    assert f"halo rows {meta['stats']['halo_rows']} " in printed
    # Another objective on the same directory is refused, not silently reused.
    assert partition_main(args) == 2
    assert "objective" in capsys.readouterr().err
    scratch = tmp_path / "scratch"
    (scratch / "sub").mkdir(parents=True)
    (scratch / "notes.txt").write_text("keep")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for bad, says in [
        (scratch, "not an AdaQP partition"),
        (afile, "not a directory"),
        (afile / "parts", "cannot write a partition"),
    ]:
        bad_args = ["--dataset", "cora", "--num-parts", "2", "--out", str(bad)]
        assert partition_main([*bad_args, "--force"]) == 2
        assert says in capsys.readouterr().err
    assert (scratch / "notes.txt").read_text() == "keep" and (scratch / "sub").is_dir()
    assert afile.read_text() == "x"


@pytest.mark.parametrize("when", ["before the write", "during the rename"])
def test_two_runs_making_one_partition_at_once_both_use_it(tmp_path, monkeypatch, when):
    """Two runs started together both find no partition; the one that writes second uses
    the first one's partition instead of failing or replacing it under the first's feet."""
    from adaqp.partitioning import store

    out = tmp_path / "parts"
    config = load_config(None, ["data.dataset=cora"])
    other = tmp_path / "other-run"
    ensure_partition(config.data, config.partition, 2, other)

    def the_other_run_wins():
        if not out.exists():
            store.shutil.copytree(other, out)

    if when == "before the write":
        real = store._owned_files

        def owned(path):
            the_other_run_wins()  # it finished while this run was partitioning
            return real(path)

        monkeypatch.setattr(store, "_owned_files", owned)
    else:
        real_rename = store.os.rename

        def rename(src, dst):
            the_other_run_wins()  # it moved its partition in just before this one
            return real_rename(src, dst)

        monkeypatch.setattr(store.os, "rename", rename)
    meta = ensure_partition(config.data, config.partition, 2, out)
    written = (out / schema.METADATA_FILE).read_bytes()
    assert written == (other / schema.METADATA_FILE).read_bytes()  # the winner's, untouched
    assert meta == schema.read_metadata(out)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no stage left
    store.load_part(out, 1)
