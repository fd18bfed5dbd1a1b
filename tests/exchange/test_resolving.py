"""When the planner re-solves, how long each solve may take, and the overlap window the
measured exchanges show (``adaqp/exchange/resolving.py``)."""

from __future__ import annotations

import pytest

from adaqp.config import ConfigError, QuantConfig
from adaqp.exchange import resolving


def test_the_window_is_what_the_wait_leaves_of_the_plan_that_ran():
    measured = resolving.MeasuredExchanges()
    for wait in (0.004, 0.003, 0.005):  # the median, 4 ms, of a 10 ms exchange
        measured.record({"layer1/forward": 0.010}, {"layer1/forward": wait, "layer2/forward": 0.0})
    assert measured.window_s("layer1/forward", 0.010, None) == pytest.approx(0.006)
    # Through the calibration: measured seconds are twice the model's.
    calibration = {"scale": 2.0, "fixed_s": 0.0, "fixed_s_by_tag": {}}
    assert measured.window_s("layer1/forward", 0.010, calibration) == pytest.approx(0.008)
    # Hidden whole: the plan's time is a lower bound. Nothing known: no window.
    assert measured.window_s("layer2/forward", 0.010, None) == 0.010
    assert measured.window_s("layer1/forward", None, None) == 0.0
    assert measured.window_s("layer3/forward", 0.010, None) == 0.0
    measured.restart()
    assert measured.window_s("layer1/forward", 0.010, None) == 0.0


def test_a_re_solve_shares_its_budget_among_its_exchanges(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(resolving.time, "perf_counter", lambda: now[0])
    deadline, limits = now[0] + 1.0, []
    for left in (4, 3, 2, 1):  # each solve runs to its limit
        limits.append(resolving.budget_share(deadline, left, cap_s=1.0))
        now[0] += limits[-1]
    assert limits == pytest.approx([0.25] * 4) and now[0] == pytest.approx(deadline)
    # Past the deadline every exchange still gets the least time (the greedy's); a share
    # never exceeds the per-exchange cap.
    assert resolving.budget_share(deadline, 3, cap_s=1.0) == resolving.MIN_SOLVE_S
    assert resolving.budget_share(now[0] + 10.0, 2, cap_s=1.0) == 1.0


def test_the_first_solve_comes_after_the_first_cycle():
    def solved(first_cycle: int, assign_cycle: int, epochs: int = 70) -> dict[int, int]:
        config = QuantConfig(first_cycle=first_cycle, assign_cycle=assign_cycle)
        after = {e: resolving.solves_before(e, config) for e in range(1, epochs + 1)}
        return {e: n for e, n in after.items() if n is not None}

    # The defaults: traced for 5 epochs at the first width, then every 20.
    assert solved(5, 20) == {5: 0, 25: 1, 45: 2, 65: 3}
    # A first cycle as long as the others (or longer): every assign_cycle from the start.
    assert solved(20, 20) == solved(30, 20) == {20: 0, 40: 1, 60: 2}
    assert solved(5, 2, epochs=7) == {2: 0, 4: 1, 6: 2}
    with pytest.raises(ConfigError, match="quant.first_cycle"):
        QuantConfig(first_cycle=0)
