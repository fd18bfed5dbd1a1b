"""The rows each layer of a training step computes and exchanges, predicted before launch
(``adaqp/memory/layer_rows.py``), against what the trainer works out collectively at
start-up: in process, every rank's ``rings`` and ``layer_rows`` driven in lockstep with a
flag exchange between threads (tests/graph/test_loss_rows.py's), on METIS cuts of Cora
into 1, 2 and 4 parts under three splits (its own 140 training nodes, three training
nodes, its own with none on the last part); and once from real gloo workers' trainers.
Then every row (``compute_rows = "all"``) and the model used without a partition."""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

import numpy as np
import pytest

from adaqp.data import load_dataset
from adaqp.graph.local import LocalGraph
from adaqp.graph.loss_rows import layer_rows, order_by_ring, rings
from adaqp.memory.layer_rows import (
    LayerCounts,
    modelled_layer_counts,
    partition_layer_counts,
)
from adaqp.partitioning.build import make_partition
from adaqp.partitioning.schema import read_metadata
from adaqp.partitioning.store import load_part
from tests.distributed import run_workers
from tests.graph.test_loss_rows import _collectively
from tests.run.exactness import exact_config, rank_trainer
from tests.run.test_exact_loss_rows import _split

SPLITS = ("public", "few", "nonepart")
"""Cora's own split; 3 training nodes (some parts hold none); its own with the last
part's training nodes cleared (that part computes only what its peers read)."""
WORLD_SIZES = (1, 2, 4)
MODEL_FACTOR = 2.5
"""The model's halo and sent rows, summed over the workers, against the partition's, in
either direction (0.81 to 2.3 measured on Cora's split at P = 2 and 4; its inner rows
1.0 to 1.2)."""


@pytest.fixture(scope="module")
def cora():
    return load_dataset("cora")


@pytest.fixture(scope="module")
def partitions(cora, tmp_path_factory) -> dict[tuple[str, int], Path]:
    """``{(split, P): dir}``. METIS does not balance training nodes here, so clearing the
    last part's leaves the cut as it was (checked)."""
    root = tmp_path_factory.mktemp("layer-rows")
    spec = exact_config("gcn", "unused").data.spec()
    dirs = {}
    for split in SPLITS:
        graph = _split(cora, 3 / cora.num_nodes, seed=0) if split == "few" else cora
        for world_size in WORLD_SIZES:
            out = root / f"{split}-p{world_size}"
            make_partition(graph, out, num_parts=world_size, spec=spec, balance_train=False)
            if split == "nonepart" and world_size > 1:
                last = load_part(out, world_size - 1, read_metadata(out))
                train = graph.train_mask.copy()
                train[last.global_ids] = False
                cleared = dataclasses.replace(graph, train_mask=train)
                make_partition(cleared, out, num_parts=world_size, spec=spec, balance_train=False)
                again = load_part(out, world_size - 1, read_metadata(out))
                assert not again.train_mask.any()
            dirs[(split, world_size)] = out
    return dirs


def _counts(rows, cached: bool) -> list[tuple[int, int, int, int]]:
    """A rank's ``LayerRows`` as (out, in, halo, sent) counts of its training exchanges:
    a cached layer 0's moves nothing (its ``LayerRows`` names the whole halo)."""
    out = []
    for layer, r in enumerate(rows):
        if layer == 0 and cached:
            assert r.send_keep is None and r.halo_keep is None
            out.append((r.num_out, r.num_in, 0, 0))
        else:
            out.append((r.num_out, r.num_in, r.num_halo, len(r.send_keep)))
    return out


def _trainer_counts(part_dir: Path, num_layers: int) -> dict[bool, list[list[tuple]]]:
    """``{cached: [rank][layer] counts}`` as the trainer works them out, every rank at once."""
    meta = read_metadata(part_dir)
    world_size = meta["params"]["num_parts"]
    graphs = [LocalGraph.from_part(load_part(part_dir, r, meta)) for r in range(world_size)]

    def work(graph, exchange):
        ring = rings(graph, num_layers, exchange)
        order = order_by_ring(graph, ring)
        graph.reorder(order)
        # The trainer caches the layer-0 halo only with peers to fetch it from.
        return {
            cached: _counts(
                layer_rows(graph, ring[order], num_layers, cached and world_size > 1, exchange),
                cached and world_size > 1,
            )
            for cached in (False, True)
        }

    per_rank = _collectively(graphs, work)
    return {cached: [rows[cached] for rows in per_rank] for cached in (False, True)}


