"""EpochCounters: what the record_* methods add up, and how ``reduced`` combines ranks
(times averaged, bytes and counts summed, staleness and wall-clock dates maximised)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from adaqp.config import CommConfig
from adaqp.exchange.counters import EpochCounters
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import run_workers

L0F, L1B = "layer0/forward", "layer1/backward"
TAGS = [L0F, L1B]


def _handle(key: str, **figures) -> SimpleNamespace:
    """A stand-in for ``PendingExchange``: only the figures the counters read."""
    base = dict(
        key=key,
        bytes_sent=0,
        bits_histogram={},
        quant_s=0.0,
        launch_s=0.0,
        exchange_s=0.0,
        dequant_s=0.0,
        arrived_at=0.0,
        done_at=0.0,
    )
    base.update(figures)
    return SimpleNamespace(**base)


def _ranks() -> list[EpochCounters]:
    """Three ranks' counters; dyadic times so sums are exact in binary."""
    r0 = EpochCounters(
        comm_time_s=1.0,
        comm_wait_s=0.5,
        quant_time_s=0.25,
        dequant_time_s=0.125,
        allreduce_time_s=3.0,
        halo_bytes_per_epoch=100,
        bits_histogram={2: 10, 32: 4},
        bytes_by_tag={L0F: 60, L1B: 40},
        staleness_by_tag={L0F: {0: 2, 1: 1}},
        max_staleness=1,
        effective_staleness=1.0,
        comm_time_by_tag={L0F: 0.75, L1B: 0.25},
        comm_wait_by_tag={L0F: 0.5},
        exchange_span_by_tag={L0F: 2.0},
        exchange_arrived_at_by_tag={L0F: 100.0, L1B: 110.0},
        exchange_done_at_by_tag={L0F: 101.0, L1B: 111.5},
    )
    r1 = EpochCounters(
        comm_time_s=2.0,
        comm_wait_s=1.5,
        quant_time_s=0.75,
        dequant_time_s=0.375,
        allreduce_time_s=0.0,
        halo_bytes_per_epoch=250,
        bits_histogram={4: 6, 32: 4},
        bytes_by_tag={L0F: 250},
        staleness_by_tag={L0F: {2: 3}, L1B: {0: 1}},
        max_staleness=2,
        effective_staleness=2.5,
        comm_time_by_tag={L0F: 2.0},
        comm_wait_by_tag={L0F: 1.0, L1B: 0.5},
        exchange_span_by_tag={L0F: 1.5, L1B: 3.0},
        exchange_arrived_at_by_tag={L0F: 100.5},
        exchange_done_at_by_tag={L0F: 102.0, L1B: 111.0},
    )
    r2 = EpochCounters(
        comm_time_s=3.0,
        halo_bytes_per_epoch=7,
        bits_histogram={1: 5},
        comm_time_by_tag={L1B: 0.5},
        exchange_arrived_at_by_tag={L1B: 112.0},
    )
    return [r0, r1, r2]


def _check_expected(out: EpochCounters) -> None:
    """The reduction of ``_ranks()``, worked out by hand."""
    assert out.comm_time_s == pytest.approx((1.0 + 2.0 + 3.0) / 3)
    assert out.comm_wait_s == pytest.approx((0.5 + 1.5) / 3)
    assert out.quant_time_s == pytest.approx((0.25 + 0.75) / 3)
    assert out.dequant_time_s == pytest.approx((0.125 + 0.375) / 3)
    assert out.allreduce_time_s == pytest.approx(1.0)
    assert out.halo_bytes_per_epoch == 357
    assert type(out.halo_bytes_per_epoch) is int
    assert out.bits_histogram == {1: 5, 2: 10, 4: 6, 32: 8}
    assert all(type(v) is int for v in out.bits_histogram.values())
    assert out.bytes_by_tag == {L0F: 310, L1B: 40}
    assert all(type(v) is int for v in out.bytes_by_tag.values())
    assert out.staleness_by_tag == {L0F: {0: 2, 1: 1, 2: 3}, L1B: {0: 1}}
    assert out.max_staleness == 2
    assert type(out.max_staleness) is int
    # Per read, every rank's: 3 reads at 1.0 and 4 at 2.5 (rank 2 read nothing).
    assert out.effective_staleness == pytest.approx((3 * 1.0 + 4 * 2.5) / 7)
    assert out.comm_time_by_tag == pytest.approx({L0F: 2.75 / 3, L1B: 0.75 / 3})
    assert out.comm_wait_by_tag == pytest.approx({L0F: 1.5 / 3, L1B: 0.5 / 3})
    assert out.exchange_span_by_tag == {L0F: 2.0, L1B: 3.0}
    assert out.exchange_arrived_at_by_tag == {L0F: 100.5, L1B: 112.0}
    assert out.exchange_done_at_by_tag == {L0F: 102.0, L1B: 111.5}
    # The last arrival to the last landing; never negative (l1's done predates arrival).
    assert out.exchange_after_arrival_by_tag == {L0F: 1.5, L1B: 0.0}
    assert out.avg_bits == pytest.approx((5 * 1 + 10 * 2 + 6 * 4 + 8 * 32) / 29)


