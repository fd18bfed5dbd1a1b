"""Helpers shared by the tests of adaqp.assign: random instances, an enumeration of group
widths, comparing assignments."""

from __future__ import annotations

import numpy as np

from adaqp.assign import (
    Assignment,
    Channel,
    LinkModel,
)


def _expand(channels, bits, combo, groups):
    """Per-channel message widths of one combination."""
    out = [np.zeros(ch.num_messages, dtype=int) for ch in channels]
    for k, (ci, idx) in zip(combo, groups, strict=True):
        out[ci][idx] = sorted(bits)[k]
    return out


def _random_instance(rng, num_channels, max_messages, num_ranks=4, dim=None):
    pairs = [(p, q) for p in range(num_ranks) for q in range(num_ranks) if p != q]
    chosen = sorted(rng.choice(len(pairs), num_channels, replace=False))
    channels = [
        Channel(
            *pairs[i], rng.gamma(0.7, 1.0, rng.integers(1, max_messages + 1)) * rng.uniform(1, 10)
        )
        for i in chosen
    ]
    shape = (num_ranks, num_ranks)
    lm = LinkModel(rng.uniform(1e-6, 1e-4, shape), rng.uniform(1e7, 1e9, shape))
    return channels, lm, int(dim or rng.choice([8, 30, 64]))


def _same_bits(a: Assignment, b: Assignment) -> bool:
    return len(a.bits) == len(b.bits) and all(map(np.array_equal, a.bits, b.bits))


def _objective_kw(channels, dim, model, bits, rng_or_index):
    """Solver keywords of one instance's objective, drawn by ``rng_or_index``: the
    reference width (a quantized width of ``bits``), the budget and an overlap window of
    0 to 2 times the reference plan's predicted time. Returns ``(kw, v_budget, t_scale)``
    (``t_scale``: what time gaps are measured against)."""
    quantized = [b for b in sorted(bits) if b != 32]
    if isinstance(rng_or_index, int):
        i = rng_or_index
        reference = quantized[i % len(quantized)]
        budget = (1.0, 0.5, 2.0, 1.0)[i % 4]
        frac = (0.0, 0.6, 1.3, 2.5, 0.9)[i % 5]
    else:
        rng = rng_or_index
        reference = int(rng.choice(quantized))
        budget = float(rng.choice([0.5, 1.0, 1.0, 2.0]))
        frac = float(rng.choice([0.0, 0.6, 1.0, 1.3, 2.5]))
    t_ref = model.exchange_time(
        channels, dim, [np.full(c.num_messages, reference) for c in channels]
    )
    w_sum = sum(float(c.weights.sum()) for c in channels)
    v_budget = budget * w_sum / (2.0**reference - 1.0) ** 2
    kw = dict(bits=bits, reference_bits=reference, budget=budget, window_s=frac * t_ref)
    return kw, v_budget, max(t_ref, frac * t_ref, 1e-12)


def _lex_optima(v, t, v_budget, window, t_scale, tol=0.5e-5):
    """Mask of the best combinations under the objective (``adaqp.assign.problem``): the
    least excess over ``v_budget``, then the least exposed time beyond ``window``, then
    the least variance, the first two within ``tol`` of their scale (``t_scale`` for
    times, the budget for variances: the solvers' scales; the default, the reach of the
    MILPs' caps into the solvers' tolerance, ``SLACK * REL_TOL``), the last within 1e-9
    of the budget; an independent restatement."""
    v_scale = v_budget if v_budget > 0 else max(float(np.max(v, initial=0.0)), 1.0)
    terms = (np.maximum(v - v_budget, 0.0), np.maximum(t - window, 0.0), v)
    ok = np.ones(v.shape, bool)
    tols = (tol * v_scale, tol * t_scale, 1e-9 * v_scale)  # the solvers' (VARIANCE_REL_TOL)
    for term, term_tol in zip(terms, tols, strict=True):
        ok &= term <= term[ok].min() + term_tol
    return ok


def _gap(res: Assignment, best: Assignment, v_budget: float, t_scale: float) -> float:
    """How far ``res`` is behind ``best`` in the objective, relative: its extra excess over
    the budget (over the budget), else its extra exposed time (over ``t_scale``), else its
    extra variance (over the budget); negative where it is ahead. Exposed times within
    the solvers' tolerance (1e-5 of ``t_scale``) are equal, so a plan that spends that
    much on less variance ties."""
    v_scale = v_budget if v_budget > 0 else max(best.variance, 1e-300)

    def excess(a):
        return max(a.variance - v_budget, 0.0) / v_scale

    if abs(excess(res) - excess(best)) > 1e-5:  # the solvers' tolerance (REL_TOL)
        return excess(res) - excess(best)
    if abs(res.exposed_s - best.exposed_s) > 1e-5 * t_scale:
        return (res.exposed_s - best.exposed_s) / t_scale
    if res.exposed_s > best.exposed_s and res.variance < best.variance:
        return 0.0  # less variance for exposed time within the tolerance: a tie
    return (res.variance - best.variance) / v_scale