def _as_tuples(counts: list[list[LayerCounts]]) -> list[list[tuple]]:
    return [[dataclasses.astuple(c) for c in layers] for layers in counts]


@pytest.mark.parametrize("num_layers", [2, 3])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("split", SPLITS)
def test_partition_counts_are_the_trainers(partitions, split, world_size, num_layers):
    part_dir = partitions[(split, world_size)]
    truth = _trainer_counts(part_dir, num_layers)
    for cached in (False, True):
        predicted = _as_tuples(partition_layer_counts(part_dir, num_layers, cached, "loss"))
        assert predicted == truth[cached], f"cached={cached}"
    meta = read_metadata(part_dir)
    if world_size == 1:
        assert all(c[2] == c[3] == 0 for c in predicted[0]), "one part: no halo, nothing sent"
    # Not vacuous: the loss rows are fewer than the part's, and their exchanges smaller.
    whole = [(e["num_inner"], e["num_halo"], e["num_send"]) for e in meta["parts"]]
    last = [layers[-1] for layers in predicted]
    assert sum(c[0] for c in last) == sum(e["num_train"] for e in meta["parts"])
    assert sum(c[0] for c in last) < sum(w[0] for w in whole)
    if split == "nonepart" and world_size > 1:
        assert predicted[-1][-1][0] == 0 and predicted[-1][0][0] > 0, "its peers read it"


def test_compressed_part_files_give_the_same_counts(partitions, tmp_path):
    """Part files are memory-mapped where stored uncompressed (as written); a compressed
    one is read instead, to the same counts."""
    source = partitions[("public", 2)]
    target = tmp_path / "compressed"
    target.mkdir()
    (target / "metadata.json").write_bytes((source / "metadata.json").read_bytes())
    for entry in read_metadata(source)["parts"]:
        with np.load(source / entry["file"]) as data:
            np.savez_compressed(target / entry["file"], **{k: data[k] for k in data.files})
        with zipfile.ZipFile(target / entry["file"]) as archive:
            assert archive.getinfo("indices.npy").compress_type == zipfile.ZIP_DEFLATED
    for cached in (False, True):
        assert partition_layer_counts(target, 3, cached, "loss") == partition_layer_counts(
            source, 3, cached, "loss"
        )


@pytest.mark.parametrize("block", [1, 7, 1000])
def test_a_part_read_a_block_of_rows_at_a_time_gives_the_same_counts(
    partitions, monkeypatch, block
):
    """As a part with more edges than a block is read (a row above the block alone)."""
    part_dir = partitions[("public", 4)]
    whole = partition_layer_counts(part_dir, 3, False, "loss")
    monkeypatch.setattr("adaqp.memory.layer_rows._EDGE_BLOCK", block)
    assert partition_layer_counts(part_dir, 3, False, "loss") == whole


def _real_worker(rank: int, world_size: int, init_method: str, part_dir: str):
    """Each case's counts ``[L, 4]`` and ``rows_by_layer`` from this rank's real trainer."""
    result = {}
    for num_layers in (2, 3):
        for cached in (False, True):
            name = f"l{num_layers}-c{int(cached)}"
            overrides = (f"comm.cache_input_halo={str(cached).lower()}", "train.compute_rows=loss")
            config = exact_config("gcn", part_dir, overrides, layers=num_layers)
            with rank_trainer(config, f"{init_method}-{name}", rank, world_size, part_dir) as (
                trainer,
                _,
            ):
                rows = [p.rows for p in trainer.train_propagation.propagations]
                counts = np.array(_counts(rows, cached))
                selected = trainer.transport.selections
                for layer in range(num_layers):
                    if layer == 0 and cached:
                        assert layer not in selected
                    else:
                        assert len(selected[layer].halo_keep) == counts[layer, 2]
                        assert len(selected[layer].send_keep) == counts[layer, 3]
                result[name] = counts
                result[f"{name}-rows"] = np.array(trainer.rows_by_layer)
    return result


