"""OGB's binary layout downstream: float16 features stay float16 into the parts and become
float32 only in a worker's tensors; unlabelled nodes are never trained on or scored."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from adaqp.config import load_config
from adaqp.data import GraphData, SyntheticSpec, csr_from_edges, generate_synthetic, load_dataset
from adaqp.data.ogb_fixture import write_ogb_fixture
from adaqp.graph.local import LocalGraph
from adaqp.partitioning import schema, store
from adaqp.partitioning.build import make_partition
from partition.__main__ import main as partition_main
from tests.distributed import run_workers
from tests.run.exactness import rank_trainer

NAME = "ogbn-papers100M"
SPEC = SyntheticSpec(num_nodes=400, num_classes=4, avg_degree=6.0, feature_dim=6, seed=1)
PARTS = 2


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A binary-layout fixture: float16 features, labels only on the split's nodes."""
    root = tmp_path_factory.mktemp("ogb")
    write_ogb_fixture(generate_synthetic(SPEC), root, NAME)
    return root


def _overrides(root: Path, part_dir: Path) -> list[str]:
    return [
        f"data.dataset={NAME}",
        f"data.root={root}",
        "model.name=sage",
        "model.layers=2",
        "model.hidden=8",
        "model.dropout=0",
        f"partition.dir={part_dir}",
    ]


@pytest.fixture(scope="module")
def part_dir(root: Path, tmp_path_factory) -> Path:
    """The fixture cut by ``python -m partition`` (the lean path: features spilled)."""
    out = tmp_path_factory.mktemp("parts") / "p"
    args = ["--dataset", NAME, "--set", f"data.root={root}", "--num-parts", str(PARTS)]
    assert partition_main([*args, "--out", str(out)]) == 0
    return out


def test_float16_features_reach_the_parts(root: Path, part_dir: Path, tmp_path: Path) -> None:
    graph = load_dataset(NAME, root=root)
    assert graph.features.dtype == np.float16
    meta = schema.read_metadata(part_dir)
    assert meta["dataset"]["feature_dtype"] == "float16"
    # In memory too (the source's own arrays, no spill), for callers that keep the graph.
    in_memory = make_partition(graph, tmp_path / "kept", num_parts=PARTS, spec={"name": NAME})
    assert in_memory["dataset"]["feature_dtype"] == "float16"
    for directory in (part_dir, tmp_path / "kept"):
        for rank in range(PARTS):
            with np.load(directory / schema.part_file(rank), allow_pickle=False) as z:
                on_disk = z["features"]
            part = store.load_part(directory, rank)
            assert on_disk.dtype == np.float16 and part.features.dtype == np.float16
            assert np.array_equal(part.features, graph.features[part.global_ids])
            local = LocalGraph.from_part(part)
            assert local.features.dtype == torch.float32
            expected = graph.features[local.global_ids].astype(np.float32)
            assert np.array_equal(local.features.numpy(), expected)


def _whole_in_memory(root: Path) -> GraphData:
    """The fixture read the plain way, every array whole in memory: ``np.load`` of the
    archives, the symmetric CSR made at once, the split read by pandas; the reference the
    streamed path (edges read twice in blocks, features mapped, then spilled) must equal."""
    folder = root / "ogbn_papers100M"
    with np.load(folder / "raw" / "data.npz", allow_pickle=False) as data:
        src, dst = data["edge_index"]
        features = np.array(data["node_feat"])
        n = int(data["num_nodes_list"][0])
    with np.load(folder / "raw" / "node-label.npz", allow_pickle=False) as data:
        values = data["node_label"].reshape(-1)
    labels = np.where(np.isnan(values), -1, values).astype(np.int64)
    indptr, indices = csr_from_edges(src, dst, n, symmetrize=True)
    masks = []
    for split in ("train", "valid", "test"):
        ids = pd.read_csv(folder / "split" / "time" / f"{split}.csv.gz", header=None)[0]
        mask = np.zeros(n, dtype=bool)
        mask[ids.to_numpy()] = True
        masks.append(mask)
    return GraphData(NAME, indptr, indices, features, labels, *masks, 172)


