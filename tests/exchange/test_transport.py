"""Halo exchange between real gloo workers: exact in float32, bounded when quantized."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from adaqp.config import CommConfig
from adaqp.exchange.transport import BitPlan, ExchangeKey, HaloTransport
from adaqp.quant import kernels as quant_kernels
from adaqp.quant.mixed import blend_, mixed_buffer_bytes
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import run_workers

ROWS = 12  # rows every rank sends every peer (uneven below)
DIM = 37


def _layout(rank: int, world_size: int):
    """Rank r sends rows r*7 + q ... to q; counts differ by pair so splits are uneven."""
    send_counts = [0 if q == rank else ROWS + rank + 2 * q for q in range(world_size)]
    recv_counts = [0 if p == rank else ROWS + p + 2 * rank for p in range(world_size)]
    send_idx = torch.cat([torch.arange(c) % 50 for c in send_counts]).long()
    return send_idx, send_counts, recv_counts


def _rows(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(50, DIM, generator=gen) * (rank + 1)


def _exchange_worker(rank: int, world_size: int, init_method: str, bits, kernels=None):
    init_distributed(CommConfig(timeout_s=60), init_method, rank, world_size)
    try:
        send_idx, send_counts, recv_counts = _layout(rank, world_size)
        transport = HaloTransport(
            rank, send_counts, recv_counts, timeout_s=60, seed=1, kernels=kernels
        )
        h = _rows(rank)
        if bits == "mixed":  # every third row of a segment at full precision, others 4, 2
            plan = BitPlan(_mixed_bits(send_counts), _mixed_bits(recv_counts))
        elif bits == "by-peer":  # rows to the next rank at full precision, others at 2
            plan = BitPlan(
                _peer_bits(send_counts, (rank + 1) % world_size),
                _peer_bits(recv_counts, (rank - 1) % world_size),
            )
        else:
            plan = BitPlan.uniform(bits, len(send_idx), sum(recv_counts), "cpu") if bits else None
        pending = transport.start(h[send_idx], ExchangeKey.forward(1), plan)
        halo = pending.wait()
        expected_bytes = sum(
            4 * c * DIM
            if bits == "by-peer" and q == (rank + 1) % world_size
            else mixed_buffer_bytes(torch.full((c,), 2, dtype=torch.int8), DIM)
            if bits == "by-peer"
            else _mixed_bytes(c)
            if bits == "mixed"
            else mixed_buffer_bytes(torch.full((c,), bits, dtype=torch.int8), DIM)
            if bits not in (0, 32)
            else 4 * c * DIM
            for q, c in enumerate(send_counts)
        )
        return {
            "halo": halo.numpy(),
            "copy_s": np.array(pending.quant_s + pending.dequant_s),
            "bytes": np.array(pending.bytes_sent),
            "expected_bytes": np.array(expected_bytes),
        }
    finally:
        shutdown()


def _mixed_bits(counts: list[int]) -> torch.Tensor:
    pattern = torch.tensor([32, 4, 2], dtype=torch.int8)
    return torch.cat([pattern[torch.arange(c) % 3] for c in counts])


def _peer_bits(counts: list[int], full_peer: int) -> torch.Tensor:
    return torch.cat(
        [
            torch.full((c,), 32 if q == full_peer else 2, dtype=torch.int8)
            for q, c in enumerate(counts)
        ]
    )


def _mixed_bytes(count: int) -> int:
    bits = _mixed_bits([count])
    full = bits == 32
    return mixed_buffer_bytes(bits[~full], DIM) + 4 * DIM * int(full.sum())


def _expected_halo(rank: int, world_size: int) -> np.ndarray:
    parts = []
    for p in range(world_size):
        if p == rank:
            continue
        send_idx, send_counts, _ = _layout(p, world_size)
        start = sum(send_counts[:rank])
        idx = send_idx[start : start + send_counts[rank]]
        parts.append(_rows(p)[idx].numpy())
    return np.concatenate(parts)


def test_the_quantizer_path_is_resolved_for_the_device():
    expected = "compiled" if quant_kernels.compiled_available() else "torch"  # on CPU
    assert HaloTransport(0, [0], [0], kernels="auto").kernels == expected
    assert HaloTransport(0, [0], [0], kernels="torch").kernels == "torch"
    with pytest.raises(ValueError, match="kernels must be one of"):
        HaloTransport(0, [0], [0], kernels="fast")


@pytest.mark.distributed
@pytest.mark.parametrize(
    "bits, kernels",
    [(0, None), (32, None), (8, None), (4, None), (2, None), ("mixed", None)]
    + [("by-peer", None), ("mixed", "torch")],
)
def test_exchange_exact_or_within_one_step(bits, kernels, tmp_path):
    """No plan (0), a plan at full precision everywhere (32), quantized, mixed within
    each peer's segment, and mixed by peer (one peer's whole segment at full precision,
    as between two ranks of one host); on the default path (compiled on CPU) and, mixed,
    on the torch path."""
    world_size = 3
    results = run_workers(_exchange_worker, world_size, tmp_path, bits, kernels)
    for rank, result in enumerate(results):
        expected = _expected_halo(rank, world_size)
        got = result["halo"]
        assert int(result["bytes"]) == int(result["expected_bytes"])
        if bits in (0, 32):
            np.testing.assert_array_equal(got, expected)
            # An all-float32 plan sends the rows as Vanilla does, without copying them
            # into a byte buffer and out again.
            assert float(result["copy_s"]) == 0.0
            continue
        if bits in ("mixed", "by-peer"):  # rows at 32 bits arrive exact, others within a step
            recv_counts = _layout(rank, world_size)[2]
            if bits == "mixed":
                widths = _mixed_bits([c for c in recv_counts if c]).numpy()
            else:
                widths = _peer_bits(recv_counts, (rank - 1) % world_size).numpy()
            np.testing.assert_array_equal(got[widths == 32], expected[widths == 32])
            assert np.abs(got[widths == 2] - expected[widths == 2]).max() > 0
            step = (expected.max(1) - expected.min(1)) / (2.0 ** np.maximum(widths, 1) - 1)
            assert (np.abs(got - expected) <= step[:, None] * (1 + 1e-5) + 1e-6).all()
            continue
        # Stochastic rounding moves each value by less than one step of its row.
        step = (expected.max(1) - expected.min(1)) / (2**bits - 1)
        err = np.abs(got - expected)
        assert (err <= step[:, None] * (1 + 1e-5) + 1e-6).all()
        assert (got >= expected.min(1, keepdims=True) - 1e-6).all()
        assert (got <= expected.max(1, keepdims=True) + 1e-6).all()
        # And the noise is real (the check above could not pass by accident at 2 bits).
        if bits == 2:
            assert err.mean() > 0.05 * step.mean()


def _uniform_transport(rank: int, world_size: int, bits: int):
    """This rank's transport over ``_layout``, a uniform plan of ``bits``, the send list."""
    send_idx, send_counts, recv_counts = _layout(rank, world_size)
    transport = HaloTransport(rank, send_counts, recv_counts, timeout_s=60, seed=1)
    plan = BitPlan.uniform(bits, len(send_idx), sum(recv_counts), "cpu")
    return transport, plan, send_idx, recv_counts


