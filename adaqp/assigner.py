"""Bit-width assignment for halo messages: trade quantization variance against exchange time.

An exchange (one layer, one direction) is a set of channels ``p -> q`` that run concurrently.
Message ``v`` quantized to ``b`` bits adds variance ``w_v / (2**b - 1)**2`` to its receiver's
aggregation and costs ``message_bytes(1, D, b)`` bytes (packed codes + float32 min/max). A channel
takes ``alpha_pq + bytes_pq / beta_pq`` seconds (0 when it carries nothing) and the exchange takes
as long as its slowest channel, ``T``. With ``V`` the total variance we minimise::

    lam * (V - V_min) / (V_max - V_min) + (1 - lam) * (T - T_min) / (T_max - T_min)

``V_min``/``T_max`` are at all-max bits, ``V_max``/``T_min`` at all-min bits; a zero range zeroes
its term. Each channel's messages are sorted by weight (heaviest first, stable) and cut into
groups of ``group_size``; each group gets one width.

Solvers (:func:`solve_assignment`):

* ``"milp"``: exact, HiGHS through :func:`scipy.optimize.milp`. Width of group ``g`` is encoded
  incrementally, ``y[g, k] = [width index >= k]`` for ``k = 1..K-1`` with ``y[g, k] >= y[g, k+1]``
  (equivalent to one-hot ``x[g, b] = y[g, b] - y[g, b+1]`` with ``sum_b x[g, b] = 1``). A
  continuous ``tau = (T - T_min) / (T_max - T_min) >= 0`` bounds every channel's time. On a time
  limit the better of HiGHS's incumbent and the greedy is used. HiGHS does not check its clock
  inside every root-node heuristic: from ~10k groups it overruns the limit by up to ~0.5 s, and
  once (20k groups, 2 s limit) took 6 s. Such models rarely finish anyway (the gap is ~1e-5), so
  use the greedy for them, or a group size that keeps groups to a few thousand.
* ``"greedy"``: for every candidate time cap, each channel independently fills its budget with
  width upgrades in order of variance decrease per byte (a multiple-choice knapsack greedy); the
  best cap wins.
* ``"brute"``: enumerates all combinations (refused above ``max_combos``); for tests.

MILP and greedy results are then polished by single-group moves (strict improvements first, then
moves that save bytes without raising the objective, e.g. for zero-weight messages), and each
channel's full-size groups are sorted to non-increasing widths, which keeps bytes and cannot raise
variance: ties between equal weights go to the earlier messages.

Determinism: identical inputs give identical results on one software stack, except when the MILP
hits its time limit (where it stops depends on machine speed): compute on one rank and broadcast.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp, nnls
from scipy.sparse import coo_matrix

from adaqp.quant import SUPPORTED_BITS, message_bytes

__all__ = [
    "DEFAULT_BITS",
    "Assignment",
    "Channel",
    "LinkModel",
    "evaluate_assignment",
    "fit_alpha_beta",
    "random_assignment",
    "solve_assignment",
    "uniform_assignment",
]

logger = logging.getLogger(__name__)

DEFAULT_BITS: tuple[int, ...] = (2, 4, 8)
_TOL = 1e-12  # objective is normalised to O(1); smaller differences are treated as ties
# HiGHS stops at an absolute gap of 1e-6 (not settable through scipy): scaling the O(1) objective
# makes that 1e-10 in our units, so "optimal" matches brute force to 1e-9.
_MILP_COST_SCALE = 1e4


@dataclass(frozen=True, eq=False)
class LinkModel:
    """Per-pair alpha-beta cost model; only off-diagonal entries are used.

    Attributes:
        alpha_s: float64 ``[P, P]`` start-up latency of ``p -> q`` in seconds (>= 0).
        beta_Bps: float64 ``[P, P]`` bandwidth of ``p -> q`` in bytes per second (> 0).
    """

    alpha_s: np.ndarray
    beta_Bps: np.ndarray

    def __post_init__(self) -> None:
        alpha = np.array(self.alpha_s, dtype=np.float64)
        beta = np.array(self.beta_Bps, dtype=np.float64)
        if alpha.ndim != 2 or alpha.shape[0] != alpha.shape[1] or beta.shape != alpha.shape:
            raise ValueError(f"alpha/beta must both be [P, P]; got {alpha.shape}, {beta.shape}")
        off = ~np.eye(alpha.shape[0], dtype=bool)
        if not (np.all(np.isfinite(alpha[off])) and np.all(alpha[off] >= 0)):
            raise ValueError("alpha_s must be finite and non-negative off the diagonal")
        if not (np.all(np.isfinite(beta[off])) and np.all(beta[off] > 0)):
            raise ValueError("beta_Bps must be finite and positive off the diagonal")
        alpha.flags.writeable = beta.flags.writeable = False
        object.__setattr__(self, "alpha_s", alpha)
        object.__setattr__(self, "beta_Bps", beta)

    @classmethod
    def uniform(cls, num_ranks: int, alpha_s: float, beta_Bps: float) -> LinkModel:
        """Same ``alpha``/``beta`` for every pair of ``num_ranks`` ranks."""
        shape = (num_ranks, num_ranks)
        return cls(np.full(shape, float(alpha_s)), np.full(shape, float(beta_Bps)))

    @property
    def num_ranks(self) -> int:
        return self.alpha_s.shape[0]

    def time(self, src: int, dst: int, nbytes: float) -> float:
        """Predicted seconds to send ``nbytes`` from ``src`` to ``dst``; 0 for an empty send."""
        if src == dst:
            raise ValueError("no link from a rank to itself")
        if nbytes <= 0:
            return 0.0
        return float(self.alpha_s[src, dst] + nbytes / self.beta_Bps[src, dst])


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Relative least-squares fit of ``time = alpha + size / beta`` with ``alpha >= 0``.

    Residuals are divided by the measured time: timing noise grows with the transfer, and an
    unweighted fit would let the largest sizes swamp the latency.

    Args:
        sizes_bytes: ``[n]`` transfer sizes (repeats allowed); at least two distinct values.
        times_s: ``[n]`` measured seconds, all positive.

    Returns:
        ``(alpha_s, beta_Bps)``.

    Raises:
        ValueError: mismatched or non-finite data, negative sizes, non-positive times, fewer than
            two distinct sizes, or times that do not grow with size (no positive bandwidth fits).
    """
    s = np.asarray(sizes_bytes, dtype=np.float64).ravel()
    t = np.asarray(times_s, dtype=np.float64).ravel()
    if s.shape != t.shape:
        raise ValueError(f"{s.size} sizes but {t.size} times")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))) or np.any(s < 0) or np.any(t <= 0):
        raise ValueError("sizes must be finite and >= 0, times finite and > 0")
    if np.unique(s).size < 2:
        raise ValueError("need at least two distinct transfer sizes to separate alpha from beta")
    # Columns scaled to O(1) for conditioning; NNLS keeps alpha and 1/beta non-negative.
    scale = float(s.max())
    design = np.column_stack([np.ones_like(s), s / scale]) / t[:, None]
    (alpha, inv_beta_scaled), _ = nnls(design, np.ones_like(t))
    inv_beta = inv_beta_scaled / scale
    if not inv_beta > 0:
        raise ValueError("transfer times do not increase with size; cannot fit a bandwidth")
    return float(alpha), float(1.0 / inv_beta)