def test_the_streamed_path_writes_the_parts_the_whole_graph_in_memory_writes(
    root: Path, part_dir: Path, tmp_path: Path
) -> None:
    """``python -m partition`` on the binary layout (streamed: the CSR built from blocks
    of the edge list, the features mapped and spilled, one part resident at a time) writes
    every part bit for bit as the all-in-memory graph does."""
    reference = make_partition(
        _whole_in_memory(root), tmp_path / "whole", num_parts=PARTS, spec={"name": NAME}
    )
    streamed = schema.read_metadata(part_dir)
    assert streamed["stats"] == reference["stats"]
    for rank in range(PARTS):
        with (
            np.load(part_dir / schema.part_file(rank), allow_pickle=False) as a,
            np.load(tmp_path / "whole" / schema.part_file(rank), allow_pickle=False) as b,
        ):
            assert sorted(a.files) == sorted(b.files)
            for key in a.files:
                assert a[key].dtype == b[key].dtype, key
                assert np.array_equal(a[key], b[key]), key


def test_parts_never_select_an_unlabelled_node(root: Path, part_dir: Path) -> None:
    meta = schema.read_metadata(part_dir)
    unlabelled = 0
    for rank in range(PARTS):
        part = store.load_part(part_dir, rank, meta)
        unlabelled += int((part.labels < 0).sum())
        for mask in (part.train_mask, part.val_mask, part.test_mask):
            assert (part.labels[mask] >= 0).all()
    assert unlabelled > 0  # most nodes: the fixture labels only its split's
    # A part whose mask selects one is refused when it is loaded.
    part = store.load_part(part_dir, 0, meta)
    arrays = dict(part.arrays)
    arrays["val_mask"] = arrays["val_mask"] | (arrays["labels"] < 0)
    arrays["train_mask"] = arrays["train_mask"] & ~arrays["val_mask"]
    meta["parts"][0]["num_train"] = int(arrays["train_mask"].sum())
    with pytest.raises(schema.PartitionError, match="val_mask selects an unlabelled node"):
        schema.check_part_arrays(arrays, part_dir / schema.part_file(0), meta, 0)


def _train_and_score(rank: int, world_size: int, init_method: str, part_dir: str, overrides):
    sys.modules["outdated"] = None  # the trainer imports OGB's Evaluator: no version check
    config = load_config(None, list(overrides))
    with rank_trainer(config, init_method, rank, world_size, part_dir) as (trainer, graph):
        with torch.no_grad():
            before = trainer.logits()  # what the step's loss sees (no dropout)
        loss = trainer.train_step(epoch=1)
        scores = trainer.evaluate()
        with torch.no_grad():
            after = trainer.logits()  # what evaluate scored
        return {
            "loss": np.array(loss),
            "num_train": np.array(trainer.num_train),
            "scores": np.array([scores[k] for k in ("train_acc", "val_acc", "test_acc")]),
            "before": before.numpy(),
            "after": after.numpy(),
            "global_ids": graph.global_ids,
        }


def _gather(results: list[dict], key: str, shape: tuple[int, int]) -> np.ndarray:
    """The whole graph's rows of ``key`` from the ranks' rows (by global id)."""
    out = np.full(shape, np.nan, dtype=np.float32)
    for r in results:
        out[r["global_ids"]] = r[key]
    return out


@pytest.mark.distributed
def test_unlabelled_nodes_are_never_trained_or_scored(root: Path, part_dir: Path, tmp_path):
    results = run_workers(
        _train_and_score, PARTS, tmp_path, str(part_dir), _overrides(root, part_dir)
    )
    graph = load_dataset(NAME, root=root)
    unlabelled = graph.labels < 0
    assert unlabelled.sum() > graph.num_nodes // 2  # as in papers100M: most nodes
    shape = (graph.num_nodes, graph.num_classes)
    # The loss is the mean over the labelled training nodes, counted and summed over ranks.
    train = graph.train_mask
    assert not (train & unlabelled).any()
    assert all(int(r["num_train"]) == int(train.sum()) for r in results)
    before = torch.from_numpy(_gather(results, "before", shape))
    expected_loss = F.cross_entropy(before[train], torch.from_numpy(graph.labels[train]))
    for r in results:
        np.testing.assert_allclose(float(r["loss"]), float(expected_loss), rtol=1e-5)
    # Accuracy is scored on the split's labelled nodes, and only those.
    after = _gather(results, "after", shape)
    expected = [
        float((after[mask].argmax(1) == graph.labels[mask]).mean())
        for mask in (graph.train_mask, graph.val_mask, graph.test_mask)
    ]
    for r in results:
        np.testing.assert_allclose(r["scores"], expected, rtol=1e-6)
    # The comparison can fail: scored over every node, labels -1 included, it differs.
    assert not np.isclose(float((after.argmax(1) == graph.labels).mean()), expected[0])
