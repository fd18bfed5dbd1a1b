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
  checked. The same class estimates each exchange's overlap window (:meth:`MeasuredExchanges.
  window_s`), which the solver's objective needs: only the time beyond it is exposed.
"""

from __future__ import annotations

import math
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
    the calibration fitted to them, and the overlap windows they show (module docstring)."""

    def __init__(self) -> None:
        self.measured: dict[str, list[float]] = {}
        """Measured exchange seconds by tag, one per epoch since the last re-solve."""
        self.waits: dict[str, list[float]] = {}
        """Seconds the ranks were held up by each exchange (launch and wait, the part the
        overlap did not hide; mean over ranks), one per epoch since the last re-solve."""
        self.ran: list[tuple[dict[str, float], dict[str, float]]] = []
        """``(predicted, measured median)`` seconds by tag of the last plans that ran,
        oldest first (at most ``CALIBRATION_PLANS``)."""

    def record(self, exchange_s_by_tag: dict[str, float], wait_s_by_tag: dict[str, float]) -> None:
        """One epoch's measured exchange times and waits (the same on every rank)."""
        for tag, seconds in exchange_s_by_tag.items():
            self.measured.setdefault(tag, []).append(seconds)
        for tag, seconds in wait_s_by_tag.items():
            self.waits.setdefault(tag, []).append(seconds)

    def restart(self) -> None:
        """A re-solve has used this cycle's measurements: the next cycle starts empty."""
        self.measured, self.waits = {}, {}

    def fit(self, before: dict[str, float]) -> dict | None:
        """Adds the plans that ran since the last re-solve (``before``: their predicted
        seconds by tag) to the calibration's history and refits it; None without history."""
        measured = {t: float(np.median(self.measured[t])) for t in before if self.measured.get(t)}
        if measured:
            self.ran.append((before, measured))
            del self.ran[:-CALIBRATION_PLANS]
        return fit_calibration(self.ran) if self.ran else None

    @staticmethod
    def state(solution: dict, calibration: dict | None) -> None:
        """States this re-solve's plans (``solution["predicted_s"]``) through
        ``calibration``, into ``solution``."""
        if calibration is None:
            return
        fixed, scale = calibration["fixed_s_by_tag"], calibration["scale"]
        solution["calibration"] = calibration
        solution["calibrated_s"] = {
            t: fixed.get(t, calibration["fixed_s"]) + scale * s
            for t, s in solution.get("predicted_s", {}).items()
        }

    def window_s(self, tag: str, ran_s: float | None, calibration: dict | None) -> float:
        """The overlap window of exchange ``tag`` in the cost model's seconds, from the
        plan that ran (``ran_s``: its predicted seconds) and this cycle's waits.

        The model predicts ``ran_s``; the ranks waited ``wait`` (the median over the
        cycle, in the model's seconds through the calibration's scale) of it, so the
        window hid ``ran_s - wait``: exact where the exchange was exposed (``wait > 0``),
        a lower bound where it was hidden whole (a longer window would show no more). A
        lower bound errs on the safe side: time beyond it counts as exposed. 0 where
        nothing is known (no plan's prediction, no wait measured, as after a resume)."""
        waits = self.waits.get(tag)
        if ran_s is None or not waits or not math.isfinite(ran_s):
            return 0.0
        scale = calibration["scale"] if calibration and calibration["scale"] > 0 else 1.0
        return max(0.0, ran_s - float(np.median(waits)) / scale)
