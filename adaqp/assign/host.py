"""Solvers under the host model (``HostProblem``): exact MILP, its LP relaxation
rounded, the capped hull fills, brute force, polish.

A message loads several resources at once (its hosts' NICs, its ranks, the fabric), so
the host solvers track every resource's use: the MILP bounds each host's ``N_h + C_h``
(and the fabric's ``F + C_h``), the greedy rounds the MILP's LP relaxation or, without
one, fills each group's lower convex hull of (priced seconds, variance) under caps on
``T``. What each method does, and how :func:`~adaqp.assign.solve.solve_assignment`
combines them, is in :mod:`adaqp.assign.solve`.
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix

from adaqp.assign.problem import MILP_COST_SCALE, POLISH_MOVES, SLACK, HostProblem, two_stages


def host_polish(p: HostProblem, k: np.ndarray, deadline: float) -> np.ndarray:
    """:func:`~adaqp.assign.link.link_polish` under the host model; ties must lower the seconds
    the group takes on the hosts' resources (the fabric's seconds repeat the bytes on the NICs)."""
    k = k.copy()
    groups = np.arange(k.size)
    use, v, anchor = p.use(k), p.variance(k), None
    for _ in range(min(4 * k.size * p.bits.size + 10, POLISH_MOVES)):
        if time.perf_counter() > deadline:
            break
        delta = p.unit - p.unit[groups, k][:, None, :]  # [G, K, R] use change of each move
        t = p.alpha + p.model.host_and_fabric_times(use).max()
        new_t = p.alpha + p.model.host_and_fabric_times(use + delta).max(axis=-1)  # [G, K]
        new_v = v + p.w[:, None] * (p.f[None, :] - p.f[k][:, None])
        anchor = p.anchored(anchor, v, t)
        best = p.best_index(new_v, new_t, among=p.better(new_v, new_t, v, t, anchor))
        if best < 0:
            tie = p.no_worse(new_v, new_t, v, t, anchor) & (delta[..., :-1].sum(axis=-1) < 0)
            if not tie.any():
                break
            best = int(np.argmax(tie))
        g, j = divmod(best, p.bits.size)
        use = use + delta[g, j]
        v = float(new_v[g, j])
        k[g] = j
    return k


def _hull(cost: np.ndarray, f: np.ndarray) -> list[int]:
    """Width indices along the lower convex hull of ``(cost, f)`` points ``[K]``.

    Starts at the cheapest (least ``f`` on ties); each step raises ``cost`` and lowers ``f``,
    with falling ``-df / dcost``, so a greedy by that ratio takes a group's steps in order.
    """
    cur = int(np.lexsort((f, cost))[0])
    chain = [cur]
    while True:
        better = np.flatnonzero((cost > cost[cur]) & (f < f[cur]))
        if better.size == 0:
            return chain
        slope = (f[cur] - f[better]) / (cost[better] - cost[cur])
        cur = int(better[np.lexsort((cost[better], -slope))[0]])  # steepest, then cheapest
        chain.append(cur)


_SLACK_PRICE = 0.1  # relative price of a resource that does not set T (see _host_prices)


def _host_prices(p: HostProblem, k: np.ndarray) -> np.ndarray:
    """float64 ``[R]`` price per second of each resource, from where ``T`` is set at ``k``.

    A resource costs 1 where it sets its host's time (the busier NIC direction, the slowest
    rank) on a host within 1% of ``T``, or is the fabric, or the slowest rank, with the
    fabric's time within 1% of ``T`` (both without ``alpha``), and ``_SLACK_PRICE``
    elsewhere: growing it barely moves ``T``.
    """
    H, use = p.model.num_hosts, p.use(k)
    times = p.model.host_and_fabric_times(use)  # [H + 1]: the fabric's last
    net = np.maximum(use[:H], use[H : 2 * H])
    busiest_rank = np.zeros(H)
    np.maximum.at(busiest_rank, p.model.host_of_rank, use[2 * H : -1])
    tight = np.r_[
        use[:H] >= 0.99 * net,
        use[H : 2 * H] >= 0.99 * net,
        use[2 * H : -1] >= 0.99 * busiest_rank[p.model.host_of_rank],
        True,
    ]
    owner = np.r_[np.arange(H), np.arange(H), p.model.host_of_rank, H]  # index into times
    tight &= times[owner] >= 0.99 * times.max()
    if math.isfinite(p.model.fabric_Bps) and times[-1] >= 0.99 * times.max():
        # The fabric's time includes the slowest rank's.
        ranks = use[2 * H : -1]
        tight[2 * H : -1] |= ranks >= 0.99 * ranks.max()
    return np.where(tight, 1.0, _SLACK_PRICE)


def _host_fill(p: HostProblem, price: np.ndarray, num_caps: int) -> list[np.ndarray]:
    """Group widths of capped hull fills under resource prices ``price`` ``[R]``, one per cap.

    Each group starts at its cheapest width and climbs the lower convex hull of its (priced
    seconds, variance) options; upgrades are taken in order of variance saved per priced
    second while every host and the fabric stay within the cap. Caps span the base's ``T`` to
    the top of every hull, then a finer grid around the best of them.
    """
    G, H, R = p.w.size, p.model.num_hosts, p.model.num_resources
    fabric = math.isfinite(p.model.fabric_Bps)
    # [C, K] priced seconds per row. The fabric's are added after the hosts' are summed, so that
    # an infinite fabric (zero seconds) rounds nothing differently from a model without one.
    cost = p.row_use[..., :-1] @ price[:-1] + p.row_use[..., -1] * price[-1]
    chains = [_hull(cost[c], p.f) for c in range(p.num_channels)]
    depth = max(len(ch) for ch in chains)
    chain_k = np.array([ch + ch[-1:] * (depth - len(ch)) for ch in chains], np.int64)  # [C, L]
    steps = np.array([len(ch) - 1 for ch in chains])[p.chan] * (p.w > 0)  # zero weight: none
    sg = np.repeat(np.arange(G), steps)  # upgrade i moves group sg[i] from chain position sj[i]
    sj = np.arange(sg.size) - np.repeat(np.cumsum(steps) - steps, steps)
    sc = p.chan[sg]
    a, b = chain_k[sc, sj], chain_k[sc, sj + 1]
    eff = p.w[sg] * (p.f[a] - p.f[b]) / np.maximum(p.n[sg] * (cost[sc, b] - cost[sc, a]), 1e-300)
    order = np.lexsort((sj, sg, -eff))  # best variance saved per priced second first
    # The columns that set the times of each channel's hosts and of the fabric: per host its
    # send and receive NIC, then its ranks; then the fabric. reduceat at `starts` gives each
    # host's busier NIC and slowest rank, then the fabric's use.
    cols, starts = [], []
    for c in p.channels:
        hosts = sorted({int(p.model.host_of_rank[c.src]), int(p.model.host_of_rank[c.dst])})
        parts = [np.r_[h, H + h, 2 * H + np.flatnonzero(p.model.host_of_rank == h)] for h in hosts]
        offsets = np.cumsum([0] + [x.size for x in parts])
        cols.append(np.r_[np.concatenate(parts), R - 1])
        starts.append(np.sort(np.r_[offsets[:-1], offsets[:-1] + 2, offsets[-1]]))
    base = chain_k[p.chan, 0]

    ranks = slice(2 * H, R - 1)
    is_rank = [(x >= 2 * H) & (x < R - 1) for x in cols]

    def fill(caps: np.ndarray) -> list[np.ndarray]:
        limit = caps - p.alpha + 1e-12 * np.abs(caps)
        use = np.tile(p.use(base), (caps.size, 1))
        pos = np.zeros((caps.size, G), np.int64)
        for i in order:
            g = sg[i]
            ok = pos[:, g] == sj[i]
            if not ok.any():
                continue
            x = cols[sc[i]]
            delta = p.unit[g, b[i], x] - p.unit[g, a[i], x]
            moved = use[:, x] + delta
            parts = np.maximum.reduceat(moved, starts[sc[i]], axis=1)
            ok &= (parts[:, :-1:2] + parts[:, 1:-1:2] <= limit[:, None]).all(axis=1)
            if fabric:  # its time: its use plus the slowest rank's, with this move
                slowest = np.maximum(
                    use[:, ranks].max(axis=1), moved[:, is_rank[sc[i]]].max(axis=1)
                )
                ok &= parts[:, -1] + slowest <= limit
            use[:, x] += ok[:, None] * delta
            pos[:, g] += ok
        return [chain_k[p.chan, row] for row in pos]

    top = chain_k[p.chan, steps]
    t_base = p.time(base)
    top_t = max(t_base, p.time(top), p.t_reference)
    caps = np.r_[np.linspace(t_base, top_t, num_caps), p.window, np.inf]
    order = np.argsort(caps, kind="stable")
    caps = caps[order]
    fills = fill(caps)
    i = p.best_index([p.variance(k) for k in fills], [p.time(k) for k in fills])
    if np.isfinite(caps[i]):
        lo, hi = caps[max(i - 1, 0)], caps[min(i + 1, caps.size - 2)]
        fills += fill(np.linspace(lo, hi, num_caps))
    return [base, *fills]


def host_greedy(p: HostProblem, time_limit_s: float | None, num_caps: int = 32) -> np.ndarray:
    """The heuristic of :mod:`adaqp.assign.solve`: the LP relaxation rounded, else capped fills.

    Candidates are the uniform assignments and both stages' LP solutions rounded down, to
    nearest and up (up keeps the first stage's within the variance budget); the best wins.
    Without an LP solution (HiGHS failed within ``RELAXATION_MAX_ITER`` iterations, or
    within ``time_limit_s`` where one is given: the MILP's fallback) they are the capped
    fills of :func:`_host_fill`, priced first by every
    resource second alike, then by where the best so far sets ``T`` (:func:`_host_prices`).
    """
    candidates = [np.full(p.w.size, k, np.int64) for k in range(p.bits.size)]
    relaxed = _host_relaxation(p, time_limit_s)
    if relaxed is not None:
        for y in relaxed:  # down (faster), to nearest, up (within the variance budget)
            candidates += [((y > bound).sum(axis=1)) for bound in (1.0 - 1e-9, 0.5, 1e-9)]
    else:
        candidates += _host_fill(p, np.ones(p.model.num_resources), num_caps)
        best = p.pick(candidates)  # first best
        candidates += _host_fill(p, _host_prices(p, best), num_caps)
    return p.pick(candidates).astype(np.int64)


def _host_formulation(p: HostProblem, cap_s: float | None) -> tuple:
    """One stage of the MILP of :mod:`adaqp.assign.solve`: ``(cost, lower, upper, A, ub)``.

    ``cap_s`` None: the least ``T`` within the variance budget (the least variance where
    none meets it); else the least ``V`` with ``T`` at most ``cap_s``, within the budget.
    Variables are ``y`` (``[G, K-1]`` row-major), ``tau`` (``T`` over the time scale),
    ``N`` ``[H]``, ``C`` ``[H]``; the constraints are ``A @ x <= ub``. An infinite fabric
    gets no row: it never sets ``T``.
    """
    G, K1 = p.w.size, p.bits.size - 1
    H, R = p.model.num_hosts, p.model.num_resources - 1  # R: the hosts' resources
    ny = G * K1
    i_tau, i_net, i_cpu = ny, ny + 1, ny + 1 + H  # then tau, N_h [H], C_h [H]
    nv = ny + 1 + 2 * H
    var = np.arange(ny).reshape(G, K1)
    dv = (p.w[:, None] * np.diff(p.f)[None, :]).ravel() / p.v_scale  # V's change per y
    cost = np.zeros(nv)
    if cap_s is None:
        cost[i_tau] = 1.0
    else:
        cost[:ny] = dv
    chain = var[:, 1:].ravel()
    r = np.arange(chain.size)
    rows, cols, vals = [r, r], [chain, var[:, :-1].ravel()], [np.ones(r.size), -np.ones(r.size)]
    ub = [np.zeros(r.size)]
    first = chain.size  # the time rows start here
    ts = p.t_scale
    use0 = p.use(np.zeros(G, np.int64))  # [R + 1], the fabric's last
    step = p.unit[:, 1:, :] - p.unit[:, :-1, :]  # [G, K1, R + 1]
    # Resource rows: use(y) / ts <= N_h (NICs of h) or C_h (ranks on h).
    g, k, res = np.nonzero(step[..., :-1])
    owner = np.r_[i_net + np.arange(H), i_net + np.arange(H), i_cpu + p.model.host_of_rank]
    rows += [first + res, first + np.arange(R)]
    cols += [var[g, k], owner]
    vals += [step[g, k, res] / ts, -np.ones(R)]
    ub.append(-use0[:-1] / ts)
    # Host rows: alpha + ts * (N_h + C_h) <= ts * tau.
    hosts = first + R + np.arange(H)
    rows += [hosts, hosts, hosts]
    cols += [i_net + np.arange(H), i_cpu + np.arange(H), np.full(H, i_tau)]
    vals += [np.ones(H), np.ones(H), -np.ones(H)]
    ub.append(np.full(H, -p.alpha / ts))
    last = first + R + H
    if math.isfinite(p.model.fabric_Bps):
        # Fabric rows, one per host: alpha + ts * (F + C_h) <= ts * tau, with F = use(y)
        # of the fabric (so F plus the slowest rank's C).
        g, k = np.nonzero(step[..., -1])
        for h in range(H):
            rows.append(np.full(g.size + 2, last))
            cols.append(np.r_[var[g, k], i_cpu + h, i_tau])
            vals.append(np.r_[step[g, k, -1] / ts, 1.0, -1.0])
            ub.append([(-p.alpha - use0[-1]) / ts])
            last += 1
    # The variance budget (where it is reachable; else just above the least variance).
    v_cap = p.v_cap
    rows.append(np.full(ny, last))
    cols.append(np.arange(ny))
    vals.append(dv)
    ub.append([(v_cap - p.variance(np.zeros(G, np.int64))) / p.v_scale])
    ub = np.concatenate(ub)
    a = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), (ub.size, nv)
    )
    tau_max = np.inf if cap_s is None else cap_s / ts
    upper = np.r_[np.ones(ny), tau_max, np.full(2 * H, np.inf)]
    return cost * MILP_COST_SCALE, np.zeros(nv), upper, a.tocsr(), ub


def _host_stage(
    p: HostProblem, cap_s: float | None, time_limit_s: float
) -> tuple[np.ndarray | None, str]:
    """One stage of the exact solve (:func:`_host_formulation`)."""
    cost, lower, upper, a, ub = _host_formulation(p, cap_s)
    ny = p.w.size * (p.bits.size - 1)
    res = milp(
        cost,
        integrality=np.r_[np.ones(ny), np.zeros(cost.size - ny)],
        bounds=Bounds(lower, upper),
        constraints=[LinearConstraint(a, -np.inf, ub)] if ub.size else [],
        options={"time_limit": float(time_limit_s), "mip_rel_gap": 0.0, "presolve": False},
    )
    failed = "time_limit" if res.status == 1 else f"milp_failed_{res.status}"
    if res.x is None:
        return None, failed + "_no_solution"
    k = (res.x[:ny].reshape(p.w.size, -1) > 0.5).sum(axis=1).astype(np.int64)
    return k, "optimal" if res.status == 0 else failed


def host_milp(p: HostProblem, time_limit_s: float) -> tuple[np.ndarray | None, str]:
    """Exact solve under the host model, in two stages (:func:`~adaqp.assign.problem.
    two_stages`); returns ``(group widths or None, status)``."""
    return two_stages(p, _host_stage, time_limit_s)


RELAXATION_MAX_ITER = 100_000
"""Simplex iterations of each LP relaxation in the greedy: a bound that does not depend on
the machine's speed or load, so that the greedy's plan does not either."""


def _host_relaxation(p: HostProblem, time_limit_s: float | None) -> list[np.ndarray] | None:
    """The LP relaxations' ``y`` ``[G, K-1]`` in ``[0, 1]`` of both stages, the second
    capped at the first's relaxed ``T`` or the window, whichever is later (and ``SLACK`` of
    the tolerance, as :func:`~adaqp.assign.problem.two_stages`); None if HiGHS fails."""
    ny = p.w.size * (p.bits.size - 1)
    cap, out = None, []
    for _ in range(2):
        cost, lower, upper, a, ub = _host_formulation(p, cap)
        res = linprog(
            cost,
            A_ub=a,
            b_ub=ub,
            bounds=np.column_stack([lower, upper]),
            method="highs",
            options={"maxiter": RELAXATION_MAX_ITER}
            | ({} if time_limit_s is None else {"time_limit": float(time_limit_s) / 2}),
        )
        if res.status != 0:
            return None
        cap = max(float(res.x[ny]) * p.t_scale, p.window) + SLACK * p.tol_t
        out.append(res.x[:ny].reshape(p.w.size, -1))
    return out


def host_brute(p: HostProblem, max_combos: int) -> np.ndarray:
    """Exhaustive search (:meth:`Groups.exhaustive`) under the host model."""

    def times(k: np.ndarray) -> np.ndarray:
        use = np.zeros((k.shape[0], p.model.num_resources))
        for g in range(p.w.size):
            use += p.unit[g, k[:, g]]
        return p.alpha + p.model.host_and_fabric_times(use).max(axis=1)

    return p.exhaustive(max_combos, 1 << 14, times)
