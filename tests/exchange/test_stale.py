"""Exchange policies between real gloo workers: ranks without halo, the one-bit
bounded-staleness mode (S = 0 is synchronous one-bit training; the bound holds when a
link is slow), and the ownership of exchange state."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from adaqp.config import StalenessConfig, load_config
from adaqp.data import GraphData, load_dataset
from adaqp.exchange.counters import EpochCounters
from adaqp.exchange.nocomm import NoCommTransport
from adaqp.exchange.stale import StalePolicy
from adaqp.exchange.transport import BitPlan, ExchangeKey, PendingExchange
from adaqp.graph.local import LocalGraph
from adaqp.partitioning.build import make_partition
from adaqp.partitioning.schema import read_metadata
from adaqp.partitioning.store import load_part
from adaqp.quant.mixed import blend_
from adaqp.run.trainer import Trainer
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import NullWriter, run_workers
from tests.exchange.landings import EpochRows, delay_landings


def _two_components(size_a: int = 24, size_b: int = 48, seed: int = 0) -> GraphData:
    """Two random graphs side by side: nodes [0, a) and [a, a + b), no edge between."""
    rng = np.random.default_rng(seed)
    n = size_a + size_b
    edges = set()
    for lo, hi in ((0, size_a), (size_a, n)):
        for u in range(lo, hi):
            for v in rng.choice(np.arange(lo, hi), size=3, replace=False):
                if u != v:
                    edges |= {(u, int(v)), (int(v), u)}
    dst, src = np.array(sorted(edges)).T
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    labels = rng.integers(0, 3, n).astype(np.int64)
    features = (rng.standard_normal((n, 8)) + labels[:, None]).astype(np.float32)
    order = rng.permutation(n)
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    masks[0][order[: n // 2]] = True
    masks[1][order[n // 2 : 3 * n // 4]] = True
    masks[2][order[3 * n // 4 :]] = True
    return GraphData("two-components", indptr, src.astype(np.int64), features, labels, *masks, 3)


def _train_runs(rank, world_size, init_method, part_dir: str, runs: dict[str, tuple[str, ...]]):
    """One process group, one training run per entry of ``runs`` (name -> overrides);
    the results' keys carry the run's name as a prefix."""
    base = [f"partition.dir={part_dir}", "comm.timeout_s=60"]
    configs = {name: load_config(None, [*o, *base]) for name, o in runs.items()}
    world = init_distributed(next(iter(configs.values())).comm, init_method, rank, world_size)
    try:
        meta = read_metadata(part_dir)
        graph = LocalGraph.from_part(load_part(part_dir, rank, meta))
        out = {}
        for name, config in configs.items():
            trainer = Trainer(config, graph, meta, world)
            summary = trainer.fit(NullWriter())
            weights = [p.detach().reshape(-1) for p in trainer.model.parameters()]
            out |= {
                f"{name}num_halo": np.array(graph.num_halo),
                f"{name}loss": np.array(summary.final_train_loss),
                f"{name}max_staleness": np.array(summary.max_staleness),
                f"{name}weights": torch.cat(weights).numpy().copy(),
            }
        return out
    finally:
        shutdown()


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["vanilla", "adaqp", "onebit", "adaqp-s"])
def test_a_part_without_halo_trains_without_waiting(mode, tmp_path):
    """A rank whose part has no halo nodes still joins every exchange (its peers may need
    its rows, or nothing at all: the collective is shared). Its part has no marginal rows,
    and the other parts here have no central rows: GAT's attention over such an empty
    block of the overlap once failed to infer a shape from 0 elements."""
    graph = _two_components()
    part_dir = tmp_path / "parts"
    make_partition(graph, part_dir, num_parts=3, spec={"name": graph.name}, method="contiguous")
    runs = {
        f"{model}/": (
            f"comm.mode={mode}",
            f"model.name={model}",
            "model.hidden=8",
            "train.epochs=3",
            "quant.assign_cycle=2",
        )
        for model in ("gcn", "sage", "gat")
    }
    results = run_workers(_train_runs, 3, tmp_path, str(part_dir), runs, timeout=150)
    for name in runs:
        assert int(results[0][f"{name}num_halo"]) == 0, "part 0 is the first component, whole"
        assert all(int(r[f"{name}num_halo"]) > 0 for r in results[1:])
        assert all(np.isfinite(float(r[f"{name}loss"])) for r in results)
        for r in results[1:]:
            np.testing.assert_array_equal(r[f"{name}weights"], results[0][f"{name}weights"])


@pytest.fixture(scope="module")
def cora_parts(tmp_path_factory):
    part_dir = tmp_path_factory.mktemp("cora") / "parts"
    cora = load_dataset("cora")
    make_partition(cora, part_dir, num_parts=3, spec={"name": "cora", "split_seed": 0})
    return str(part_dir)


_SMALL = ("data.dataset=cora", "model.hidden=16", "model.dropout=0.5", "train.epochs=6")


@pytest.mark.distributed
def test_bound_zero_equals_synchronous_one_bit_training(cora_parts, tmp_path):
    """S = 0 is step for step the synchronous one-bit run (adaqp at a uniform 1 bit, the
    same overlap and seeds); and one-bit noise really moved the run off Vanilla's."""
    runs = {
        "onebit-s0": ("comm.mode=onebit", "staleness.bound=0"),
        "sync-1bit": (
            "comm.mode=adaqp",
            "quant.scheme=uniform",
            "quant.bits=1",
            "quant.full_precision=never",  # quantized over loopback too
        ),
        "vanilla": ("comm.mode=vanilla",),
    }
    runs = {f"{name}/": (*_SMALL, *extra) for name, extra in runs.items()}
    result = run_workers(_train_runs, 3, tmp_path, cora_parts, runs)[0]
    assert all(int(result[f"{name}max_staleness"]) == 0 for name in runs)
    onebit, sync, vanilla = (result[f"{n}/weights"] for n in ("onebit-s0", "sync-1bit", "vanilla"))
    np.testing.assert_array_equal(onebit, sync)
    assert np.abs(onebit - vanilla).max() > 1e-4