@dataclass(frozen=True, eq=False)
class Channel:
    """Messages from rank ``src`` to rank ``dst`` in one exchange.

    Attributes:
        src: sending rank.
        dst: receiving rank (``!= src``).
        weights: float64 ``[n]`` variance weights ``w_v >= 0``, in the channel's message order.
    """

    src: int
    dst: int
    weights: np.ndarray

    def __post_init__(self) -> None:
        w = np.array(self.weights, dtype=np.float64)
        if w.ndim != 1 or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("weights must be a 1-D array of finite non-negative values")
        if self.src == self.dst or min(self.src, self.dst) < 0:
            raise ValueError(f"invalid channel {self.src} -> {self.dst}")
        w.flags.writeable = False
        object.__setattr__(self, "weights", w)

    @property
    def num_messages(self) -> int:
        return int(self.weights.size)


@dataclass(frozen=True, eq=False)
class Assignment:
    """Per-message bit widths of one exchange and their predicted cost.

    Attributes:
        channels: the channels, in the caller's order.
        dim: embedding width ``D``.
        bits: per channel, int8 ``[n_c]`` widths in the channel's original message order.
        objective: normalised objective (NaN when no link model/lambda was given).
        variance: total variance ``V``.
        time_s: predicted exchange time ``T`` (NaN without a link model).
        status: how the result was obtained, e.g. ``"optimal"``, ``"time_limit"``.
        solve_time_s: wall time spent choosing the widths.
        method: ``"milp"``, ``"greedy"``, ``"brute"``, ``"uniform"`` or ``"random"``.
    """

    channels: tuple[Channel, ...]
    dim: int
    bits: tuple[np.ndarray, ...]
    objective: float
    variance: float
    time_s: float
    status: str
    solve_time_s: float
    method: str

    @property
    def avg_bits(self) -> float:
        """Message-weighted mean width (NaN when there are no messages)."""
        total = sum(b.size for b in self.bits)
        weighted = sum(int(b.sum(dtype=np.int64)) for b in self.bits)
        return weighted / total if total else math.nan

    @property
    def bytes_per_channel(self) -> np.ndarray:
        """int64 ``[C]`` wire bytes of each channel."""
        table = _row_bytes_table(self.dim)
        return np.array([int(table[b].sum()) for b in self.bits], dtype=np.int64)


