"""KaMinPar as a partition method: seeded, balanced, refused where it cannot do what is asked.

The partition invariants (features rebuild, halo aggregation equals full-graph
aggregation) run over every method in ``test_build.py``.
"""

from __future__ import annotations

import builtins
import math
import subprocess
import sys

import kaminpar  # installed by launch/setup.sh --test (the [test] extra)
import numpy as np
import pytest

from adaqp.config import ConfigError, load_config
from adaqp.data import SyntheticSpec, load_dataset
from adaqp.partitioning import cut as cut_module
from adaqp.partitioning import schema
from adaqp.partitioning.cut import (
    IMBALANCE,
    assign_parts,
    numbered_by_first_node,
    write_parhip,
)
from partition.__main__ import main as partition_main


@pytest.fixture(scope="module")
def graph():
    spec = SyntheticSpec(num_nodes=600, num_classes=4, avg_degree=8, feature_dim=12, seed=3)
    return load_dataset("synthetic", synthetic=spec)


def _kaminpar(graph, num_parts, **kwargs):
    return assign_parts(graph.indptr, graph.indices, num_parts, method="kaminpar", **kwargs)


def test_the_same_blocks_under_other_numbers_are_numbered_alike():
    """KaMinPar has returned the same blocks under swapped numbers for one seed; the
    blocks are numbered by their smallest node, so a part's rank does not move."""
    parts = np.array([1, 3, 0, 2, 3, 3, 0, 1])
    swapped = np.array([1, 2, 0, 3, 2, 2, 0, 1])  # blocks 2 and 3 swapped
    expected = np.array([0, 1, 2, 3, 1, 1, 2, 0])
    np.testing.assert_array_equal(numbered_by_first_node(parts, 4), expected)
    np.testing.assert_array_equal(numbered_by_first_node(swapped, 4), expected)
    # A label no node has is numbered last.
    np.testing.assert_array_equal(numbered_by_first_node(np.array([2, 0, 2]), 3), [0, 1, 0])


@pytest.mark.parametrize("num_parts", [2, 4, 8])
def test_same_seed_gives_the_same_parts_and_every_part_is_used(graph, num_parts):
    first = _kaminpar(graph, num_parts, seed=5, train_mask=graph.train_mask)
    assert first.dtype == np.int64 and first.shape == (graph.num_nodes,)
    np.testing.assert_array_equal(
        first, _kaminpar(graph, num_parts, seed=5, train_mask=graph.train_mask)
    )
    assert np.array_equal(np.unique(first), np.arange(num_parts))
    # Another seed is a real input: some seed among a few gives another assignment.
    others = [_kaminpar(graph, num_parts, seed=s, train_mask=graph.train_mask) for s in (6, 7, 8)]
    assert any(not np.array_equal(first, other) for other in others)


_COMPRESSED_CUT = """
import hashlib, sys
import adaqp.partitioning.cut as cut
from adaqp.data import SyntheticSpec, load_dataset
spec = SyntheticSpec(num_nodes=600, num_classes=4, avg_degree=8, feature_dim=12, seed=3)
g = load_dataset("synthetic", synthetic=spec)
cut.COMPRESS_EDGES = 0
parts = cut.assign_parts(g.indptr, g.indices, 4, method="kaminpar", seed=2, train_mask=g.train_mask)
print(hashlib.sha256(parts.tobytes()).hexdigest())
"""


