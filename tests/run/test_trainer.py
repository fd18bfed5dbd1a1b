"""Vanilla mode is exact: P workers compute what one process computes on the whole graph,
dropout on.

The reference below builds the normalised adjacency of the *whole* graph directly from
the dataset with SciPy, never touching partitions, local ids or the exchanger; it shares
only the model definition and the initial weights with the distributed run, and the keyed
dropout masks, which it draws for the whole graph (node i's global id is i). GAT's
reference is the dense one of ``tests/model/gat_reference.py``, which shares only the
parameters and the mask function (``adaqp.quant.draws.keep_mask``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from adaqp.config import load_config
from adaqp.data import load_dataset
from adaqp.model.gnn import GNN
from adaqp.partitioning.build import make_partition
from adaqp.quant import kernels as quant_kernels
from tests.distributed import QUANTIZED, run_workers
from tests.model.gat_reference import dense_gat, edge_mask
from tests.run.exactness import (
    close,
    close_weights,
    exact_config,
    flat_params,
    full_adjacency,
    rank_trainer,
    set_flat,
)

EPOCHS = 5
MODELS = ("gcn", "sage", "gat")


WEIGHTS_RTOL = {"gcn": 1e-4, "sage": 1e-4, "gat": 1e-3}
"""Weights after several Adam steps, compared in relative L2 norm. Adam divides each
element's step by the size of its own gradient, so an element whose gradient is near
rounding level moves by up to ``lr`` per step either way on another CPU's rounding
(the stale runs, six Adam steps, have their own bound, with its figures, in
tests/exchange/test_stale_reference.py). GAT's attention vectors have more such
components (a destination's own term cancels in its softmax wherever all its scores
share a sign); logits, gradients and losses are compared element-wise to 1e-5."""


def _sum_gradients(model: torch.nn.Module) -> None:
    """Sums the gradients accumulated outside ``train_step`` over the ranks."""
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def _worker(
    rank: int, world_size: int, init_method: str, part_dir: str, extra: tuple[str, ...] = ()
):
    result = {}
    for model in MODELS:
        config = exact_config(model, part_dir, extra, dropout=True)
        with rank_trainer(config, init_method + model, rank, world_size, part_dir) as (
            trainer,
            graph,
        ):
            result[f"{model}/initial"] = flat_params(trainer.model)
            trainer.model.train()
            logits = trainer.logits(epoch=1)
            (trainer.local_loss_sum(logits) / trainer.num_train).backward()
            _sum_gradients(trainer.model)
            result[f"{model}/logits"] = logits.detach().numpy()
            # Under train.compute_rows = "loss" the first rows only, the training ones among them.
            result[f"{model}/global_ids"] = graph.global_ids[: logits.shape[0]]
            result[f"{model}/grads"] = torch.cat(
                [p.grad.reshape(-1) for p in trainer.model.parameters()]
            ).numpy()
            trainer.optimizer.step()
            losses = [trainer.train_step(epoch=epoch) for epoch in range(2, EPOCHS + 1)]
            result[f"{model}/losses"] = np.array(losses)
            result[f"{model}/weights"] = flat_params(trainer.model)
    return result


def _whole_graph_propagate(adj: torch.Tensor):
    def propagate(h, layer, finish=lambda agg, rows: agg, transform=None):
        agg = adj @ h
        return finish(agg if transform is None else transform(agg), slice(0, adj.shape[0]))

    return propagate


_REFERENCES: dict[tuple[str, str, bytes], dict] = {}


def _reference(graph, model_name: str, initial: np.ndarray):
    """Single-process training from ``initial`` (computed once per graph, model and
    initial weights: the exactness tests of every P and variant start from the same)."""
    key = (graph.name, model_name, np.ascontiguousarray(initial).tobytes())
    if key not in _REFERENCES:
        _REFERENCES[key] = _train_reference(graph, model_name, initial)
    return _REFERENCES[key]


def _train_reference(graph, model_name: str, initial: np.ndarray):
    config = exact_config(model_name, "unused", dropout=True)
    torch.manual_seed(0)
    model = GNN(config.model, graph.feature_dim, graph.num_classes)
    set_flat(model, initial)
    x = torch.from_numpy(graph.features)
    if model_name == "gat":
        edges = edge_mask(graph.indptr, graph.indices, graph.num_nodes)

        def forward(epoch):
            return dense_gat(model, x, edges, epoch)
    else:
        propagate = _whole_graph_propagate(full_adjacency(graph, model.norm))

        def forward(epoch):
            return model(x, propagate, epoch)  # rows keyed by their index: the global id

    y = torch.from_numpy(graph.labels).long()
    mask = torch.from_numpy(graph.train_mask)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay
    )
    out = {}
    losses = []
    for epoch in range(1, EPOCHS + 1):
        optimizer.zero_grad()
        logits = forward(epoch)
        loss = F.cross_entropy(logits[mask], y[mask])
        loss.backward()
        if epoch == 1:
            out["logits"] = logits.detach()
            out["grads"] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        else:
            losses.append(loss.item())
        optimizer.step()
    out["losses"] = torch.tensor(losses)
    out["weights"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return out


@pytest.fixture(scope="module")
def cora():
    return load_dataset("cora")


EXACT_VARIANTS = {
    "vanilla": ("comm.mode=vanilla",),
    "vanilla-no-savings": (
        "comm.mode=vanilla",
        "comm.cache_input_halo=false",
        "comm.transform_first=false",
    ),
    "vanilla-all-rows": ("comm.mode=vanilla", "train.compute_rows=all"),
    # Overlap forced on: "auto" turns it off where the ranks outnumber the cores.
    "adaqp-p": ("comm.mode=adaqp-p", "comm.overlap=on"),
    "adaqp-p-no-savings": (
        "comm.mode=adaqp-p",
        "comm.overlap=on",
        "comm.cache_input_halo=false",
        "comm.transform_first=false",
    ),
    "adaqp-p-all-rows": ("comm.mode=adaqp-p", "comm.overlap=on", "train.compute_rows=all"),
}


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("world_size", "variant"),
    [
        (1, "vanilla"),
        (2, "vanilla"),
        (4, "vanilla"),
        (2, "vanilla-no-savings"),
        (1, "adaqp-p"),
        (2, "adaqp-p"),
        (4, "adaqp-p"),
        (4, "adaqp-p-no-savings"),
        (1, "vanilla-all-rows"),
        (4, "vanilla-all-rows"),
        (2, "adaqp-p-all-rows"),
    ],
)
def test_exact_modes_match_single_process(world_size, variant, cora, tmp_path):
    """Vanilla and overlap-only training equal whole-graph training, dropout on (0.5, GAT's
    attention 0.6), with and without the exact savings (layer-0 halo cache, whose halo rows
    are dropped as their owners drop them, and transform-first), computing only the rows
    the loss reads (the default) or every row."""
    part_dir = tmp_path / "parts"
    spec = exact_config("gcn", str(part_dir)).data.spec()
    make_partition(cora, part_dir, num_parts=world_size, spec=spec)
    results = run_workers(_worker, world_size, tmp_path, str(part_dir), EXACT_VARIANTS[variant])

    for model in MODELS:
        initial = results[0][f"{model}/initial"]
        for r in results[1:]:
            np.testing.assert_array_equal(r[f"{model}/initial"], initial)
        ref = _reference(cora, model, initial)
        logits = np.zeros((cora.num_nodes, cora.num_classes), dtype=np.float32)
        seen = np.zeros(cora.num_nodes, dtype=bool)
        for r in results:
            logits[r[f"{model}/global_ids"]] = r[f"{model}/logits"]
            seen[r[f"{model}/global_ids"]] = True
        expected = ref["logits"].numpy().copy()
        if "all-rows" in variant:
            assert seen.all(), "every node is inner on exactly one rank"
        else:
            # The rows the loss reads: the training rows, and not every row.
            np.testing.assert_array_equal(np.flatnonzero(seen), np.flatnonzero(cora.train_mask))
            expected[~seen] = 0.0
        close(logits, torch.from_numpy(expected), 1e-5, f"{model} logits, P={world_size}")
        for r in results:
            close(r[f"{model}/grads"], ref["grads"], 1e-5, f"{model} grads, P={world_size}")
            close(r[f"{model}/losses"], ref["losses"], 1e-5, f"{model} losses")
            close_weights(
                r[f"{model}/weights"], ref["weights"], WEIGHTS_RTOL[model], f"{model} weights"
            )
        # The comparison must be able to fail: training moved the weights a lot.
        assert np.abs(results[0][f"{model}/weights"] - initial).max() > 1e-3


CORA_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cora-gcn.toml"


def _run_worker(rank: int, world_size: int, init_method: str, runs: dict[str, tuple[str, ...]]):
    """Each of ``runs`` in turn (one spawn of the workers for all of them)."""
    from adaqp.run.job import run

    result = {}
    for name, overrides in runs.items():
        config = load_config(CORA_CONFIG, list(overrides))
        summary = run(config, f"{init_method}-{name}", rank, world_size)
        result[f"{name}/test_acc"] = np.array(summary.test_acc)
        result[f"{name}/bytes"] = np.array(summary.halo_bytes_per_epoch)
        result[f"{name}/avg_bits"] = np.array(summary.avg_bits)
        result[f"{name}/max_staleness"] = np.array(summary.max_staleness)
        result[f"{name}/best_epoch"] = np.array(summary.best_epoch)
        result[f"{name}/final_test_acc"] = np.array(summary.final_test_acc)
    return result


@pytest.mark.distributed
@pytest.mark.slow
def test_adaqp_and_onebit_on_cora_train_close_to_vanilla(tmp_path):
    """Same seed and split, 4 workers, the Cora GCN config (row-normalised features):
    adaqp (under the shared cost model, which quantizes whatever the network) within one
    point of Vanilla's test accuracy, one-bit bounded staleness (S = 1) within two, both at
    the best validation epoch and at the last. 100 epochs; every mode's best validation
    epoch comes after the first solve (``quant.first_cycle``), so both comparisons see
    quantized training (launch/train.sh, 200 epochs: best epoch 39 for vanilla and adaqp)."""
    runs = {
        mode: (
            f"comm.mode={mode}",
            "train.epochs=100",
            *QUANTIZED,
            f"partition.dir={tmp_path / 'parts'}",
            f"metrics.out={tmp_path / mode}",
        )
        for mode in ("vanilla", "adaqp", "onebit")
    }
    rank0 = run_workers(_run_worker, 4, tmp_path, runs, timeout=600)[0]
    results = {
        mode: {k.split("/")[1]: v for k, v in rank0.items() if k.startswith(mode + "/")}
        for mode in runs
    }
    first_solve = load_config(CORA_CONFIG, list(QUANTIZED)).quant.first_cycle
    for mode, result in results.items():
        assert int(result["best_epoch"]) > first_solve + 5, (mode, result["best_epoch"])
    vanilla, adaqp = results["vanilla"], results["adaqp"]
    assert float(vanilla["test_acc"]) >= 0.77
    for field in ("test_acc", "final_test_acc"):
        assert abs(float(adaqp[field]) - float(vanilla[field])) <= 0.01, field
    assert float(adaqp["avg_bits"]) < 8  # the quantized run really was quantized
    assert int(adaqp["bytes"]) < int(vanilla["bytes"]) / 2
    onebit = results["onebit"]
    for field in ("test_acc", "final_test_acc"):
        assert abs(float(onebit[field]) - float(vanilla[field])) <= 0.02, field
    assert float(onebit["avg_bits"]) == 1.0
    assert int(onebit["max_staleness"]) <= 1  # the default bound S = 1 held


def _compile_notice(rank: int, world_size: int, init_method: str, part_dir: str):
    """How often this rank said it compiles the kernels (and compiled them ahead) with a
    cold cache, then with numba's cache as it is (warm: the forkserver loaded them)."""
    import logging

    import adaqp.run.trainer as trainer_module

    said = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage().startswith("compiling"))
    logger = logging.getLogger("adaqp.run.trainer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    config = exact_config("gcn", part_dir, ("model.dropout=0.5",))
    counts, warmed = [], []
    trainer_module.warm_up = lambda: warmed.append(True)
    for cold in (True, False):
        trainer_module.compile_pending = (lambda: True) if cold else quant_kernels.compile_pending
        said.clear()
        warmed.clear()
        with rank_trainer(config, f"{init_method}{cold}", rank, world_size, part_dir):
            counts.append((sum(said), len(warmed)))
    return {"counts": np.array(counts)}


@pytest.mark.distributed
def test_rank_0_says_once_that_the_kernels_compile_on_a_cold_cache(cora, tmp_path):
    """A first run used to sit silent for a minute after "writing to ..." while numba
    compiled; with numba's cache warm nothing is said."""
    part_dir = tmp_path / "parts"
    make_partition(cora, part_dir, num_parts=2, spec=exact_config("gcn", str(part_dir)).data.spec())
    results = run_workers(_compile_notice, 2, tmp_path, str(part_dir))
    assert results[0]["counts"].tolist() == [[1, 1], [0, 0]]
    assert results[1]["counts"].tolist() == [[0, 0], [0, 0]]


def _one_rank_fails(rank: int, world_size: int, init_method: str, parts: str):
    from adaqp.run import trainer as trainer_module
    from adaqp.run.job import run

    real_step = trainer_module.Trainer.train_step

    def train_step(self, counters, epoch):
        if rank == 1 and epoch == 2:
            raise ValueError("cannot quantize: input contains NaN or Inf (checked in float32)")
        return real_step(self, counters, epoch)

    trainer_module.Trainer.train_step = train_step
    config = load_config(
        CORA_CONFIG,
        [
            "train.epochs=3",
            f"partition.dir={parts}",
            "comm.timeout_s=60",
            f"metrics.out={parts}-out",
        ],
    )
    try:
        run(config, init_method, rank, world_size)
    except Exception as exc:  # noqa: BLE001 - the test reads which error each rank met
        return {"error": np.array(f"{type(exc).__name__}: {exc}")}
    return {"error": np.array("")}


@pytest.mark.distributed
def test_a_value_error_on_one_rank_is_reported_as_that_ranks(tmp_path):
    """A bad value one rank meets mid-training (the quantizer's NaN check) is that rank's
    failure, named with its rank and epoch, not an error every rank shares."""
    errors = [
        str(r["error"]) for r in run_workers(_one_rank_fails, 2, tmp_path, str(tmp_path / "p"))
    ]
    assert errors[1].startswith("TrainingError: rank 1: training step failed at epoch 2"), errors
    assert "NaN" in errors[1], errors
    assert not errors[0].startswith("TrainingError: rank 1"), errors


def _wall_times(rank: int, world_size: int, init_method: str, part_dir: str):
    """Each epoch's record, with a bit-width re-solve that takes 0.2 s after every epoch."""
    import time
    from types import SimpleNamespace

    config = exact_config("gcn", part_dir, ("comm.mode=adaqp", *QUANTIZED, "train.epochs=3"))
    records = []
    with rank_trainer(config, init_method, rank, world_size, part_dir) as (trainer, _):
        solve = trainer.policy.end_epoch

        def slow_solve(*args, **kwargs) -> float:
            solve(*args, **kwargs)
            time.sleep(0.2)
            return 0.2

        trainer.policy.end_epoch = slow_solve
        trainer.fit(SimpleNamespace(log_epoch=records.append))
    return {
        "wall": np.array([r.wall_time_s for r in records]),
        "spent": np.cumsum([r.epoch_time_s + r.solver_time_s for r in records]),
    }


@pytest.mark.distributed
def test_an_epochs_wall_time_includes_the_re_solve_after_it(cora, tmp_path):
    """Time to accuracy reads ``wall_time_s``: the ranks wait for a re-solve before the next
    epoch, so an epoch's wall time must count the one after it (it was read before)."""
    part_dir = tmp_path / "parts"
    make_partition(cora, part_dir, num_parts=2, spec=exact_config("gcn", str(part_dir)).data.spec())
    for result in run_workers(_wall_times, 2, tmp_path, str(part_dir)):
        assert (result["wall"] >= result["spent"]).all(), result