def _check_bits(bits: Sequence[int]) -> np.ndarray:
    arr = np.unique(np.asarray(bits, dtype=np.int64))
    if arr.size == 0 or any(int(b) not in SUPPORTED_BITS for b in arr):
        raise ValueError(f"bit widths must be a non-empty subset of {SUPPORTED_BITS}, got {bits}")
    return arr


def _row_bytes_table(dim: int) -> np.ndarray:
    """int64 ``[9]``: entry ``b`` is the wire bytes of one row at ``b`` bits (0 if unsupported)."""
    table = np.zeros(9, dtype=np.int64)
    for b in SUPPORTED_BITS:
        table[b] = message_bytes(1, dim, b)
    return table


def _check_channels(channels: Sequence[Channel], link_model: LinkModel | None) -> None:
    pairs = [(c.src, c.dst) for c in channels]
    if len(set(pairs)) != len(pairs):
        raise ValueError("each (src, dst) pair may appear in only one channel")
    if link_model is not None and any(max(p) >= link_model.num_ranks for p in pairs):
        raise ValueError(f"channel rank outside the link model's {link_model.num_ranks} ranks")


def evaluate_assignment(
    channels: Sequence[Channel],
    dim: int,
    message_bits: Sequence[np.ndarray],
    link_model: LinkModel | None,
    *,
    bits: Sequence[int] = DEFAULT_BITS,
    lam: float = 0.5,
) -> tuple[float, float, float]:
    """``(objective, V, T)`` of per-message widths; ``bits`` sets the normalisation range.

    Objective and ``T`` are NaN without a link model.
    """
    allowed = _check_bits(bits)
    table = _row_bytes_table(dim)
    message_bits = [np.asarray(b, dtype=np.int64) for b in message_bits]
    if len(message_bits) != len(channels) or any(
        b.shape != (c.num_messages,) or not np.isin(b, SUPPORTED_BITS).all()
        for c, b in zip(channels, message_bits, strict=True)
    ):
        raise ValueError("need one array of supported widths per channel, one per message")
    lo, hi = int(allowed[0]), int(allowed[-1])
    f = np.zeros(9)
    f[1:] = 1.0 / (2.0 ** np.arange(1, 9) - 1.0) ** 2  # f[0] is never indexed
    var = sum(float(np.sum(c.weights * f[b])) for c, b in zip(channels, message_bits, strict=True))
    w_sum = sum(float(np.sum(c.weights)) for c in channels)
    if link_model is None:
        return math.nan, var, math.nan

    def exchange_time(widths: Sequence[np.ndarray]) -> float:
        pairs = zip(channels, widths, strict=True)
        return max(
            (link_model.time(c.src, c.dst, int(table[b].sum())) for c, b in pairs), default=0.0
        )

    t = exchange_time(message_bits)
    t_min = exchange_time([np.full(c.num_messages, lo) for c in channels])
    t_max = exchange_time([np.full(c.num_messages, hi) for c in channels])
    v_min, v_max = w_sum * f[hi], w_sum * f[lo]
    obj = lam * (var - v_min) / (v_max - v_min) if v_max > v_min else 0.0
    obj += (1.0 - lam) * (t - t_min) / (t_max - t_min) if t_max > t_min else 0.0
    return float(obj), var, t


