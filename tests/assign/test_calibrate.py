"""Calibrating the cost model against measured exchanges (adaqp.assign.calibrate)."""

from __future__ import annotations

import pytest

from adaqp.assign import fit_calibration


def _affine(plans):
    c = fit_calibration(plans)
    return c["fixed_s"], c["scale"]


def test_calibration_recovers_an_affine_relation_and_stays_non_negative():
    """One plan: one scale for all exchanges, fitted with one fixed cost."""
    predicted = {"a": 0.010, "b": 0.050, "c": 0.002}
    measured = {t: 0.020 + 1.5 * s for t, s in predicted.items()}
    c = fit_calibration([(predicted, measured)])
    assert c["scale"] == pytest.approx(1.5)
    assert c["fixed_s_by_tag"] == pytest.approx(dict.fromkeys(predicted, 0.020))
    # Measured falls as predicted rises: no negative scale, each exchange its own time.
    c = fit_calibration([({"a": 0.01, "b": 0.05}, {"a": 0.04, "b": 0.02})])
    assert c["scale"] == 0.0 and c["fixed_s_by_tag"] == pytest.approx({"a": 0.04, "b": 0.02})
    # Proportional, but a fitted fixed cost would be negative: the scale, nothing negative.
    c = fit_calibration([({"a": 0.01, "b": 0.05}, {"a": 0.001, "b": 0.1})])
    assert c["scale"] > 0 and min(c["fixed_s_by_tag"].values()) == 0.0
    # One tag: the ratio; nothing measured: the identity.
    assert _affine([({"a": 0.01}, {"a": 0.03})]) == pytest.approx((0.0, 3.0))
    assert fit_calibration([({"a": 0.01}, {})]) == {
        "fixed_s": 0.0,
        "scale": 1.0,
        "fixed_s_by_tag": {},
    }


def test_calibration_gives_each_exchange_its_fixed_cost_and_predicts_a_new_plan():
    """Two large exchanges and two small ones whose fixed costs differ (4 and 12 ms): one
    shared fixed cost misses the small backward one by a third; per exchange, the next
    plan's times follow from the two plans before it."""
    fixed = {"l1/fwd": 0.004, "l1/bwd": 0.004, "l2/fwd": 0.004, "l2/bwd": 0.012}

    def measured(predicted):
        return {t: fixed[t] + 1.5 * s for t, s in predicted.items()}

    plans = [
        {"l1/fwd": 0.050, "l1/bwd": 0.045, "l2/fwd": 0.003, "l2/bwd": 0.003},
        {"l1/fwd": 0.040, "l1/bwd": 0.042, "l2/fwd": 0.002, "l2/bwd": 0.002},
    ]
    c = fit_calibration([(x, measured(x)) for x in plans])
    assert c["scale"] == pytest.approx(1.5, rel=0.05)
    assert c["fixed_s_by_tag"] == pytest.approx(fixed, abs=2e-3)
    assert c["fixed_s_by_tag"]["l2/bwd"] == pytest.approx(0.012, abs=5e-4)
    new = {"l1/fwd": 0.030, "l1/bwd": 0.060, "l2/fwd": 0.004, "l2/bwd": 0.001}
    truth = measured(new)
    for t, s in new.items():
        assert c["fixed_s_by_tag"][t] + c["scale"] * s == pytest.approx(truth[t], rel=0.05)
    shared = c["fixed_s"] + c["scale"] * new["l2/bwd"]
    assert abs(shared / truth["l2/bwd"] - 1) > 0.3
    # Noise that leaves less than the scaled model: no negative fixed cost.
    low = fit_calibration([(x, {**measured(x), "l2/fwd": 1e-4}) for x in plans])
    assert low["fixed_s_by_tag"]["l2/fwd"] == 0.0 and low["scale"] > 0