DELAY_S = 2.0


def _delayed_worker(rank, world_size, init_method, part_dir: str, bound: int):
    """Rank 1's exchanges land DELAY_S after they start; every rank logs per epoch the
    staleness it used and the time it was blocked."""
    config = load_config(
        None,
        [*_SMALL, f"partition.dir={part_dir}", "comm.mode=onebit", f"staleness.bound={bound}"],
    )
    world = init_distributed(config.comm, init_method, rank, world_size)
    try:
        meta = read_metadata(part_dir)
        graph = LocalGraph.from_part(load_part(part_dir, rank, meta))
        trainer = Trainer(config, graph, meta, world)
        delay_landings(trainer.transport, DELAY_S if rank == 1 else 0.0)
        used, blocked = [], []
        try:
            for epoch in range(1, 5):
                counters = EpochCounters()
                trainer.policy.begin_epoch(epoch, counters)
                trainer.train_step(counters, epoch)
                stale = [s for h in counters.staleness_by_tag.values() for s in h]
                used.append(max(stale))
                blocked.append(counters.comm_wait_s)
        finally:
            trainer.policy.close()
        return {"used": np.array(used), "blocked": np.array(blocked)}
    finally:
        shutdown()


@pytest.mark.distributed
@pytest.mark.slow
def test_staleness_bound_holds_when_a_link_is_slow(cora_parts, tmp_path):
    """With S = 1 and one rank's exchanges landing 2 s late, no buffer older than one
    epoch is ever used: the slow rank blocks instead (from epoch 3 on, where a staler
    buffer would have been at hand)."""
    results = run_workers(_delayed_worker, 3, tmp_path, cora_parts, 1, timeout=240)
    for r in results:
        assert r["used"].max() <= 1
    slow = results[1]
    assert slow["used"][0] == 0  # epoch 1 has nothing older: it waits for its own
    assert (slow["used"][1:] == 1).all()  # later epochs run one epoch behind ...
    assert slow["blocked"][2:].sum() > DELAY_S / 2  # ... and block for the bound


