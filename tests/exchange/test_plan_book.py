"""The planner's book of plans and traces (adaqp.exchange.plan_book)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaqp.config import CommConfig
from adaqp.exchange.adaptive import AdaptivePolicy
from adaqp.exchange.counters import EpochCounters
from adaqp.exchange.plan_book import PlanBook
from adaqp.exchange.transport import BitPlan, Direction, ExchangeKey, HaloTransport
from adaqp.quant import kernels as K
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import run_workers


@pytest.mark.parametrize("kernels, compiled_calls", [("torch", 0), ("compiled", 1)])
def test_traces_take_the_quantizers_path_not_the_process_default(
    kernels, compiled_calls, monkeypatch
):
    """A run's ``quant.kernels`` holds for its traces too, whatever the process default."""
    if not K.compiled_available():
        pytest.skip(f"numba cannot run here: {K.compiled_module()}")
    calls = []
    module = K.compiled_module()
    original = module.squared_ranges
    monkeypatch.setattr(module, "squared_ranges", lambda *a: calls.append(1) or original(*a))
    previous = K.set_kernels("torch" if kernels == "compiled" else "compiled")
    try:
        counts = {d: np.zeros((2, 2), dtype=np.int64) for d in Direction}
        book = PlanBook(counts, rank=0, device=torch.device("cpu"), kernels=kernels)
        rows = torch.randn(5, 3)
        book.trace(ExchangeKey(0, Direction.FORWARD), rows)
    finally:
        K.set_kernels(previous)
    assert len(calls) == compiled_calls
    expected = ((rows.amax(1) - rows.amin(1)).double() ** 2).numpy()
    np.testing.assert_array_equal(book.traces[ExchangeKey(0, Direction.FORWARD)][0], expected)


class _TracingPlanner:
    """What ``AdaptivePolicy`` asks of its planner, at one width for every row."""

    tracing = True

    def __init__(self, bits: int):
        self.bits, self.traced = bits, []

    def plan(self, key, out_rows, in_rows, dim):
        return BitPlan.uniform(self.bits, out_rows, in_rows, torch.device("cpu"))

    def trace(self, key, rows_RD, squared=None):
        self.traced.append(None if squared is None else squared.clone())


def _traced_worker(rank: int, world_size: int, init_method: str, bits: int, kernels: str):
    init_distributed(CommConfig(timeout_s=60, device="cpu"), init_method, rank, world_size)
    try:
        sends = [[0, 6], [4, 0]][rank]
        transport = HaloTransport(rank, sends, [[0, 4], [6, 0]][rank], seed=1, kernels=kernels)
        planner = _TracingPlanner(bits)
        policy = AdaptivePolicy(transport, planner)
        rows = torch.randn(sum(sends), 11, generator=torch.Generator().manual_seed(rank)) * 50
        policy.begin_epoch(1, EpochCounters())
        with policy.training():
            policy.start(ExchangeKey.forward(1), rows).wait()
        (squared,) = planner.traced
        return {
            "squared": np.zeros(0) if squared is None else squared.numpy(),
            "given": np.array(squared is not None),
            "reference": K.squared_ranges(rows, "torch").numpy(),
        }
    finally:
        shutdown()


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("bits", "kernels", "given"),
    [(2, "compiled", True), (32, "compiled", False), (2, "torch", False)],
)
def test_a_training_exchange_traces_the_quantizers_own_ranges(tmp_path, bits, kernels, given):
    """No pass of the trace's own where the quantizer takes the rows' minima and maxima
    (the compiled path, no float32 rows): it hands the planner the same bits. Elsewhere the
    planner is handed nothing and takes its pass (``PlanBook.trace``)."""
    if kernels == "compiled" and not K.compiled_available():
        pytest.skip(f"numba cannot run here: {K.compiled_module()}")
    for r in run_workers(_traced_worker, 2, tmp_path, bits, kernels):
        assert bool(r["given"]) == given
        if given:
            np.testing.assert_array_equal(r["squared"], r["reference"])
