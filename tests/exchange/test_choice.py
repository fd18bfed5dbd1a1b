"""Mode adaqp-s: the planner makes an exchange stale only where that hides a wait and the
rows move slowly, decides again every cycle, and all ranks switch together."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from adaqp.config import ConfigError, StalenessConfig, load_config
from adaqp.data import load_dataset
from adaqp.exchange import choice
from adaqp.exchange.choice import DRIFT_DECAY, ChoicePolicy, choose, drift_figures, pooled
from adaqp.exchange.counters import EpochCounters
from adaqp.exchange.stale import StalePolicy
from adaqp.exchange.transport import ExchangeKey
from adaqp.partitioning.build import make_partition
from tests.distributed import RecordingWriter, run_workers
from tests.exchange.landings import EpochRows, delay_landings
from tests.run.exactness import exact_config, rank_trainer

EPOCHS = 8
CYCLE = 4
KEYS = ["layer1/backward", "layer1/forward", "layer2/backward", "layer2/forward"]


def _worker(rank, world_size, init_method, part_dir: str, cases: dict):
    result = {}
    for name, (extra, delay) in cases.items():
        config = exact_config(
            "gcn",
            part_dir,
            (
                "comm.mode=adaqp-s",
                f"train.epochs={EPOCHS}",
                "train.eval_every=1000",
                # The choice runs on its own cycle: the planner never re-solves here.
                f"staleness.choose_every={CYCLE}",
                f"quant.assign_cycle={4 * EPOCHS}",
                f"quant.first_cycle={4 * EPOCHS}",
                # A stale read uses last epoch's exchange whatever the timing (with
                # "newest" a fast machine may read this epoch's, already landed).
                "staleness.landing=fixed",
                *extra,
            ),
        )
        with rank_trainer(config, init_method + name, rank, world_size, part_dir) as (trainer, _):
            delay_landings(trainer.transport, delay if rank == 1 else 0.0)
            if name == "split" and rank == 1:  # rank 1 times its epochs 1000 times longer

                def slow_clock(epoch, *args, epoch_s=0.0, end=trainer.policy.end_epoch, **kw):
                    return end(epoch, *args, epoch_s=1000 * epoch_s, **kw)

                trainer.policy.end_epoch = slow_clock
            records = RecordingWriter()
            summary = trainer.fit(records)
            result[f"{name}/stale"] = np.array(sorted(summary.stale_exchanges))
            result[f"{name}/max_staleness"] = np.array([r.max_staleness for r in records.records])
            result[f"{name}/drift"] = np.array([summary.drift_by_tag.get(k) or -1.0 for k in KEYS])
            result[f"{name}/loss"] = np.array([r.train_loss for r in records.records])
            result[f"{name}/avg_bits"] = np.array([r.avg_bits for r in records.records])
    return result


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    part_dir = tmp_path_factory.mktemp("choice") / "parts"
    cora = load_dataset("cora")
    make_partition(cora, part_dir, num_parts=2, spec=exact_config("gcn", "").data.spec())
    return str(part_dir)


@pytest.mark.distributed
def test_planner_makes_exchanges_that_wait_stale_after_epoch_1_and_no_others(parts, tmp_path):
    cases = {
        # Every exchange pays (no wait needed).
        "always": (("staleness.min_hidden_fraction=0",), 0.0),
        # Rank 1's exchanges land 100 ms late: the waits (mean over ranks, per exchange
        # about an eighth of the epoch) pay for staleness; the threshold leaves room for
        # a first epoch slowed by a busy machine. The first choice does not ask the
        # drift (max_drift 0 would refuse every later one).
        "slow": (("staleness.min_hidden_fraction=0.02", "staleness.max_drift=0"), 0.1),
        # No exchange holds the ranks up for 90% of the epoch: all stay fresh, at 2 bits
        # (GCN's default is 1 bit, which epoch 1's one-bit rows could not be told from;
        # over loopback the default would send float32).
        "fast": (
            ("staleness.min_hidden_fraction=0.9", "quant.bits=2", "quant.full_precision=never"),
            0.0,
        ),
        # What "always" should reproduce.
        "onebit": (("comm.mode=onebit",), 0.0),
        # The "slow" waits, but the ranks time their epochs differently (below): on its
        # own clock rank 0 would go stale, rank 1 not. On the mean epoch neither does.
        "split": (("staleness.min_hidden_fraction=0.02",), 0.1),
    }
    results = run_workers(_worker, 2, tmp_path, parts, cases, timeout=300)
    for r in results:
        # Epoch 1 runs every exchange as onebit does (one bit, waited for); the choice
        # after it makes them stale from epoch 2, which reads epoch 1's rows.
        for name in ("always", "slow", "fast"):
            assert r[f"{name}/avg_bits"][0] == 1.0, name
        for name in ("always", "slow"):
            assert r[f"{name}/stale"].tolist() == KEYS, name
            ages = r[f"{name}/max_staleness"].tolist()
            assert ages == [0] + [1] * (EPOCHS - 1), (name, ages)
            # Stale from the first choice, so never measured after it (the choice no
            # longer asks): no drift is known (reported as None).
            assert r[f"{name}/drift"].tolist() == [-1.0] * len(KEYS), name
        # Every exchange stale from the first choice: onebit's training, bit for bit.
        np.testing.assert_array_equal(r["always/loss"], r["onebit/loss"])
        assert r["fast/stale"].tolist() == []
        drift = r["fast/drift"]
        assert np.all((drift > 0) & (drift < 1)), drift  # fresh keys: measured, per epoch
        assert r["fast/max_staleness"].tolist() == [0] * EPOCHS
        assert r["fast/avg_bits"][1:].tolist() == [2.0] * (EPOCHS - 1)  # quant.bits from epoch 2
        assert r["split/stale"].tolist() == []
    # Every rank made the same choices.
    for name in cases:
        assert results[0][f"{name}/stale"].tolist() == results[1][f"{name}/stale"].tolist()


def _halves(rows: list[torch.Tensor]) -> list[list]:
    """The policy's per-half sums of a cycle whose epochs sent ``rows``."""
    half = len(rows) // 2
    return [
        [torch.stack(part).sum(0), len(part), float(sum(r.double().pow(2).sum() for r in part))]
        for part in (rows[:half], rows[half:])
    ]


