"""The graph's sizes the prediction reads without loading the graph: an OGB dataset in the
binary layout (ogbn-papers100M) from its raw files' headers and its split."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from adaqp.config import load_config
from adaqp.data import SyntheticSpec, generate_synthetic, load_dataset
from adaqp.data.ogb_fixture import write_ogb_fixture
from adaqp.memory.__main__ import main as memory_main
from adaqp.memory.shapes import graph_sizes, worker_shapes

NAME = "ogbn-papers100M"


@pytest.fixture
def binary_root(tmp_path: Path, monkeypatch) -> Path:
    """A binary-layout fixture of a small graph whose split leaves most nodes out."""
    monkeypatch.setitem(sys.modules, "outdated", None)  # no ogb version check
    spec = SyntheticSpec(num_nodes=400, num_classes=5, avg_degree=6.0, feature_dim=7, seed=1)
    write_ogb_fixture(generate_synthetic(spec, split_seed=0), tmp_path / "root", NAME)
    return tmp_path / "root"


def _config(root: Path, tmp_path: Path):
    overrides = [
        f"data.dataset={NAME}",
        f"data.root={root}",
        f"partition.dir={tmp_path / 'no-partition'}",
    ]
    return load_config("configs/ogbn-products-sage.toml", overrides)


def test_a_binary_dataset_is_sized_from_its_headers_and_split(binary_root, tmp_path) -> None:
    config = _config(binary_root, tmp_path)
    sizes = graph_sizes(config)
    graph = load_dataset(NAME, root=binary_root)
    raw = graph.info["num_raw_edges"]
    assert (sizes.num_nodes, sizes.feature_dim) == (graph.num_nodes, graph.feature_dim)
    assert sizes.num_classes == 172  # OGB's, which the loaded graph keeps too
    assert sizes.num_classes == graph.num_classes
    # Each undirected edge once as published; the symmetric graph has twice as many.
    assert sizes.num_edges == 2 * raw == graph.num_edges
    assert sizes.train_fraction == pytest.approx(graph.train_mask.sum() / graph.num_nodes)
    shape = worker_shapes(config, 2).workers[0]
    assert shape.num_train == pytest.approx(shape.num_inner * sizes.train_fraction, abs=1)


def test_the_prediction_sizes_a_binary_dataset_before_it_is_partitioned(
    binary_root, tmp_path, capsys
) -> None:
    where = [f"data.dataset={NAME}", f"data.root={binary_root}"]
    args = ["--config", "configs/ogbn-products-sage.toml", "--nproc", "2"]
    args += [x for kv in where + [f"partition.dir={tmp_path / 'none'}"] for x in ("--set", kv)]
    assert memory_main(args) == 0
    assert "from graph sizes (no partition" in capsys.readouterr().out
