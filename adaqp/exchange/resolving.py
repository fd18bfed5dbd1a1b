"""When the bit-width planner re-solves, how long each solve may take, and what the
plans that ran teach the next re-solve.

- :func:`solves_before`: the schedule. The first solve follows the first cycle
  (``quant.first_cycle`` epochs), the later ones every ``quant.assign_cycle`` epochs.
- :func:`budget_share`: rank 0 solves a re-solve's exchanges one after another while the
  other ranks wait for the widths, so the pause between epochs is the sum of its solves;
  one budget (``quant.resolve_budget_s``) bounds them all.
- :class:`MeasuredExchanges`: the cost model prices an exchange from the profiled links;
  what it does not see (the fixed cost of a collective among busy processes, a slower
  rate than the probes saw) is measured. Each re-solve fits ``fixed_t + scale * model``
  to the exchange times measured under the last ``CALIBRATION_PLANS`` plans
  (:func:`~adaqp.assign.calibrate.fit_calibration`; one scale, a fixed cost per exchange
  ``t``) and states the new plans' times through it. An affine map with fixed costs
  changes no choice between plans; it turns the model's figures into seconds that can be
  checked.
"""

from __future__ import annotations

import time

import numpy as np

from adaqp.assign import CALIBRATION_PLANS, fit_calibration
from adaqp.config import QuantConfig

MIN_SOLVE_S = 0.05
"""The least time one exchange's solve is given, even past its re-solve's budget: enough
for the greedy (a few hundredths of a second at planner sizes), so that a spent budget
costs plan quality by at most the greedy's gap, not a fall-back to uniform widths."""


def budget_share(deadline: float, keys_left: int, cap_s: float) -> float:
    """Seconds the next of ``keys_left`` exchanges may solve for: an equal share of what is
    left until ``deadline`` (a ``time.perf_counter()`` value), at most ``cap_s``, at least
    :data:`MIN_SOLVE_S`."""
    left = deadline - time.perf_counter()
    return min(cap_s, max(left / max(keys_left, 1), MIN_SOLVE_S))


def solves_before(epoch: int, config: QuantConfig) -> int | None:
    """How many solves ran before the one after ``epoch``, or None where none runs after
    it: the first follows epoch ``first_cycle`` (at most ``assign_cycle``), the later ones
    every ``assign_cycle`` epochs."""
    first = min(config.first_cycle, config.assign_cycle)
    if epoch < first or (epoch - first) % config.assign_cycle:
        return None
    return (epoch - first) // config.assign_cycle


class MeasuredExchanges:
    """Rank 0, where a cost model plans: the exchanges measured under the plans that ran,
    and the calibration fitted to them (module docstring)."""

    def __init__(self) -> None:
        self.measured: dict[str, list[float]] = {}
        """Measured exchange seconds by tag, one per epoch since the last re-solve."""
        self.ran: list[tuple[dict[str, float], dict[str, float]]] = []
        """``(predicted, measured median)`` seconds by tag of the last plans that ran,
        oldest first (at most ``CALIBRATION_PLANS``)."""

    def record(self, exchange_s_by_tag: dict[str, float]) -> None:
        """One epoch's measured exchange times (the same on every rank)."""
        for tag, seconds in exchange_s_by_tag.items():
            self.measured.setdefault(tag, []).append(seconds)

    def restart(self) -> None:
        """A re-solve has used this cycle's measurements: the next cycle starts empty."""
        self.measured = {}

    def calibrate(self, solution: dict, before: dict[str, float]) -> None:
        """Adds the plans that ran since the last re-solve (``before``: their predicted
        seconds by tag) to the calibration's history, refits it, and states this
        re-solve's plans (``solution["predicted_s"]``) through it, into ``solution``."""
        measured = {t: float(np.median(self.measured[t])) for t in before if self.measured.get(t)}
        if measured:
            self.ran.append((before, measured))
            del self.ran[:-CALIBRATION_PLANS]
        if not self.ran:
            return
        calibration = fit_calibration(self.ran)
        fixed, scale = calibration["fixed_s_by_tag"], calibration["scale"]
        solution["calibration"] = calibration
        solution["calibrated_s"] = {
            t: fixed.get(t, calibration["fixed_s"]) + scale * s
            for t, s in solution.get("predicted_s", {}).items()
        }