def test_exchange_state_has_one_owner():
    """Handles, plans and keys are read-only to everyone but their owner."""
    key = ExchangeKey.forward(1)
    assert str(key) == "layer1/forward" and key != ExchangeKey.backward(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.layer = 2
    plan = BitPlan.uniform(2, 3, 4, "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.out_bits = plan.in_bits
    handle = NoCommTransport(0, [0, 2], [0, 3]).start(torch.ones(2, 4), key)
    assert handle.wait().shape == (3, 4)
    for name in ("bytes_sent", "bits_histogram", "wait_s", "exchange_s", "quant_s", "key"):
        with pytest.raises(AttributeError):
            setattr(handle, name, 0)
    values = handle.bits_histogram
    values[32] = 7
    assert handle.bits_histogram == {}  # a copy: the handle's own figure stays


@pytest.mark.parametrize(
    ("settings", "waiting_epochs"),
    [
        ({}, {1}),  # epoch 1 has nothing older: it waits for its own
        ({"bound": 0}, {1, 2, 3, 4}),  # synchronous
        ({"sync_every": 3}, {1, 3}),
        ({"bound": 2, "landing": "fixed"}, {1}),
    ],
)
def test_a_layer_splits_its_rows_only_where_an_exchange_may_wait(settings, waiting_epochs):
    """Overlap (central rows first, marginal rows after the landing) costs two smaller
    products and a concatenation each way; a layer that reads an earlier epoch's buffer
    in both directions has nothing to overlap, and evaluation is always fresh."""
    policy = StalePolicy(NoCommTransport(0, [0, 2], [0, 3]), StalenessConfig(**settings), "cpu")
    forward, backward = ExchangeKey.forward(1), ExchangeKey.backward(1)
    waits = set()
    for epoch in range(1, 5):
        policy.begin_epoch(epoch, EpochCounters())
        with policy.training():
            if policy.waits(1):
                waits.add(epoch)
            policy.start(forward, torch.ones(2, 4)).wait()
            policy.start(backward, torch.ones(3, 4)).wait()
        assert policy.waits(1)  # outside training: evaluation
    policy.close()
    assert waits == waiting_epochs


def _reads(landed, epochs: int, **settings) -> tuple[list[float], list[float], list[int]]:
    """Per epoch: what one stale exchange's layer read (its rows' value), and the epoch's
    ``effective_staleness`` and ``max_staleness``."""
    transport = EpochRows(landed)
    policy = StalePolicy(transport, StalenessConfig(**settings), "cpu")
    read, effective, oldest = [], [], []
    for epoch in range(1, epochs + 1):
        transport.epoch = epoch
        counters = EpochCounters()
        policy.begin_epoch(epoch, counters)
        with policy.training():
            rows = policy.start(ExchangeKey.forward(1), torch.zeros(2, 4)).wait()
        assert (rows == rows[0, 0]).all()
        read.append(float(rows[0, 0]))
        effective.append(counters.effective_staleness)
        oldest.append(counters.max_staleness)
    policy.close()
    return read, effective, oldest


def test_a_landed_buffer_enters_the_moving_average_once():
    """Epoch 2's exchange lands at once, epoch 3's a epoch late: epoch 3 reads epoch 2's
    buffer again, which is in the average already, so the average stays as it was (blending
    it again would read 1.75 at epoch 3)."""
    delays = {1: 0, 2: 0, 3: 1, 4: 0}
    read, effective, oldest = _reads(
        lambda s, t: t >= s + delays[s], 4, smoothing=0.5, bound=1, landing="newest"
    )
    assert read == [1.0, 1.5, 1.5, 2.75]  # 1; (1 + 2) / 2; unchanged; (1.5 + 4) / 2
    assert oldest == [0, 0, 1, 0]  # the chosen buffer stays within the bound ...
    assert effective == pytest.approx([0.0, 0.5, 1.5, 1.25])  # ... what is read is older


@pytest.mark.parametrize(
    ("landing", "smoothing", "age"),
    [
        # Always a buffer one epoch old: the average settles at 1 / (1 - g) = 10 epochs.
        ("fixed", 0.9, lambda t: 10 - 9 * 0.9 ** (t - 2) if t > 1 else 0.0),
        # Without smoothing, the chosen buffer's own age.
        ("fixed", 0.0, lambda t: 1.0 if t > 1 else 0.0),
        # Every exchange landed at once (its own epoch's): g / (1 - g) = 9.
        ("newest", 0.9, lambda t: 9 * (1 - 0.9 ** (t - 1))),
        ("newest", 0.0, lambda t: 0.0),
    ],
)
def test_effective_staleness_is_the_age_of_what_the_average_holds(landing, smoothing, age):
    """The mean age under the average's weights: ``t - m`` with ``m <- g m + (1 - g) s``
    for the buffer started at s, which is what the layer reads when rows carry their
    epoch."""
    epochs = 60
    read, effective, _ = _reads(
        lambda s, t: True, epochs, smoothing=smoothing, bound=1, landing=landing
    )
    expected = [age(t) for t in range(1, epochs + 1)]
    assert effective == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # The rows say the same (float32 rounding of the average).
    assert [t - r for t, r in enumerate(read, 1)] == pytest.approx(expected, abs=1e-3)
    if smoothing:
        assert effective[-1] == pytest.approx(10.0 if landing == "fixed" else 9.0, abs=0.02)


class _QuantizedEpochRows(EpochRows):
    """``EpochRows`` whose rows must be decoded before use, as quantized rows are (into a
    new tensor, or blended straight into an average); counts the decodes."""

    def __init__(self, landed):
        super().__init__(landed)
        self.decodes = 0

    def start(self, rows_RD, key, plan=None, ranges=False, *, selected=False) -> PendingExchange:
        _, in_counts = self.counts(key)
        shape, value = (sum(in_counts), rows_RD.shape[1]), float(self.epoch)

        def decode(buf, out=None, blend=None):
            self.decodes += 1
            rows = torch.full(shape, value)
            return rows if out is None else blend_(out, rows, blend)

        work = self._Work(self, self.epoch)
        payload = torch.empty(0, dtype=torch.uint8)
        return PendingExchange(
            self, key, work, payload, bytes_sent=0, bits_histogram={}, decode=decode
        )


@pytest.mark.parametrize(
    ("landing", "delays", "read", "decodes"),
    [
        # Epoch 3 reads epoch 2's buffer again (epoch 3's lands late): nothing to decode;
        # epoch 3's buffer is dropped unread once epoch 4's has landed.
        ("newest", {1: 0, 2: 0, 3: 1, 4: 0}, [1.0, 1.5, 1.5, 2.75], 3),
        # Epoch 2 reads epoch 1's buffer again (the one started S = 1 epochs earlier).
        ("fixed", {1: 0, 2: 0, 3: 0, 4: 0}, [1.0, 1.0, 1.5, 2.25], 3),
    ],
)
def test_a_stale_read_decodes_each_landed_buffer_once(landing, delays, read, decodes):
    """The bytes of a buffer are decoded once, straight into the moving average, however
    often a read chooses it: a second decode would cost CPU (and, blended, weigh the
    buffer twice) by timing alone."""
    transport = _QuantizedEpochRows(lambda s, t: t >= s + delays[s])
    policy = StalePolicy(transport, StalenessConfig(smoothing=0.5, landing=landing), "cpu")
    seen = []
    for epoch in range(1, len(read) + 1):
        transport.epoch = epoch
        policy.begin_epoch(epoch, EpochCounters())
        with policy.training():
            seen.append(float(policy.start(ExchangeKey.forward(1), torch.zeros(2, 4)).wait()[0, 0]))
    policy.close()
    assert seen == read
    assert transport.decodes == decodes  # one per buffer read, not one per read (4)