def _blend_worker(rank: int, world_size: int, init_method: str, bits: int):
    init_distributed(CommConfig(timeout_s=60), init_method, rank, world_size)
    try:
        transport, plan, send_idx, recv_counts = _uniform_transport(rank, world_size, bits)
        pending = transport.start(_rows(rank)[send_idx], ExchangeKey.forward(1), plan)
        average = torch.randn(sum(recv_counts), DIM, generator=torch.Generator().manual_seed(7))
        before = average.clone()
        assert pending.blend_into(average, 0.1) is average
        assert pending.waited
        rows = pending.wait()  # decoded again from the bytes kept
        return {"average": average.numpy(), "before": before.numpy(), "rows": rows.numpy()}
    finally:
        shutdown()


@pytest.mark.distributed
@pytest.mark.parametrize("bits", [1, 32])
def test_blend_into_folds_the_rows_into_an_average(bits, tmp_path):
    """``blend_into`` leaves in the average what ``blend_`` of the rows ``wait`` returns
    would (quantized rows decoded straight into it; float32 rows as they are), and the
    rows can still be waited for afterwards."""
    for rank, result in enumerate(run_workers(_blend_worker, 2, tmp_path, bits)):
        rows = torch.from_numpy(result["rows"])
        expected = blend_(torch.from_numpy(result["before"]), rows, 0.1)
        assert torch.equal(torch.from_numpy(result["average"]), expected)
        if bits == 32:
            np.testing.assert_array_equal(result["rows"], _expected_halo(rank, 2))


