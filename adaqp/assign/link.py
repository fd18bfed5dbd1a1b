"""Solvers under the link model (``LinkProblem``): exact MILP, greedy, brute force, polish.

Each channel's time is its own ``alpha + bytes / beta``, so the solvers work per channel:
the greedy fills each channel's budget under a common cap on ``T``, the MILP bounds every
channel's time by one continuous variable. What each method does, and how
:func:`~adaqp.assign.solve.solve_assignment` combines them, is in :mod:`adaqp.assign.solve`.
Under the shared and sender cost models the channels are merged first
(:mod:`adaqp.assign.kinds`) and solved here as one link each.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from adaqp.assign.problem import MILP_COST_SCALE, POLISH_MOVES, LinkProblem, two_stages


def link_polish(p: LinkProblem, k: np.ndarray, deadline: float) -> np.ndarray:
    """Single-group moves, the best strict improvement of the objective first; then moves
    that save bytes and leave every term of the objective as it is."""
    k = k.copy()
    nbytes = p.channel_bytes(k)
    beta_g = p.beta[p.chan][:, None]
    v, anchor = p.variance(k), None
    for _ in range(min(4 * k.size * p.bits.size + 10, POLISH_MOVES)):
        if time.perf_counter() > deadline:
            break
        t = np.where(p.nonempty, p.alpha + nbytes / p.beta, 0.0)
        top = int(np.argmax(t))
        t_other = np.full(t.size, t[top])  # exchange time without each channel
        t_other[top] = np.delete(t, top).max(initial=0.0)
        db = p.n[:, None] * (p.r[None, :] - p.r[k][:, None])  # [G, K]
        new_t = np.maximum(t[p.chan][:, None] + db / beta_g, t_other[p.chan][:, None])
        new_v = v + p.w[:, None] * (p.f[None, :] - p.f[k][:, None])
        anchor = p.anchored(anchor, v, t[top])
        best = p.best_index(new_v, new_t, among=p.better(new_v, new_t, v, t[top], anchor))
        if best < 0:
            tie = p.no_worse(new_v, new_t, v, t[top], anchor) & (db < 0)
            if not tie.any():
                break
            best = int(np.argmax(tie))
        g, j = divmod(best, p.bits.size)
        nbytes[p.chan[g]] += db[g, j]
        v = float(new_v[g, j])
        k[g] = j
    return k


def link_greedy(p: LinkProblem, time_limit_s: float | None = None) -> np.ndarray:
    """Best over time caps of per-channel knapsack greedy fills (see :mod:`adaqp.assign.solve`).

    ``time_limit_s`` is not used (the fill takes no iterations worth bounding); it is
    accepted so that both models' greedy solvers share one signature.
    """
    # Step s upgrades a group from width index s to s + 1. For every subset of SUPPORTED_BITS and
    # every dim, variance saved per extra byte falls from one step to the next (the factor drops
    # ~4x per bit, bytes grow linearly), so filling by efficiency takes a group's steps in order.
    steps = p.bits.size - 1
    k0 = np.zeros(p.w.size, np.int64)
    dr, df = np.diff(p.r), np.diff(p.f)  # [steps]
    t0 = p.times(k0)
    t_low = float(t0.max(initial=0.0))
    per_channel, caps = [], [np.array([t_low, p.window])]
    for c in np.flatnonzero(p.nonempty):
        groups = np.flatnonzero(p.chan == c)
        g = np.repeat(groups, steps)
        s = np.tile(np.arange(steps), groups.size)
        # Variance saved per byte; a step that costs no bytes is free and always taken first.
        eff = np.where(dr[s] > 0, -df[s] / np.maximum(dr[s], 1) * p.w[g] / p.n[g], np.inf)
        order = np.lexsort((s, g, -eff))  # best efficiency first; ties by group, then step
        g = g[order]
        cum_t = t0[c] + np.concatenate([[0.0], np.cumsum(p.n[g] * dr[s[order]] / p.beta[c])])
        cum_v = np.concatenate([[0.0], np.cumsum(p.w[g] * df[s[order]])])
        per_channel.append((g, cum_t, cum_v))
        caps.append(cum_t)
    caps = np.unique(np.concatenate(caps))
    caps = caps[caps >= t_low]
    dv, t_act = np.zeros(caps.size), np.zeros(caps.size)
    taken = []
    for _g, cum_t, cum_v in per_channel:
        idx = np.searchsorted(cum_t, caps, side="right") - 1
        dv += cum_v[idx]
        t_act = np.maximum(t_act, cum_t[idx])
        taken.append(idx)
    best = p.best_index(p.variance(k0) + dv, t_act)  # the first best: the smallest cap
    steps_taken = np.zeros(p.w.size, np.int64)
    for (g, _, _), idx in zip(per_channel, taken, strict=True):
        np.add.at(steps_taken, g[: idx[best]], 1)
    return steps_taken


def _link_stage(
    p: LinkProblem, cap_s: float | None, time_limit_s: float
) -> tuple[np.ndarray | None, str]:
    """One stage of the exact solve: ``cap_s`` None minimises ``T`` within the variance
    budget (the least variance where none meets it); else it minimises ``V`` with ``T``
    at most ``cap_s``, within the same budget."""
    G, K1 = p.w.size, p.bits.size - 1
    nv = G * K1 + 1  # y[g, k-1] at g*K1 + k-1, then tau (T over the time scale)
    var = np.arange(G * K1).reshape(G, K1)
    dv = (p.w[:, None] * np.diff(p.f)[None, :]).ravel() / p.v_scale  # V's change per y
    cost = np.zeros(nv)
    if cap_s is None:
        cost[-1] = 1.0
    else:
        cost[: G * K1] = dv
    # Chain rows y[g, k+1] - y[g, k] <= 0, so that the y's of a group encode one width.
    chain = var[:, 1:].ravel()
    r = np.arange(chain.size)
    rows, cols, vals = [r, r], [chain, var[:, :-1].ravel()], [np.ones(r.size), -np.ones(r.size)]
    ub = [np.zeros(r.size)]
    # Channel time over the time scale: sum_gk a_gk y_gk - tau <= -t_c(0) / ts.
    ts, t0 = p.t_scale, p.times(np.zeros(G, np.int64))
    coef = p.n[:, None] * np.diff(p.r)[None, :] / p.beta[p.chan][:, None] / ts
    chans = np.arange(p.num_channels)
    rows += [chain.size + np.repeat(p.chan, K1), chain.size + chans]
    cols += [var.ravel(), np.full(chans.size, nv - 1)]
    vals += [coef.ravel(), np.where(p.nonempty, -1.0, 0.0)]
    ub.append(np.where(p.nonempty, -t0 / ts, 0.0))
    # The variance budget (where it is reachable; else just above the least variance).
    v_cap = p.v_cap
    rows.append(np.full(G * K1, chain.size + p.num_channels))
    cols.append(np.arange(G * K1))
    vals.append(dv)
    ub.append([(v_cap - p.variance(np.zeros(G, np.int64))) / p.v_scale])
    ub = np.concatenate(ub)
    shape = (ub.size, nv)
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape)
    cons = [LinearConstraint(a.tocsr(), -np.inf, ub)]
    integrality = np.ones(nv)
    integrality[-1] = 0
    tau_max = np.inf if cap_s is None else cap_s / ts
    res = milp(
        cost * MILP_COST_SCALE,
        integrality=integrality,
        bounds=Bounds(np.zeros(nv), np.r_[np.ones(nv - 1), tau_max]),
        constraints=cons,
        options={"time_limit": float(time_limit_s), "mip_rel_gap": 0.0, "presolve": False},
    )
    failed = "time_limit" if res.status == 1 else f"milp_failed_{res.status}"
    if res.x is None:
        return None, failed + "_no_solution"
    k = (res.x[: G * K1].reshape(G, K1) > 0.5).sum(axis=1).astype(np.int64)
    return k, "optimal" if res.status == 0 else failed


def link_milp(p: LinkProblem, time_limit_s: float) -> tuple[np.ndarray | None, str]:
    """Exact solve in two stages (:mod:`adaqp.assign.solve`); returns ``(group widths or
    None, status)``."""
    return two_stages(p, _link_stage, time_limit_s)


def link_brute(p: LinkProblem, max_combos: int) -> np.ndarray:
    """Exhaustive search (:meth:`Groups.exhaustive`) under the link model."""

    def times(k: np.ndarray) -> np.ndarray:
        nbytes = np.zeros((k.shape[0], p.num_channels))
        np.add.at(nbytes.T, p.chan, (p.n[None, :] * p.r[k]).T)
        return np.where(p.nonempty, p.alpha + nbytes / p.beta, 0.0).max(axis=1, initial=0.0)

    return p.exhaustive(max_combos, 1 << 16, times)
