"""The planner's book of plans and traces (adaqp.exchange.plan_book)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaqp.exchange.plan_book import PlanBook
from adaqp.exchange.transport import Direction, ExchangeKey
from adaqp.quant import kernels as K


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