def _flat(counters: EpochCounters, tags, bound: int) -> torch.Tensor:
    """The flat tensor ``reduced`` hands to ``all_reduce`` (captured, not rebuilt)."""
    seen: list[torch.Tensor] = []

    def capture(tensor: torch.Tensor, how: str) -> torch.Tensor:
        seen.append(tensor.clone())
        return tensor

    counters.reduced(capture, 1, tags, bound)
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])
    return seen[0]


def _simulated(ranks: list[EpochCounters], tags, bound: int):
    """An all_reduce across simulated ranks: elementwise sum or max of their tensors."""
    flats = torch.stack([_flat(c, tags, bound) for c in ranks])
    calls: list[str] = []

    def all_reduce(tensor: torch.Tensor, how: str) -> torch.Tensor:
        calls.append(how)
        assert tensor.dtype == torch.float64
        assert any(torch.equal(tensor, f) for f in flats), "not one rank's own tensor"
        return flats.sum(0) if how == "sum" else flats.amax(0)

    return all_reduce, calls


def test_record_launch_and_landing_add_up_per_tag():
    c = EpochCounters()
    a = _handle(
        L0F,
        bytes_sent=120,
        bits_histogram={4: 30, 32: 6},
        quant_s=0.25,
        launch_s=0.125,
        exchange_s=1.0,
        dequant_s=0.5,
        arrived_at=50.0,
        done_at=52.0,
    )
    b = _handle(
        L0F,
        bytes_sent=80,
        bits_histogram={4: 10},
        quant_s=0.5,
        launch_s=0.25,
        exchange_s=2.0,
        dequant_s=0.25,
        arrived_at=49.0,
        done_at=53.0,
    )
    g = _handle(L1B, bytes_sent=16, bits_histogram={32: 4}, launch_s=0.0625, exchange_s=0.5)
    for h in (a, b, g):
        c.record_launch(h)
    # Launch alone: bytes, widths, quantization; launching counts as waiting.
    assert c.halo_bytes_per_epoch == 216
    assert c.bytes_by_tag == {L0F: 200, L1B: 16}
    assert c.bits_histogram == {4: 40, 32: 10}
    assert c.quant_time_s == 0.75
    assert c.comm_wait_s == 0.4375
    assert c.comm_wait_by_tag == {L0F: 0.375, L1B: 0.0625}
    assert c.comm_time_s == 0.0 and c.comm_time_by_tag == {}

    c.record_landing(a, blocked_s=0.5)
    c.record_landing(b, blocked_s=0.0)
    c.record_landing(g, blocked_s=0.125)
    assert c.comm_time_s == 3.5
    assert c.dequant_time_s == 0.75
    assert c.comm_wait_s == 0.4375 + 0.625
    assert c.comm_time_by_tag == {L0F: 3.0, L1B: 0.5}
    assert c.comm_wait_by_tag == {L0F: 0.875, L1B: 0.1875}
    # Span: quant + exchange + dequant, summed over the tag's exchanges.
    assert c.exchange_span_by_tag == {L0F: 1.75 + 2.75, L1B: 0.5}
    # Dates: the latest of the tag's exchanges.
    assert c.exchange_arrived_at_by_tag == {L0F: 50.0, L1B: 0.0}
    assert c.exchange_done_at_by_tag == {L0F: 53.0, L1B: 0.0}
    assert c.exchange_after_arrival_by_tag == {L0F: 3.0, L1B: 0.0}


def test_record_staleness_and_allreduce():
    c = EpochCounters()
    for tag, s in [(L0F, 0), (L0F, 2), (L0F, 2), (L1B, 1), (L0F, 0)]:
        c.record_staleness(tag, s)
    assert c.staleness_by_tag == {L0F: {0: 2, 2: 2}, L1B: {1: 1}}
    assert c.max_staleness == 2
    c.record_staleness(L1B, 0)  # a smaller one keeps the maximum
    assert c.max_staleness == 2
    # Without an effective age, a read's is its buffer's: the mean of 0, 2, 2, 1, 0, 0.
    assert c.effective_staleness == pytest.approx(5 / 6)
    c.record_staleness(L1B, 1, effective=9.5)  # a moving average remembers older rows
    assert c.effective_staleness == pytest.approx((5 + 9.5) / 7)
    assert c.max_staleness == 2 and c.stale_reads == 7
    c.record_allreduce(0.25)
    c.record_allreduce(0.5)
    assert c.allreduce_time_s == 0.75


def test_avg_bits_weights_widths_by_values_sent():
    assert EpochCounters().avg_bits == 32.0  # nothing sent: full precision
    assert EpochCounters(bits_histogram={2: 10, 32: 4}).avg_bits == pytest.approx(148 / 14)
    assert EpochCounters(bits_histogram={8: 3}).avg_bits == 8.0


