"""ExchangePolicy (vanilla): float32 exchanges, waited for, counted only in training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaqp.config import CommConfig
from adaqp.exchange.counters import EpochCounters
from adaqp.exchange.policy import ExchangePolicy
from adaqp.exchange.transport import ExchangeKey, HaloTransport
from adaqp.quant.draws import Draw, draw_key
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import run_workers

DIM = 5
# Rank 0 sends 3 rows to rank 1, rank 1 sends 4 rows to rank 0 (uneven on purpose).
SEND_COUNTS = {0: [0, 3], 1: [4, 0]}
RECV_COUNTS = {0: [0, 4], 1: [3, 0]}


def _rows(rank: int, count: int, salt: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(count, DIM, generator=gen)


def _transport(rank: int) -> HaloTransport:
    return HaloTransport(rank, SEND_COUNTS[rank], RECV_COUNTS[rank], timeout_s=60, seed=1)


def test_policy_without_peers_plans_nothing_and_reports_nothing():
    transport = _transport(0)
    policy = ExchangePolicy(transport)
    assert ExchangePolicy.staleness_bound == 0
    assert policy.plan(ExchangeKey.forward(1), 3, 4, DIM) is None
    assert policy.report(0) == {}
    assert policy.end_epoch(1) == 0.0
    assert policy.end_epoch(2, {"layer1/forward": 0.5}) == 0.0
    policy.begin_epoch(7, EpochCounters())
    assert transport.step == "epoch 7"
    policy.at("epoch 7 evaluation")
    assert transport.step == "epoch 7 evaluation"
    policy.close()


def test_training_context_is_reset_even_on_error():
    policy = ExchangePolicy(_transport(0))
    assert not policy._training
    with policy.training():
        assert policy._training
    with pytest.raises(RuntimeError), policy.training():
        raise RuntimeError("boom")
    assert not policy._training


def test_the_rounding_has_no_state_to_save_its_draws_are_keyed():
    """A checkpoint needs nothing of the transport: an exchange's rounding is keyed by (seed,
    epoch, layer, direction) and each row's node, and gradients by the sending rank too."""
    ids = np.array([40, 7, 19])
    transport = HaloTransport(1, [0, 3], [2, 0], seed=5, send_ids=ids, halo_ids=np.array([3, 8]))
    policy = ExchangePolicy(transport)
    assert policy.state_dict() == {}
    policy.load_state_dict({"model/weight": torch.zeros(1)})  # other owners' keys: ignored
    transport.begin_epoch(4)
    forward = transport.draw_keys(ExchangeKey.forward(2), 3)
    assert forward.base == draw_key(5, 4, 2, Draw.FORWARD)
    assert forward.rows.tolist() == [40, 7, 19]
    backward = transport.draw_keys(ExchangeKey.backward(2), 2)
    assert backward.base == draw_key(5, 4, 2, Draw.BACKWARD, 1)
    assert backward.rows.tolist() == [3, 8]
    transport.begin_epoch(5)
    assert transport.draw_keys(ExchangeKey.forward(2), 3).base != forward.base
    # Without ids (tests, benchmarks): the row index.
    assert _transport(0).draw_keys(ExchangeKey.forward(0), 4).rows.tolist() == [0, 1, 2, 3]


def _policy_worker(rank: int, world_size: int, init_method: str):
    init_distributed(CommConfig(timeout_s=60, device="cpu"), init_method, rank, world_size)
    try:
        transport = _transport(rank)
        policy = ExchangePolicy(transport)
        counters = EpochCounters()
        policy.begin_epoch(3, counters)
        assert transport.step == "epoch 3"
        fwd, bwd = ExchangeKey.forward(1), ExchangeKey.backward(1)
        out = {}

        # Evaluation (outside training): exchanged, but nothing is counted.
        rows = _rows(rank, sum(SEND_COUNTS[rank]), salt=1)
        out["eval"] = policy.start(fwd, rows).wait().numpy()
        assert counters == EpochCounters()

        with policy.training():
            rows = _rows(rank, sum(SEND_COUNTS[rank]), salt=2)
            pending = policy.start(fwd, rows)
            # The launch is counted at once: float32 bytes and widths.
            assert counters.halo_bytes_per_epoch == rows.numel() * 4
            assert counters.bytes_by_tag == {"layer1/forward": rows.numel() * 4}
            assert counters.bits_histogram == {32: rows.numel()}
            assert counters.comm_time_by_tag == {}
            halo = pending.wait()
            landed = EpochCounters(**{k: _copy(v) for k, v in vars(counters).items()})
            # A second wait returns the same rows and records nothing more.
            assert pending.wait() is halo
            assert counters == landed
            out["train"] = halo.numpy()
            out["comm_time"] = np.array(counters.comm_time_s)
            out["tag_time"] = np.array(counters.comm_time_by_tag["layer1/forward"])
            out["span"] = np.array(counters.exchange_span_by_tag["layer1/forward"])
            out["arrived"] = np.array(counters.exchange_arrived_at_by_tag["layer1/forward"])
            out["done"] = np.array(counters.exchange_done_at_by_tag["layer1/forward"])
            out["wait"] = np.array(counters.comm_wait_by_tag["layer1/forward"])

            # Backward: the halo rows' gradients go back to their owners.
            grads = _rows(rank, sum(RECV_COUNTS[rank]), salt=3)
            out["grad"] = policy.start(bwd, grads).wait().numpy()
        out["bytes"] = np.array(counters.halo_bytes_per_epoch)
        out["bytes_bwd"] = np.array(counters.bytes_by_tag["layer1/backward"])
        out["bits"] = np.array(counters.bits_histogram[32])
        assert policy.end_epoch(3) == 0.0
        policy.close()
        return out
    finally:
        shutdown()


def _copy(value):
    return dict(value) if isinstance(value, dict) else value


@pytest.mark.distributed
def test_fresh_float32_exchange_between_two_ranks_is_exact_and_counted(tmp_path):
    results = run_workers(_policy_worker, 2, tmp_path, timeout=120.0)
    for rank, result in enumerate(results):
        peer = 1 - rank
        np.testing.assert_array_equal(
            result["eval"], _rows(peer, sum(SEND_COUNTS[peer]), salt=1).numpy()
        )
        np.testing.assert_array_equal(
            result["train"], _rows(peer, sum(SEND_COUNTS[peer]), salt=2).numpy()
        )
        np.testing.assert_array_equal(
            result["grad"], _rows(peer, sum(RECV_COUNTS[peer]), salt=3).numpy()
        )
        fwd_bytes = 4 * DIM * sum(SEND_COUNTS[rank])
        bwd_bytes = 4 * DIM * sum(RECV_COUNTS[rank])
        assert int(result["bytes"]) == fwd_bytes + bwd_bytes
        assert int(result["bytes_bwd"]) == bwd_bytes
        assert int(result["bits"]) == DIM * (sum(SEND_COUNTS[rank]) + sum(RECV_COUNTS[rank]))
        # The landing was recorded: a positive exchange time, the forward's (and the
        # backward's) share of it, and dates in order.
        assert float(result["tag_time"]) > 0
        assert float(result["comm_time"]) >= float(result["tag_time"])
        # No quantization: the span is the exchange time itself.
        assert float(result["span"]) == pytest.approx(float(result["tag_time"]))
        assert float(result["wait"]) >= 0
        assert 0 < float(result["arrived"]) <= float(result["done"])
