"""Calibrating the cost model against measured exchanges.

The cost model prices an exchange from the profiled links; what it does not see (the
fixed cost of a collective among busy processes, a slower rate than the probes saw) is
measured: each re-solve fits ``fixed_t + scale * model`` to the exchange times measured
under the last ``CALIBRATION_PLANS`` plans (:func:`fit_calibration`; one scale, a fixed
cost per exchange ``t``), and states the new plans' times through it. An affine map
with fixed costs changes no choice between plans; it turns the model's figures into
seconds that can be checked.
"""

from __future__ import annotations

import numpy as np

CALIBRATION_PLANS = 3
"""Plans whose measured exchanges a calibration is fitted on: the last few, so that it
follows a host that slows down without chasing one noisy cycle."""


def _fit_affine(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(fixed, scale)``, both >= 0, minimising the relative error of ``fixed + scale * x``
    against ``y`` (all ``y > 0``)."""
    rows = np.stack([np.ones_like(x), x], axis=1) / y[:, None]  # relative residuals
    candidates = []
    if x.size > 1 and np.ptp(x) > 0:
        fixed, scale = np.linalg.lstsq(rows, np.ones_like(y), rcond=None)[0]
        candidates.append((float(fixed), float(scale)))
    # One parameter: the scale alone, or the fixed cost alone.
    candidates.append((0.0, float(rows[:, 1].sum() / (rows[:, 1] @ rows[:, 1]))))
    candidates.append((float(rows[:, 0].sum() / (rows[:, 0] @ rows[:, 0])), 0.0))
    feasible = [(f, s) for f, s in candidates if f >= 0 and s >= 0]

    def error(c: tuple[float, float]) -> float:
        return float(np.sum((rows @ np.array(c) - 1.0) ** 2))

    return min(feasible, key=error)


def fit_calibration(
    plans: list[tuple[dict[str, float], dict[str, float]]],
) -> dict[str, float | dict[str, float]]:
    """The calibration of the cost model from ``(predicted, measured)`` seconds by tag,
    one pair per plan that ran.

    Returns ``{"fixed_s", "scale", "fixed_s_by_tag"}``, all >= 0: a plan's time for
    exchange ``t`` is ``fixed_s_by_tag[t] + scale * predicted[t]`` (``fixed_s``, the
    median of the exchanges' fixed costs, for one not measured yet). The scale comes
    from ``fixed + scale * predicted`` fitted over every measured exchange (relative
    least squares): exchanges of different sizes identify it, where one exchange's
    few plans, often nearly alike, would not. Each exchange's fixed cost is then the
    median over the plans of what the scaled model leaves unexplained in it: small
    exchanges cost mostly a fixed time that differs between them (the first backward
    exchange meets ranks as they leave the loss), which one shared fixed cost misses.
    """
    points = [(t, x[t], y[t]) for x, y in plans for t in sorted(x) if t in y and y[t] > 0]
    if not points:
        return {"fixed_s": 0.0, "scale": 1.0, "fixed_s_by_tag": {}}
    x = np.array([p[1] for p in points])
    y = np.array([p[2] for p in points])
    scale = _fit_affine(x, y)[1]
    left: dict[str, list[float]] = {}
    for tag, xt, yt in points:
        left.setdefault(tag, []).append(yt - scale * xt)
    by_tag = {t: max(0.0, float(np.median(r))) for t, r in sorted(left.items())}
    return {
        "fixed_s": float(np.median(list(by_tag.values()))),
        "scale": scale,
        "fixed_s_by_tag": by_tag,
    }