def test_a_large_graph_is_held_compressed_and_cut_as_well(graph, monkeypatch, caplog):
    """From ``COMPRESS_EDGES`` on KaMinPar holds the graph compressed (here: every graph):
    a seed gives the same parts in a fresh process (as the tool cuts: once a process),
    balanced, cutting about as many edges."""

    def cut_edges(parts):
        src = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
        return int((parts[src] != parts[graph.indices]).sum())

    plain = _kaminpar(graph, 4, seed=2, train_mask=graph.train_mask)
    monkeypatch.setattr(cut_module, "COMPRESS_EDGES", 0)
    with caplog.at_level("INFO", logger="adaqp.partitioning.cut"):
        compressed = _kaminpar(graph, 4, seed=2, train_mask=graph.train_mask)
    assert "KaMinPar holds the graph compressed" in caplog.text
    runs = {
        subprocess.run(
            [sys.executable, "-c", _COMPRESSED_CUT], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    }
    assert len(runs) == 1, runs
    bound = math.ceil((1 + IMBALANCE) * math.ceil(graph.num_nodes / 4))
    assert np.bincount(compressed, minlength=4).max() <= bound + graph.train_mask.sum()
    assert cut_edges(compressed) <= 1.2 * cut_edges(plain)


def test_two_threads_give_a_valid_balanced_partition(graph):
    parts = _kaminpar(graph, 4, threads=2)
    counts = np.bincount(parts, minlength=4)
    assert counts.min() > 0 and counts.max() <= (1 + IMBALANCE) * graph.num_nodes / 4 + 1
    with pytest.raises(ValueError, match="threads"):
        _kaminpar(graph, 4, threads=0)


@pytest.mark.parametrize("num_parts", [2, 4, 8])
def test_nodes_are_balanced_within_the_imbalance(graph, num_parts):
    parts = _kaminpar(graph, num_parts)
    bound = math.ceil((1 + IMBALANCE) * math.ceil(graph.num_nodes / num_parts))
    assert np.bincount(parts, minlength=num_parts).max() <= bound


@pytest.mark.parametrize("num_parts", [2, 4])
def test_training_nodes_count_in_the_balance(graph, num_parts):
    mask = graph.train_mask
    extra = round(graph.num_nodes / int(mask.sum()))
    parts = _kaminpar(graph, num_parts, train_mask=mask)
    weight = np.bincount(parts, weights=1 + extra * mask, minlength=num_parts)
    total = graph.num_nodes + extra * int(mask.sum())
    assert weight.max() <= (1 + IMBALANCE) * math.ceil(total / num_parts) + extra
    per_part = np.bincount(parts[mask], minlength=num_parts)
    assert per_part.max() <= 1.35 * per_part.mean()
    # Training nodes that fill one part of the unweighted cut (a cluster of the graph)
    # all stay in that part without the weights; the weights spread them.
    unweighted = _kaminpar(graph, num_parts)
    cluster = unweighted == 0
    assert np.bincount(unweighted[cluster], minlength=num_parts).max() == cluster.sum()
    per_part = np.bincount(_kaminpar(graph, num_parts, train_mask=cluster)[cluster])
    assert per_part.max() <= 0.75 * cluster.sum()


def test_cuts_far_fewer_edges_than_random(graph):
    def cut_edges(parts):
        src = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
        return int((parts[src] != parts[graph.indices]).sum())

    random = assign_parts(graph.indptr, graph.indices, 4, method="random")
    assert cut_edges(_kaminpar(graph, 4)) < 0.7 * cut_edges(random)


@pytest.mark.parametrize("wide, wide_offsets", [(False, False), (True, False), (False, True)])
def test_parhip_file_holds_the_graph(graph, tmp_path, wide, wide_offsets):
    """Each width on its own: 64-bit offsets (a file over 4 GiB) beside 32-bit ids."""
    weights = 1 + 3 * graph.train_mask.astype(np.int64)
    path = tmp_path / "g.parhip"
    write_parhip(path, graph.indptr, graph.indices, weights, wide=wide, wide_offsets=wide_offsets)
    loaded = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP)
    assert (loaded.n(), loaded.m()) == (graph.num_nodes, graph.num_edges)
    assert loaded.is_node_weighted()
    for node in (0, 17, graph.num_nodes - 1):
        row = graph.indices[graph.indptr[node] : graph.indptr[node + 1]]
        assert sorted(v for v, _ in loaded.neighbors(node)) == sorted(row.tolist())
        assert loaded.node_weight(node) == weights[node]
    assert weights.min() != weights.max()  # the weight check can fail
    header = int(np.fromfile(path, dtype=np.uint64, count=1)[0])
    assert bool(header & 8) is not wide  # 32-bit ids unless asked for 64
    assert bool(header & 4) is not (wide or wide_offsets)
    assert bool(header & 16) is not wide


def test_volume_objective_is_refused_naming_the_key(graph):
    with pytest.raises(ConfigError, match="partition.objective"):
        load_config(None, ["partition.method=kaminpar", "partition.objective=volume"])
    with pytest.raises(ValueError, match="partition.objective"):
        _kaminpar(graph, 2, objective="volume")


def test_config_accepts_kaminpar_and_names_the_key_of_a_typo():
    assert load_config(None, ["partition.method=kaminpar"]).partition.method == "kaminpar"
    with pytest.raises(ConfigError, match=r"partition\.method.*kaminpar.*'kaminpa'"):
        load_config(None, ["partition.method=kaminpa"])


def test_command_line_makes_a_kaminpar_partition_and_rejects_a_typo(tmp_path, capsys):
    out = tmp_path / "cora2"
    args = ["--dataset", "cora", "--num-parts", "2", "--out", str(out)]
    assert partition_main([*args, "--method", "kaminpar"]) == 0
    assert "(kaminpar, objective cut)" in capsys.readouterr().out
    meta = schema.read_metadata(out)
    assert meta["params"]["method"] == "kaminpar"
    assert all(entry["num_inner"] > 0 for entry in meta["parts"])
    # A METIS run on the same directory is refused, not silently reused.
    assert partition_main(args) == 2
    assert "method" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        partition_main([*args, "--method", "kaminpa"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--method" in err and "'kaminpa'" in err and "kaminpar" in err


def test_missing_package_says_what_to_install(graph, tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_kaminpar(name, *args, **kwargs):
        if name == "kaminpar":
            raise ModuleNotFoundError("No module named 'kaminpar'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_kaminpar)
    with pytest.raises(ModuleNotFoundError, match=r"partition.method = kaminpar.*kaminpar"):
        _kaminpar(graph, 2)
    args = ["--dataset", "cora", "--num-parts", "2", "--out", str(tmp_path / "p")]
    assert partition_main([*args, "--method", "kaminpar"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: partition.method = kaminpar needs the kaminpar package")
    assert "pip install 'kaminpar>=3.7'" in err or ".venv" in err