def test_drift_measures_how_far_rows_move_not_their_noise():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1000, 32, generator=g)
    cycle = 20

    def drift(rows):
        moved, size, epochs = drift_figures(_halves(rows), cycle)
        return (moved / size) ** 0.5 / epochs

    # Dropout-like noise as large as the rows themselves, rows not moving: about 0.
    still = [base * (torch.rand(1000, 32, generator=g) > 0.5) * 2 for _ in range(cycle)]
    naive = float((still[1] - still[0]).norm() / still[1].norm())
    assert naive > 0.5 and drift(still) < 0.01
    # Rows moving about 2% per epoch, no noise: their step over the second half's mean.
    step = torch.randn(1000, 32, generator=g) * 0.02 * base.norm() / (1000 * 32) ** 0.5
    moving = [base + t * step for t in range(cycle)]
    exact = float(step.norm() / torch.stack(moving[cycle // 2 :]).mean(0).norm())
    assert drift(moving) == pytest.approx(exact, rel=0.02)
    # Both: the noise does not hide the movement.
    noisy = [r * (torch.rand(1000, 32, generator=g) > 0.5) * 2 for r in moving]
    assert drift(noisy) == pytest.approx(exact, rel=0.1)
    # A half with one epoch has no spread to measure: unknown.
    assert drift_figures(_halves(moving[:3]), 3) == (-1.0, 0.0, 0.0)


def test_choice_thresholds_are_checked():
    with pytest.raises(ConfigError, match="staleness.min_hidden_fraction"):
        load_config(None, ["staleness.min_hidden_fraction=1.5"])
    with pytest.raises(ConfigError, match="staleness.max_drift"):
        load_config(None, ["staleness.max_drift=-1"])
    with pytest.raises(ConfigError, match="staleness.choose_every.*two halves"):
        load_config(None, ["comm.mode=adaqp-s", "staleness.choose_every=3"])


def test_pooled_drift_weighs_earlier_cycles_less_and_skips_unknown_ones():
    first = pooled(None, [4.0, 100.0, 2.0])
    assert first == [4.0, 100.0, 2.0]
    second = pooled(first, [1.0, 100.0, 2.0])
    assert second == [DRIFT_DECAY * 4.0 + 1.0, DRIFT_DECAY * 100.0 + 100.0, 2.0]
    # An unknown cycle (a half too short to measure) leaves the pool as it was.
    assert pooled(second, [-1.0, 0.0, 0.0]) == second
    assert pooled(None, [-1.0, 0.0, 0.0]) == [-1.0, 0.0, 0.0]
    assert pooled([-1.0, 0.0, 0.0], [1.0, 4.0, 2.0]) == [1.0, 4.0, 2.0]


def test_choice_needs_a_wait_then_little_drift_and_a_stale_key_stays_stale():
    config = load_config(None, ["staleness.min_hidden_fraction=0.1", "staleness.max_drift=0.1"])
    epoch_s = 1.0
    waits = {"a": 0.2, "b": 0.2, "c": 0.05, "d": 0.2}
    drift = {"a": 0.05, "b": 0.15, "c": 0.05, "d": math.inf}
    # Later choices: a waits and moves slowly; b moves too fast, c does not wait, d's
    # drift is unknown.
    assert choose(drift, waits, epoch_s, set(), config.staleness) == {"a"}
    # The first choice goes on the wait alone.
    assert choose(drift, waits, epoch_s, set(), config.staleness, first=True) == {"a", "b", "d"}
    # A stale key stays stale, however its rows move.
    assert choose(drift, waits, epoch_s, {"b", "c"}, config.staleness) == {"a", "b", "c"}


class _Planner:
    """The planner a ``ChoicePolicy`` asks, reduced to one rank that plans float32 rows
    and traces nothing (the choice is what is tested, not the widths)."""

    tracing = False
    world = SimpleNamespace(rank=0, world_size=1, is_main=True)

    def plan(self, key, out_rows, in_rows, dim):
        return None

    def end_epoch(self, epoch, exchange_s_by_tag=None, wait_s_by_tag=None):
        return 0.0


def test_effective_staleness_is_one_figure_for_one_read_history(monkeypatch):
    """The same reads give the same ``effective_staleness`` in both stale modes: layer 1
    reads last epoch's rows from epoch 2 on, layer 2 (the last) always its own epoch's.
    In ``onebit`` that is ``fresh_last_layer``; in ``adaqp-s`` the choice after epoch 1
    (layer 1 waited, layer 2 did not). Both count layer 2's reads at age 0."""
    # One rank: the choice's reductions and broadcast leave their tensors as they are.
    monkeypatch.setattr(
        choice, "dist", SimpleNamespace(all_reduce=lambda t: t, broadcast=lambda t, src: t)
    )
    config = StalenessConfig(landing="fixed", fresh_last_layer=True, min_hidden_fraction=0.5)
    keys = (ExchangeKey.forward(1), ExchangeKey.forward(2))
    epochs = 6

    def run(policy, transport):
        figures = []
        for epoch in range(1, epochs + 1):
            transport.epoch = epoch
            counters = EpochCounters()
            policy.begin_epoch(epoch, counters)
            with policy.training():
                for key in keys:
                    policy.start(key, torch.zeros(2, 4)).wait()
            waits = {str(keys[0]): 1.0, str(keys[1]): 0.0}  # seconds; the epoch: 1 s
            policy.end_epoch(epoch, wait_s_by_tag=waits, epoch_s=1.0)
            figures.append((counters.effective_staleness, counters.staleness_by_tag))
        policy.close()
        return figures

    transport = EpochRows(lambda s, t: True)
    onebit = run(StalePolicy(transport, config, "cpu", last_layer=2), transport)
    transport = EpochRows(lambda s, t: True)
    chooser = ChoicePolicy(transport, _Planner(), config, "cpu", last_layer=2)
    adaqp_s = run(chooser, transport)
    assert chooser.stale_keys == {keys[0]}  # the history is the one described
    ages = [f[1] for f in onebit]
    assert ages == [{str(keys[0]): {0: 1}, str(keys[1]): {0: 1}}] + [
        {str(keys[0]): {1: 1}, str(keys[1]): {0: 1}}
    ] * (epochs - 1)
    assert adaqp_s == onebit
    assert 0 < onebit[-1][0] < 10  # half of layer 1's smoothed age (which approaches 10)