class _Problem:
    """A grouped instance as flat arrays over its ``G`` groups (a channel's groups are contiguous).

    Width choices are indices ``k`` into ``self.bits`` (``[K]``, ascending).
    """

    def __init__(
        self,
        channels: Sequence[Channel],
        dim: int,
        link_model: LinkModel,
        bits: Sequence[int],
        group_size: int,
        lam: float,
    ) -> None:
        self.bits = _check_bits(bits)
        self.f = 1.0 / (2.0**self.bits - 1.0) ** 2  # [K] variance factor per unit weight
        self.r = _row_bytes_table(dim)[self.bits]  # [K] bytes per row
        self.alpha = np.array([link_model.alpha_s[c.src, c.dst] for c in channels], np.float64)
        self.beta = np.array([link_model.beta_Bps[c.src, c.dst] for c in channels], np.float64)
        self.nonempty = np.array([c.num_messages > 0 for c in channels], dtype=bool)
        self.orders, chan, n, w = [], [], [], []
        for ci, c in enumerate(channels):
            order = np.argsort(-c.weights, kind="stable")  # stable: equal weights keep their order
            self.orders.append(order)
            starts = np.arange(0, c.num_messages, group_size)
            if starts.size:
                w.append(np.add.reduceat(c.weights[order], starts))
                n.append(np.diff(np.append(starts, c.num_messages)))
                chan.append(np.full(starts.size, ci))

        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        self.w, self.n, self.chan = cat(w, np.float64), cat(n, np.int64), cat(chan, np.int64)
        self.full = self.n == group_size
        self.group_size, self.num_channels = group_size, len(channels)
        self.t_min = float(self.times(np.zeros(self.w.size, np.int64)).max(initial=0.0))
        self.t_max = float(self.times(np.full(self.w.size, self.bits.size - 1)).max(initial=0.0))
        self.v_max, self.v_min = self.w.sum() * self.f[0], self.w.sum() * self.f[-1]
        # Objective weights per unit of V and T; zero when that range is empty.
        self.wv = lam / (self.v_max - self.v_min) if self.v_max > self.v_min else 0.0
        self.wt = (1.0 - lam) / (self.t_max - self.t_min) if self.t_max > self.t_min else 0.0

    def channel_bytes(self, k: np.ndarray) -> np.ndarray:
        return np.bincount(self.chan, self.n * self.r[k], self.num_channels)

    def times(self, k: np.ndarray) -> np.ndarray:
        """float64 ``[C]`` channel times for group widths ``k`` ``[G]``."""
        return np.where(self.nonempty, self.alpha + self.channel_bytes(k) / self.beta, 0.0)

    def objective(self, k: np.ndarray) -> float:
        v = float(np.sum(self.w * self.f[k]))
        t = float(self.times(k).max(initial=0.0))
        return self.wv * (v - self.v_min) + self.wt * (t - self.t_min)

    def message_bits(self, k: np.ndarray) -> tuple[np.ndarray, ...]:
        """Group widths ``k`` ``[G]`` -> per channel int8 ``[n_c]`` in original message order."""
        out, first = [], 0
        for order in self.orders:
            b = np.empty(order.size, dtype=np.int8)
            b[order] = self.bits[k[first + np.arange(order.size) // self.group_size]]
            out.append(b)
            first += -(-order.size // self.group_size)
        return tuple(out)


def _polish(p: _Problem, k: np.ndarray, deadline: float) -> np.ndarray:
    """Steepest-descent single-group moves; then byte-saving moves that keep the objective."""
    k = k.copy()
    nbytes = p.channel_bytes(k)
    beta_g = p.beta[p.chan][:, None]
    for _ in range(4 * k.size * p.bits.size + 10):
        if time.perf_counter() > deadline:
            break
        t = np.where(p.nonempty, p.alpha + nbytes / p.beta, 0.0)
        top = int(np.argmax(t))
        t_other = np.full(t.size, t[top])  # exchange time without each channel
        t_other[top] = np.delete(t, top).max(initial=0.0)
        db = p.n[:, None] * (p.r[None, :] - p.r[k][:, None])  # [G, K]
        new_t = np.maximum(t[p.chan][:, None] + db / beta_g, t_other[p.chan][:, None])
        dobj = p.wv * p.w[:, None] * (p.f[None, :] - p.f[k][:, None]) + p.wt * (new_t - t[top])
        best = int(np.argmin(dobj))
        if dobj.flat[best] >= -_TOL:
            tie = (dobj <= _TOL) & (db < 0)
            if not tie.any():
                break
            best = int(np.argmax(tie))
        g, j = divmod(best, p.bits.size)
        nbytes[p.chan[g]] += db[g, j]
        k[g] = j
    return k


def _sort_full_groups(p: _Problem, k: np.ndarray) -> np.ndarray:
    """Give each channel's full-size groups non-increasing widths, heaviest group first.

    Bytes are unchanged and variance cannot rise (heavier groups get the smaller factors), so
    this only canonicalises: equal-weight groups tie-break by message order.
    """
    k = k.copy()
    for c in range(p.num_channels):
        groups = np.flatnonzero((p.chan == c) & p.full)
        k[groups] = np.sort(k[groups])[::-1]
    return k


def _greedy(p: _Problem) -> np.ndarray:
    """Best over time caps of per-channel knapsack greedy fills (see module docstring)."""
    # Step s upgrades a group from width index s to s + 1. For every subset of SUPPORTED_BITS and
    # every dim, variance saved per extra byte falls from one step to the next (the factor drops
    # ~4x per bit, bytes grow linearly), so filling by efficiency takes a group's steps in order.
    steps = p.bits.size - 1
    k0 = np.zeros(p.w.size, np.int64)
    dr, df = np.diff(p.r), np.diff(p.f)  # [steps]
    t0 = p.times(k0)
    per_channel, caps = [], [np.array([p.t_min])]
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
    caps = caps[caps >= p.t_min]
    dv, t_act = np.zeros(caps.size), np.zeros(caps.size)
    taken = []
    for _g, cum_t, cum_v in per_channel:
        idx = np.searchsorted(cum_t, caps, side="right") - 1
        dv += cum_v[idx]
        t_act = np.maximum(t_act, cum_t[idx])
        taken.append(idx)
    obj = p.wv * dv + p.wt * (t_act - p.t_min)
    best = int(np.argmin(obj))  # first minimum: the smallest cap, i.e. fewest bytes
    steps_taken = np.zeros(p.w.size, np.int64)
    for (g, _, _), idx in zip(per_channel, taken, strict=True):
        np.add.at(steps_taken, g[: idx[best]], 1)
    return steps_taken


def _milp(p: _Problem, time_limit_s: float) -> tuple[np.ndarray | None, str]:
    """Exact solve; returns ``(group widths or None, status)``."""
    G, K1 = p.w.size, p.bits.size - 1
    nv = G * K1 + 1  # y[g, k-1] at g*K1 + k-1, then tau
    var = np.arange(G * K1).reshape(G, K1)
    cost = np.zeros(nv)
    cost[: G * K1] = (p.wv * p.w[:, None] * np.diff(p.f)[None, :]).ravel()
    cost[-1] = p.wt * (p.t_max - p.t_min)  # tau is already in units of T_max - T_min
    # Chain rows y[g, k+1] - y[g, k] <= 0, so that the y's of a group encode one width.
    chain = var[:, 1:].ravel()
    r = np.arange(chain.size)
    rows, cols, vals = [r, r], [chain, var[:, :-1].ravel()], [np.ones(r.size), -np.ones(r.size)]
    ub = [np.zeros(r.size)]
    if p.wt > 0:
        # Channel time in units of T_max - T_min: sum_gk a_gk y_gk - tau <= (T_min - t_c(0)) / dT.
        dt_range, t0 = p.t_max - p.t_min, p.times(np.zeros(G, np.int64))
        coef = p.n[:, None] * np.diff(p.r)[None, :] / p.beta[p.chan][:, None] / dt_range
        chans = np.arange(p.num_channels)
        rows += [chain.size + np.repeat(p.chan, K1), chain.size + chans]
        cols += [var.ravel(), np.full(chans.size, nv - 1)]
        vals += [coef.ravel(), np.where(p.nonempty, -1.0, 0.0)]
        ub.append(np.where(p.nonempty, (p.t_min - t0) / dt_range, 0.0))
    ub = np.concatenate(ub)
    shape = (ub.size, nv)
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape)
    cons = [LinearConstraint(a.tocsr(), -np.inf, ub)] if ub.size else []
    integrality = np.ones(nv)
    integrality[-1] = 0
    res = milp(
        cost * _MILP_COST_SCALE,
        integrality=integrality,
        bounds=Bounds(np.zeros(nv), np.r_[np.ones(nv - 1), np.inf]),
        constraints=cons,
        options={"time_limit": float(time_limit_s), "mip_rel_gap": 0.0, "presolve": False},
    )
    failed = "time_limit" if res.status == 1 else f"milp_failed_{res.status}"
    if res.x is None:
        return None, failed + "_no_solution"
    k = (res.x[: G * K1].reshape(G, K1) > 0.5).sum(axis=1).astype(np.int64)
    return k, "optimal" if res.status == 0 else failed


def _brute(p: _Problem, max_combos: int) -> np.ndarray:
    """Exhaustive search in lexicographic order (first group most significant); first minimum."""
    G, K = p.w.size, p.bits.size
    if max_combos < K**G:
        raise ValueError(f"brute force over {K}**{G} combinations exceeds {max_combos}")
    radix = K ** np.arange(G - 1, -1, -1, dtype=np.int64)
    best_obj, best_idx = math.inf, 0
    for start in range(0, K**G, 1 << 16):
        idx = np.arange(start, min(start + (1 << 16), K**G), dtype=np.int64)
        k = (idx[:, None] // radix[None, :]) % K  # [chunk, G]
        v = (p.w[None, :] * p.f[k]).sum(axis=1)
        nbytes = np.zeros((idx.size, p.num_channels))
        np.add.at(nbytes.T, p.chan, (p.n[None, :] * p.r[k]).T)
        t = np.where(p.nonempty, p.alpha + nbytes / p.beta, 0.0).max(axis=1, initial=0.0)
        obj = p.wv * (v - p.v_min) + p.wt * (t - p.t_min)
        i = int(np.argmin(obj))
        if obj[i] < best_obj:
            best_obj, best_idx = float(obj[i]), int(idx[i])
    return (best_idx // radix) % K


def solve_assignment(
    channels: Sequence[Channel],
    dim: int,
    link_model: LinkModel,
    *,
    bits: Sequence[int] = DEFAULT_BITS,
    group_size: int = 100,
    lam: float = 0.5,
    method: str = "milp",
    time_limit_s: float = 5.0,
    max_combos: int = 1_000_000,
    polish: bool = True,
) -> Assignment:
    """Choose one width per group of each channel (see module docstring for the model).

    Args:
        channels: the exchange's channels (distinct ``(src, dst)`` pairs).
        dim: embedding width ``D``.
        link_model: alpha-beta model covering every channel's ranks.
        bits: allowed widths, a subset of ``SUPPORTED_BITS``.
        group_size: messages per group after sorting by weight.
        lam: variance weight in ``[0, 1]``; 1 gives all max bits, 0 all min bits.
        method: ``"milp"``, ``"greedy"`` or ``"brute"``.
        time_limit_s: MILP time limit; on expiry the best solution found is used (greedy if none).
        max_combos: brute force refuses larger searches.
        polish: polish MILP/greedy results with local moves (off only to test raw solvers).
    """
    start = time.perf_counter()
    if method not in ("milp", "greedy", "brute"):
        raise ValueError(f"unknown method {method!r}")
    if not 0.0 <= lam <= 1.0 or group_size < 1 or dim < 1 or not time_limit_s > 0:
        raise ValueError("need 0 <= lam <= 1, group_size >= 1, dim >= 1 and time_limit_s > 0")
    channels = tuple(channels)
    _check_channels(channels, link_model)
    p = _Problem(channels, dim, link_model, bits, group_size, lam)
    G, K = p.w.size, p.bits.size
    if G == 0 or K == 1 or lam in (0.0, 1.0):
        k, status = np.full(G, K - 1 if lam == 1.0 else 0, np.int64), "trivial"
    elif method == "brute":
        k, status = _sort_full_groups(p, _brute(p, max_combos)), "optimal"
    else:
        if method == "greedy":
            k, status = _greedy(p), "heuristic"
        else:
            k, status = _milp(p, max(start + time_limit_s - time.perf_counter(), 1e-3))
            if status != "optimal":
                # The greedy is cheap: use it when the MILP has nothing, or something worse.
                k_greedy = _greedy(p)
                if k is None or p.objective(k_greedy) < p.objective(k):
                    logger.warning("MILP stopped (%s); using the greedy solution", status)
                    k, status = k_greedy, status + "_greedy"
        if polish:  # a short budget even after a timeout; a no-op on a true optimum
            k = _polish(p, k, max(start + time_limit_s, time.perf_counter() + 0.05))
        k = _sort_full_groups(p, k)
    message_bits = p.message_bits(k)
    obj, var, t = evaluate_assignment(channels, dim, message_bits, link_model, bits=bits, lam=lam)
    elapsed = time.perf_counter() - start
    logger.debug(
        "assigner %s: %s obj=%.6g V=%.6g T=%.6gs in %.3fs", method, status, obj, var, t, elapsed
    )
    return Assignment(channels, dim, message_bits, obj, var, t, status, elapsed, method)


def uniform_assignment(
    channels: Sequence[Channel],
    dim: int,
    width: int,
    *,
    link_model: LinkModel | None = None,
    bits: Sequence[int] = DEFAULT_BITS,
    lam: float = 0.5,
) -> Assignment:
    """Every message at ``width`` bits; cost evaluated against ``bits``' range when possible."""
    _check_bits([width])
    widths = [np.full(c.num_messages, width, np.int8) for c in channels]
    return _fixed(channels, dim, widths, link_model, bits, lam, "uniform")


def random_assignment(
    channels: Sequence[Channel],
    dim: int,
    bits_choices: Sequence[int],
    seed: int,
    *,
    link_model: LinkModel | None = None,
    lam: float = 0.5,
) -> Assignment:
    """Each message at a width drawn uniformly from ``bits_choices`` (seeded, channel order)."""
    choices = _check_bits(bits_choices).astype(np.int8)
    rng = np.random.default_rng(seed)
    widths = [rng.choice(choices, size=c.num_messages) for c in channels]
    return _fixed(channels, dim, widths, link_model, tuple(choices), lam, "random")


def _fixed(
    channels: Sequence[Channel],
    dim: int,
    widths: list[np.ndarray],
    link_model: LinkModel | None,
    bits: Sequence[int],
    lam: float,
    method: str,
) -> Assignment:
    start = time.perf_counter()
    channels = tuple(channels)
    _check_channels(channels, link_model)
    obj, var, t = evaluate_assignment(channels, dim, widths, link_model, bits=bits, lam=lam)
    elapsed = time.perf_counter() - start
    return Assignment(channels, dim, tuple(widths), obj, var, t, method, elapsed, method)