def test_reduced_over_simulated_ranks_matches_hand_computed():
    ranks = _ranks()
    all_reduce, calls = _simulated(ranks, TAGS, 2)
    # Any rank reducing gets the same answer.
    for counters in ranks:
        _check_expected(counters.reduced(all_reduce, 3, TAGS, 2))
    assert sorted(set(calls)) == ["max", "sum"]


def test_reduced_does_not_modify_the_rank_counters():
    ranks = _ranks()
    before = [EpochCounters(**vars(c)) for c in _ranks()]
    all_reduce, _ = _simulated(ranks, TAGS, 2)
    ranks[0].reduced(all_reduce, 3, TAGS, 2)
    assert ranks == before


def test_reduced_on_one_rank_is_identity():
    c = _ranks()[0]
    out = c.reduced(lambda tensor, how: tensor, 1, TAGS, 1)
    assert out == c
    assert out is not c and out.bits_histogram is not c.bits_histogram


def test_effective_staleness_is_zero_without_reads():
    out = EpochCounters().reduced(lambda tensor, how: tensor, 2, TAGS)
    assert out.effective_staleness == 0.0 and out.stale_reads == 0


def test_reduced_drops_zero_entries():
    c = EpochCounters(bytes_by_tag={L0F: 0, L1B: 5}, bits_histogram={2: 0, 8: 3})
    out = c.reduced(lambda tensor, how: tensor, 1, TAGS)
    assert out.bytes_by_tag == {L1B: 5}
    assert out.bits_histogram == {8: 3}


@pytest.mark.parametrize(
    "counters, field",
    [
        (EpochCounters(bytes_by_tag={"layer9/forward": 1}), "bytes_by_tag"),
        (EpochCounters(comm_time_by_tag={"other": 1.0}), "comm_time_by_tag"),
        (EpochCounters(bits_histogram={3: 1}), "bits_histogram"),
        # An age above the bound (here 0) or an unknown tag: never dropped in silence.
        (EpochCounters(staleness_by_tag={L1B: {1: 2}}), "staleness_by_tag"),
        (EpochCounters(staleness_by_tag={"layer9/forward": {0: 1}}), "staleness_by_tag"),
    ],
)
def test_reduced_rejects_keys_outside_tags_and_widths(counters, field):
    with pytest.raises(ValueError, match=field):
        counters.reduced(lambda tensor, how: tensor, 1, TAGS)


def _gloo_worker(rank: int, world_size: int, init_method: str):
    init_distributed(CommConfig(timeout_s=60, device="cpu"), init_method, rank, world_size)
    try:

        def all_reduce(tensor: torch.Tensor, how: str) -> torch.Tensor:
            op = dist.ReduceOp.MAX if how == "max" else dist.ReduceOp.SUM
            dist.all_reduce(tensor, op=op)
            return tensor

        out = _ranks()[rank].reduced(all_reduce, world_size, TAGS, 2)
        _check_expected_two(out)
        return {"bytes": np.array(out.halo_bytes_per_epoch), "time": np.array(out.comm_time_s)}
    finally:
        shutdown()


def _check_expected_two(out: EpochCounters) -> None:
    """The reduction of ranks 0 and 1 of ``_ranks()``, by hand."""
    assert out.comm_time_s == 1.5
    assert out.comm_wait_s == 1.0
    assert out.allreduce_time_s == 1.5
    assert out.halo_bytes_per_epoch == 350
    assert out.bits_histogram == {2: 10, 4: 6, 32: 8}
    assert out.bytes_by_tag == {L0F: 310, L1B: 40}
    assert out.staleness_by_tag == {L0F: {0: 2, 1: 1, 2: 3}, L1B: {0: 1}}
    assert out.max_staleness == 2
    assert out.effective_staleness == pytest.approx(13 / 7)
    assert out.comm_time_by_tag == {L0F: 1.375, L1B: 0.125}
    assert out.comm_wait_by_tag == {L0F: 0.75, L1B: 0.25}
    assert out.exchange_span_by_tag == {L0F: 2.0, L1B: 3.0}
    assert out.exchange_arrived_at_by_tag == {L0F: 100.5, L1B: 110.0}
    assert out.exchange_done_at_by_tag == {L0F: 102.0, L1B: 111.5}


def test_two_ranks_simulated_agrees_with_hand_computed():
    ranks = _ranks()[:2]
    all_reduce, _ = _simulated(ranks, TAGS, 2)
    _check_expected_two(ranks[1].reduced(all_reduce, 2, TAGS, 2))


@pytest.mark.distributed
def test_reduced_over_real_gloo_ranks(tmp_path):
    results = run_workers(_gloo_worker, 2, tmp_path, timeout=120.0)
    for result in results:
        assert int(result["bytes"]) == 350
        assert float(result["time"]) == 1.5