@pytest.mark.distributed
@pytest.mark.slow
def test_partition_counts_are_a_real_runs(partitions, tmp_path):
    """Two gloo workers build their trainers on Cora's split: each rank's rows and
    exchanges, and the rows a run's summary adds up (``rows_by_layer``)."""
    part_dir = partitions[("public", 2)]
    results = run_workers(_real_worker, 2, tmp_path, str(part_dir))
    for num_layers in (2, 3):
        for cached in (False, True):
            name = f"l{num_layers}-c{int(cached)}"
            predicted = _as_tuples(partition_layer_counts(part_dir, num_layers, cached, "loss"))
            for rank, result in enumerate(results):
                assert [tuple(c) for c in result[name].tolist()] == predicted[rank], name
            summed = sum(result[f"{name}-rows"] for result in results)
            assert summed.tolist() == [
                sum(p[layer][0] for p in predicted) for layer in range(num_layers)
            ]


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_row_is_the_partitions(partitions, world_size):
    part_dir = partitions[("public", world_size)]
    meta = read_metadata(part_dir)
    for cached in (False, True):
        counts = partition_layer_counts(part_dir, 3, cached, "all")
        for entry, layers in zip(meta["parts"], counts, strict=True):
            inner, halo, send = entry["num_inner"], entry["num_halo"], entry["num_send"]
            assert layers[1:] == [LayerCounts(inner, inner, halo, send)] * 2
            assert layers[0] == LayerCounts(
                inner, inner, 0 if cached else halo, 0 if cached else send
            )


def test_bad_arguments_are_refused(partitions):
    with pytest.raises(ValueError, match="compute_rows"):
        partition_layer_counts(partitions[("public", 2)], 2, False, "some")
    with pytest.raises(ValueError, match="num_layers"):
        modelled_layer_counts(10, 1, 1, 1, 2.0, 0, False, "loss")


def _modelled(meta, num_layers: int, cached: bool, compute_rows: str = "loss"):
    degree = meta["dataset"]["num_edges"] / meta["dataset"]["num_nodes"]
    return [
        modelled_layer_counts(
            num_inner=e["num_inner"],
            num_halo=e["num_halo"],
            num_send=e["num_send"],
            num_train=e["num_train"],
            avg_degree=degree,
            num_layers=num_layers,
            cached_input=cached,
            compute_rows=compute_rows,
        )
        for e in meta["parts"]
    ]


def _ratios(model, real, field: str) -> list[float]:
    """Per layer: the model's ``field`` summed over the workers over the partition's."""
    num_layers = len(real[0])
    return [
        sum(getattr(w[layer], field) for w in model) / sum(getattr(w[layer], field) for w in real)
        for layer in range(num_layers)
    ]


@pytest.mark.parametrize("num_layers", [2, 3])
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_model_is_monotone_capped_and_near_the_partition(partitions, world_size, num_layers):
    part_dir = partitions[("public", world_size)]
    meta = read_metadata(part_dir)
    real = partition_layer_counts(part_dir, num_layers, False, "loss")
    model = _modelled(meta, num_layers, False)
    for entry, layers in zip(meta["parts"], model, strict=True):
        assert layers[-1].num_out == entry["num_train"]
        assert layers[0].num_in == entry["num_inner"]
        for below, above in zip(layers, layers[1:], strict=False):
            assert above.num_in == below.num_out
            assert above.num_out <= below.num_out
            assert above.num_halo <= below.num_halo and above.num_send <= below.num_send
        for c in layers:
            assert c.num_out <= entry["num_inner"]
            assert c.num_halo <= entry["num_halo"] and c.num_send <= entry["num_send"]
    # A layer reads more rows with more layers after it.
    deeper = _modelled(meta, num_layers + 1, False)
    for shallow, deep in zip(model, deeper, strict=True):
        assert deep[0].num_out >= shallow[0].num_out
        exchanged = [(c.num_out, c.num_halo, c.num_send) for c in shallow]
        assert [(c.num_out, c.num_halo, c.num_send) for c in deep[1:]] == exchanged
    for field in ("num_out", "num_halo", "num_send"):
        ratios = _ratios(model, real, field)
        assert all(1 / MODEL_FACTOR <= r <= MODEL_FACTOR for r in ratios), (field, ratios)
    # The comparison can fail: every row is far from the loss rows' last layer.
    every = _modelled(meta, num_layers, False, "all")
    assert _ratios(every, real, "num_out")[-1] > MODEL_FACTOR
    assert _ratios(every, real, "num_halo")[-1] > MODEL_FACTOR
    # Cached, layer 0 moves nothing; the rest is as uncached.
    cached = _modelled(meta, num_layers, True)
    for plain, layers in zip(model, cached, strict=True):
        assert layers[0].num_halo == layers[0].num_send == 0
        assert layers[1:] == plain[1:] and layers[0].num_out == plain[0].num_out