def _one_sided_worker(rank: int, world_size: int, init_method: str, bits: int):
    """Two ranks, each sending 6 rows to the other. Rank 0's training exchanges move its
    whole send list but read only halo rows 1, 3 and 4; rank 1 sends those and reads all
    6 (the one-sided selection that a whole-row count cannot tell from evaluation)."""
    init_distributed(CommConfig(timeout_s=60), init_method, rank, world_size)
    try:
        counts = [0, 6] if rank == 0 else [6, 0]
        send_idx = torch.arange(6)
        ids = np.arange(6) + 100 * rank
        transport = HaloTransport(
            rank,
            counts,
            counts,
            timeout_s=60,
            seed=1,
            send_idx=send_idx,
            send_ids=ids,
            halo_ids=ids[::-1].copy() + 100 * (1 - 2 * rank),
        )
        partial = np.array([1, 3, 4])
        send_keep, halo_keep = (np.arange(6), partial) if rank == 0 else (partial, np.arange(6))
        transport.select(1, send_keep, halo_keep, send_idx[send_keep])
        rows = _rows(rank)[:6]
        sent = rows[send_keep]
        plan = BitPlan.uniform(bits, 6, 6, "cpu") if bits != 32 else None
        out = {}
        for name, training, send in (("train", True, sent), ("eval", False, rows)):
            forward = transport.start(send, ExchangeKey.forward(1), plan, selected=training)
            out[f"{name}_forward"] = forward.wait().numpy()
            grads = torch.ones(len(halo_keep) if training else 6, DIM) * (rank + 1)
            backward = transport.start(grads, ExchangeKey.backward(1), plan, selected=training)
            out[f"{name}_backward"] = backward.wait().numpy()
        out["rows"] = rows.numpy()
        return out
    finally:
        shutdown()


@pytest.mark.distributed
@pytest.mark.parametrize("bits", [1, 32])
def test_a_training_exchange_full_in_one_direction_moves_its_selection(bits, tmp_path):
    """Whether an exchange moves its layer's selection is said, not inferred from its row
    count: rank 0 sends its whole send list in training while reading half its halo, and
    both ranks move the layer's selection; evaluation (``selected=False``) every row."""
    results = run_workers(_one_sided_worker, 2, tmp_path, bits)
    partial = [1, 3, 4]
    expected = {
        0: {"train_forward": results[1]["rows"][partial], "eval_forward": results[1]["rows"]},
        1: {"train_forward": results[0]["rows"], "eval_forward": results[0]["rows"]},
    }
    for rank, result in enumerate(results):
        for name, rows in expected[rank].items():
            assert result[name].shape == rows.shape, (rank, name)
            if bits == 32:
                np.testing.assert_array_equal(result[name], rows)
            else:  # one bit: each value is its row's minimum or maximum
                lo, hi = rows.min(1, keepdims=True), rows.max(1, keepdims=True)
                assert np.all(np.isclose(result[name], lo) | np.isclose(result[name], hi))
        peer = 1 - rank
        assert result["train_backward"].shape == (6 if rank == 0 else 3, DIM)
        assert result["eval_backward"].shape == (6, DIM)
        np.testing.assert_allclose(result["train_backward"], peer + 1)


def _release_worker(rank: int, world_size: int, init_method: str, bits: int):
    init_distributed(CommConfig(timeout_s=60), init_method, rank, world_size)
    try:
        transport, plan, send_idx, _ = _uniform_transport(rank, world_size, bits)
        rows = _rows(rank)[send_idx]
        sent = weakref.ref(rows)
        pending = transport.start(rows, ExchangeKey.forward(1), plan)
        del rows
        gc.collect()
        in_flight = sent() is not None  # before the exchange lands
        pending.wait()
        return {"alive_in_flight": np.array(in_flight)}
    finally:
        shutdown()


def test_a_quantized_exchange_lets_its_float_rows_go_once_encoded(tmp_path):
    """The rows sent are encoded at once: a quantized exchange keeps only the payload while
    it travels (its decoder once kept the float rows alive until it landed, an ``[S, D]``
    float32 tensor beside the landed rows)."""
    results = run_workers(_release_worker, 2, tmp_path, 2)
    assert [bool(result["alive_in_flight"]) for result in results] == [False, False]
