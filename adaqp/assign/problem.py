"""The assignment problem: the objective over a set of channels, and its grouped instances.

An exchange (one layer, one direction) is a set of channels ``p -> q`` that run concurrently.
Message ``v`` quantized to ``b`` bits adds variance ``w_v / (2**b - 1)**2`` to its receiver's
aggregation and costs ``message_bytes(1, D, b)`` bytes (packed codes + float32 min/max). Width
``FULL_PRECISION_BITS`` (32) sends the float32 row itself: ``4 * D`` bytes, no metadata, no
variance. With ``V`` the total variance, ``T`` the predicted exchange time and ``W`` the
exchange's overlap window (the local work that runs while it is in flight), the solvers
choose, in this order of priority:

1. ``V <= budget * V_u``, where ``V_u`` is the variance of the *reference* plan, every
   message at the uniform width ``u`` the run would otherwise send (``adaqp.quant.bits``,
   ``uniform_bits``, or ``quant.bits``), and ``budget`` is ``quant.variance_budget`` (1 by
   default). Where no plan meets it (a budget below what the widest width gives), the
   least ``V``;
2. the least *exposed* time ``E = max(0, T - W)``: what the window does not hide;
3. among plans with that ``E``, the least ``V``: time the window hides is spent on bits.

A lexicographic objective, with no weights and no normalisation: it reads the seconds and
the variance as they are, so a plan follows the absolute link speeds and the window, not
only their ratios (the min-max normalised weighted sum it replaced gave the same plan on
10 Mbit/s and 100 Gbit/s links). The reference plan is always a candidate
(:func:`~adaqp.assign.solve.solve_assignment` keeps it where a solver found nothing
better), and at a budget of 1 it meets step 1, so the chosen plan is predicted no slower
(``E`` no greater) and, at a budget of at most 1, no noisier than the reference.
Comparisons allow a relative tolerance (``REL_TOL``) in ``V`` and ``T``, so that float
rounding does not decide between plans that are equal. Each channel's messages are sorted
by weight (heaviest first, stable) and cut into groups of ``group_size``; each group gets
one width.

What lives here, shared by every solver: :class:`Assignment` (the result; the input, a
:class:`~adaqp.assign.channel.Channel` per pair, is defined in :mod:`adaqp.assign.channel`),
:func:`evaluate_assignment` (``(E, V, T)`` of any widths), the per-width tables of
variance, the groups and the objective's comparisons (``Groups``), the grouped instances
the solvers work on (``LinkProblem`` under the link model, ``HostProblem`` under the host
model), and the canonical order of a channel's group widths (``sort_full_groups``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from adaqp.assign.channel import Channel, row_bytes_table
from adaqp.assign.costmodels import CostModel, HostModel, LinkModel
from adaqp.quant.bits import BIT_WIDTHS, FULL_PRECISION_BITS, SUPPORTED_BITS

REL_TOL = 1e-5
"""Relative tolerance of the objective's first two terms: excesses over the budget within
``REL_TOL`` of the problem's variance scale, and times within ``REL_TOL`` of its time
scale, are equal (the third term then decides, then fewer bytes). HiGHS meets a MILP's
rows to about 1e-6 of their scale (its feasibility tolerance, not settable through
scipy's ``milp``): a tolerance below
that would rank a MILP's plan that exceeds its time cap or the variance budget by that
much below the plan it was capped by (the first stage's, or the reference)."""

VARIANCE_REL_TOL = 1e-9
"""Relative tolerance of the third term, the variance: a MILP minimises it as its
objective, not as a row, to HiGHS's gap (1e-10 of it, ``MILP_COST_SCALE``), so it can be
finer than ``REL_TOL``: an 8-bit group's variance is 1/65025 of a 1-bit group's, which
``REL_TOL`` of a budget at 1 or 2 bits would not tell from full precision's zero."""

SLACK = 0.5
"""How far into the tolerance a MILP's caps reach (the budget's, the second stage's on
``T``): far enough to find what the objective counts as equal, with room left for what
HiGHS may exceed a row by (about a tenth of ``REL_TOL``)."""

POLISH_MOVES = 2_000
"""At most this many single-group moves when polishing a solution (each move prices
every group's alternatives): a bound on the work, not on the clock, so that a greedy's
plan is the same on a loaded machine as on an idle one. Strict improvements come first
and are few; the rest are moves that only save bytes."""

MILP_COST_SCALE = 1e4
"""What the MILPs multiply their objective by. Each stage's objective is O(1) (a time over
the problem's time scale, a variance over its variance scale); HiGHS stops at an absolute
gap of 1e-6 (not settable through scipy), which scaled is 1e-10 of it, so "optimal"
matches brute force to 1e-9."""


@dataclass(frozen=True, eq=False)
class Assignment:
    """Per-message bit widths of one exchange and their predicted cost.

    Attributes:
        channels: the channels, in the caller's order.
        dim: embedding width ``D``.
        bits: per channel, int8 ``[n_c]`` widths in the channel's original message order.
        exposed_s: predicted exposed time ``E = max(0, T - W)`` (NaN without a cost model).
        variance: total variance ``V``.
        time_s: predicted exchange time ``T`` (NaN without a cost model).
        status: how the result was obtained, e.g. ``"optimal"``, ``"time_limit"``.
        solve_time_s: wall time spent choosing the widths.
        method: ``"milp"``, ``"greedy"``, ``"brute"``, ``"uniform"`` or ``"random"``.
    """

    channels: tuple[Channel, ...]
    dim: int
    bits: tuple[np.ndarray, ...]
    exposed_s: float
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
        table = row_bytes_table(self.dim)
        return np.array([int(table[b].sum()) for b in self.bits], dtype=np.int64)


def check_bits(bits: Sequence[int], full_precision: bool = True) -> np.ndarray:
    """The allowed widths as a sorted, duplicate-free int64 array ``[K]``.

    Raises:
        ValueError: ``bits`` is empty or holds a width outside ``BIT_WIDTHS`` (outside
            ``SUPPORTED_BITS`` when ``full_precision`` is False).
    """
    widths = BIT_WIDTHS if full_precision else SUPPORTED_BITS
    arr = np.unique(np.asarray(bits, dtype=np.int64))
    if arr.size == 0 or any(int(b) not in widths for b in arr):
        raise ValueError(f"bit widths must be a non-empty subset of {widths}, got {bits}")
    return arr


def variance_table() -> np.ndarray:
    """float64 ``[33]``: entry ``b`` is the variance per unit weight at ``b`` bits (0 at 32)."""
    f = np.zeros(FULL_PRECISION_BITS + 1)
    for b in SUPPORTED_BITS:
        f[b] = 1.0 / (2.0**b - 1.0) ** 2
    return f


def check_channels(channels: Sequence[Channel], link_model: CostModel | None) -> None:
    """Check that no ``(src, dst)`` pair repeats and that the cost model covers every rank.

    Raises:
        ValueError: a pair appears twice, or a rank is outside ``link_model``'s ranks.
    """
    pairs = [(c.src, c.dst) for c in channels]
    if len(set(pairs)) != len(pairs):
        raise ValueError("each (src, dst) pair may appear in only one channel")
    if link_model is not None and any(max(p) >= link_model.num_ranks for p in pairs):
        raise ValueError(f"channel rank outside the cost model's {link_model.num_ranks} ranks")


def evaluate_assignment(
    channels: Sequence[Channel],
    dim: int,
    message_bits: Sequence[np.ndarray],
    link_model: CostModel | None,
    *,
    window_s: float = 0.0,
) -> tuple[float, float, float]:
    """``(E, V, T)`` of per-message widths: the exposed time beyond the overlap window
    ``window_s``, the total variance and the predicted exchange time.

    ``E`` and ``T`` are NaN without a cost model. Under a :class:`HostModel`, ``T`` is
    the predicted exchange time to compare with a measured one.
    """
    message_bits = [np.asarray(b, dtype=np.int64) for b in message_bits]
    if len(message_bits) != len(channels) or any(
        b.shape != (c.num_messages,) or not np.isin(b, BIT_WIDTHS).all()
        for c, b in zip(channels, message_bits, strict=True)
    ):
        raise ValueError("need one array of supported widths per channel, one per message")
    f = variance_table()
    var = sum(float(np.sum(c.weights * f[b])) for c, b in zip(channels, message_bits, strict=True))
    if link_model is None:
        return math.nan, var, math.nan
    t = link_model.exchange_time(channels, dim, message_bits)
    return max(0.0, t - window_s), var, t


class Groups:
    """Channels cut into ``G`` groups, as flat arrays (a channel's groups are contiguous),
    and the objective's comparisons (module docstring).

    Width choices are indices ``k`` into ``self.bits`` (``[K]``, ascending), set by
    subclasses, which then call :meth:`_set_objective` and define ``time(k)``, the
    predicted ``T`` of group widths ``k`` ``[G]``.
    """

    bits: np.ndarray
    f: np.ndarray  # [K] variance factor per unit weight

    def __init__(self, channels: Sequence[Channel], group_size: int) -> None:
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
        self.group_size, self.channels = group_size, tuple(channels)
        self.num_channels = len(channels)

    def time(self, k: np.ndarray) -> float:
        """The predicted exchange time of plan ``k`` (a width index per group): each
        problem's cost model (``LinkProblem``, ``HostProblem``) gives it."""
        raise NotImplementedError

    def _set_objective(self, reference_bits: int, budget: float, window_s: float) -> None:
        """The objective's constants: the variance budget, the window, the reference plan
        (every group at ``reference_bits``, which must be one of ``self.bits``) and the
        scales of the comparisons' tolerances and of the MILPs' objectives."""
        if reference_bits not in self.bits:
            raise ValueError(f"the reference width {reference_bits} is not among {self.bits}")
        if not (budget > 0 and math.isfinite(budget)) or not window_s >= 0:
            raise ValueError(f"need a budget > 0 and a window >= 0, got {budget}, {window_s}")
        w_sum = float(self.w.sum())
        self.reference = int(np.searchsorted(self.bits, reference_bits))
        self.k_reference = np.full(self.w.size, self.reference, np.int64)
        self.v_budget = budget * w_sum * variance_table()[reference_bits]
        self.v_floor = w_sum * float(self.f.min())  # every group at its widest width
        self.window = float(window_s)
        self.t_reference = self.time(self.k_reference)
        self.t_scale = max(self.t_reference, self.window, 1e-12)
        self.v_scale = next((v for v in (self.v_budget, w_sum * float(self.f.max())) if v > 0), 1.0)
        self.tol_t, self.tol_v = REL_TOL * self.t_scale, REL_TOL * self.v_scale
        self.tols = (self.tol_v, self.tol_t, VARIANCE_REL_TOL * self.v_scale)  # per term

    @property
    def v_cap(self) -> float:
        """The variance bound of the MILPs' budget row: the budget (or the least variance
        any plan has, where the budget is below it), and ``SLACK`` of the tolerance."""
        return max(self.v_budget, self.v_floor) + SLACK * self.tol_v

    def variance(self, k: np.ndarray) -> float:
        return float(np.sum(self.w * self.f[k]))

    def ranks(self, v, t) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The objective's three terms, in priority order, of variances ``v`` and times
        ``t`` (arrays of one shape): the excess over the budget, the exposed time, ``V``."""
        v, t = np.asarray(v, np.float64), np.asarray(t, np.float64)
        return np.maximum(v - self.v_budget, 0.0), np.maximum(t - self.window, 0.0), v

    def best_index(self, v, t, among: np.ndarray | None = None) -> int:
        """Flat index of the best of the plans with variances ``v`` and times ``t``, the
        first of equals (``among``: a mask of the plans to consider; -1 if none)."""
        terms = self.ranks(v, t)
        ok = np.ones(terms[0].shape, bool) if among is None else among.copy()
        for term, tol in zip(terms, self.tols, strict=True):
            if not ok.any():
                return -1
            ok &= term <= term[ok].min() + tol
        return int(np.argmax(ok.ravel()))

    def better(self, v, t, v0: float, t0: float, anchor=None) -> np.ndarray:
        """Whether plans of variances ``v`` and times ``t`` are strictly better than one of
        ``(v0, t0)`` (beyond the tolerances, in the first term that differs). ``anchor``:
        the terms to compare with instead (:meth:`anchored`)."""
        terms, tols = self.ranks(v, t), self.tols
        base = self.ranks(v0, t0) if anchor is None else anchor
        out, tied = np.zeros(terms[0].shape, bool), np.ones(terms[0].shape, bool)
        for term, b, tol in zip(terms, base, tols, strict=True):
            out |= tied & (term < b - tol)
            tied &= np.abs(term - b) <= tol
        return out

    def no_worse(self, v, t, v0: float, t0: float, anchor=None) -> np.ndarray:
        """Whether plans are at least as good as ``(v0, t0)`` (better, or equal within the
        tolerances; ``anchor`` as in :meth:`better`)."""
        terms = self.ranks(v, t)
        base = self.ranks(v0, t0) if anchor is None else anchor
        tied = np.ones(terms[0].shape, bool)
        for term, b, tol in zip(terms, base, self.tols, strict=True):
            tied &= np.abs(term - b) <= tol
        return tied | self.better(v, t, v0, t0, anchor)

    def anchored(self, anchor: tuple | None, v: float, t: float) -> tuple:
        """The terms a local search compares its next moves with, after moving to a plan
        of ``(v, t)``: the least excess and exposed time seen so far (``anchor``; None at
        the start) and the new variance. Equal within the tolerance is not a step a chain
        of moves may repeat: each compares with the least, so none drifts a tolerance at
        a time."""
        terms = tuple(float(x) for x in self.ranks(v, t))
        if anchor is None:
            return terms
        return min(anchor[0], terms[0]), min(anchor[1], terms[1]), terms[2]

    def pick(self, candidates: Sequence[np.ndarray]) -> np.ndarray:
        """The best of candidate group widths (the first of equals)."""
        v = [self.variance(k) for k in candidates]
        return candidates[self.best_index(v, [self.time(k) for k in candidates])]

    def exhaustive(
        self, max_combos: int, chunk: int, times: Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """Exhaustive search in lexicographic order (first group most significant); the first
        best. ``times(k)``: float64 ``[N]`` predicted times of the widths ``k`` ``[N, G]``;
        ``chunk`` combinations are scored at a time."""
        G, K = self.w.size, self.bits.size
        if max_combos < K**G:
            raise ValueError(f"brute force over {K}**{G} combinations exceeds {max_combos}")
        radix = K ** np.arange(G - 1, -1, -1, dtype=np.int64)
        best = None  # (v, t, idx)
        for start in range(0, K**G, chunk):
            idx = np.arange(start, min(start + chunk, K**G), dtype=np.int64)
            k = (idx[:, None] // radix[None, :]) % K  # [chunk, G]
            v, t = (self.w[None, :] * self.f[k]).sum(axis=1), times(k)
            i = self.best_index(v, t)
            if best is None or self.better(v[i], t[i], best[0], best[1]):
                best = (float(v[i]), float(t[i]), int(idx[i]))
        return (best[2] // radix) % K

    def message_bits(self, k: np.ndarray) -> tuple[np.ndarray, ...]:
        """Group widths ``k`` ``[G]`` -> per channel int8 ``[n_c]`` in original message order."""
        out, first = [], 0
        for order in self.orders:
            b = np.empty(order.size, dtype=np.int8)
            b[order] = self.bits[k[first + np.arange(order.size) // self.group_size]]
            out.append(b)
            first += -(-order.size // self.group_size)
        return tuple(out)


class LinkProblem(Groups):
    """A grouped instance under the link model."""

    def __init__(
        self,
        channels: Sequence[Channel],
        dim: int,
        link_model: LinkModel,
        bits: Sequence[int],
        group_size: int,
        reference_bits: int,
        budget: float = 1.0,
        window_s: float = 0.0,
    ) -> None:
        super().__init__(channels, group_size)
        self.bits = check_bits(bits, full_precision=False)
        self.f = variance_table()[self.bits]  # [K] variance factor per unit weight
        self.r = row_bytes_table(dim)[self.bits]  # [K] bytes per row
        self.alpha = np.array([link_model.alpha_s[c.src, c.dst] for c in channels], np.float64)
        self.beta = np.array([link_model.beta_Bps[c.src, c.dst] for c in channels], np.float64)
        self._set_objective(reference_bits, budget, window_s)

    def channel_bytes(self, k: np.ndarray) -> np.ndarray:
        return np.bincount(self.chan, self.n * self.r[k], self.num_channels)

    def times(self, k: np.ndarray) -> np.ndarray:
        """float64 ``[C]`` channel times for group widths ``k`` ``[G]``."""
        return np.where(self.nonempty, self.alpha + self.channel_bytes(k) / self.beta, 0.0)

    def time(self, k: np.ndarray) -> float:
        return float(self.times(k).max(initial=0.0))


class HostProblem(Groups):
    """A grouped instance under the host model; resources as in :meth:`HostModel.channel_map`."""

    def __init__(
        self,
        channels: Sequence[Channel],
        dim: int,
        model: HostModel,
        bits: Sequence[int],
        group_size: int,
        reference_bits: int,
        budget: float = 1.0,
        window_s: float = 0.0,
    ) -> None:
        super().__init__(channels, group_size)
        self.model = model
        self.bits = check_bits(bits)
        self.f = variance_table()[self.bits]
        quant, dequant = model.per_value_costs(self.bits)
        per_row = np.stack(
            [row_bytes_table(dim)[self.bits], dim * quant[self.bits], dim * dequant[self.bits]]
        )  # [3, K]: bytes, quantize seconds, dequantize seconds of one row
        # [C, K, R]: seconds each resource spends on one row of channel c at width index k.
        self.row_use = np.einsum("ik,icr->ckr", per_row, model.channel_map(channels))
        self.unit = self.n[:, None, None] * self.row_use[self.chan]  # [G, K, R] per group
        self.alpha = model.alpha_s
        self._set_objective(reference_bits, budget, window_s)

    def use(self, k: np.ndarray) -> np.ndarray:
        """float64 ``[R]`` resource seconds for group widths ``k`` ``[G]``."""
        return self.unit[np.arange(self.w.size), k].sum(axis=0)

    def time(self, k: np.ndarray) -> float:
        if self.w.size == 0:  # nothing to send: not even the start-up latency
            return 0.0
        return self.alpha + float(self.model.host_and_fabric_times(self.use(k)).max())


def two_stages(
    p: Groups,
    stage: Callable[[Groups, float | None, float], tuple[np.ndarray | None, str]],
    time_limit_s: float,
) -> tuple[np.ndarray | None, str]:
    """The exact solve as two MILPs, each given half of ``time_limit_s`` (the second also
    what the first left): ``stage(p, None, limit)``, the least ``T`` within the variance
    budget, at ``T1``; then ``stage(p, cap, limit)``, the least ``V`` with ``T`` at most
    ``max(T1, W)``, within the budget. Where the window hides ``T1`` every plan it hides
    has ``E = 0``; where it does not, no plan has less ``E`` than ``T1``'s. Both caps (the
    budget's, ``T``'s) reach ``SLACK`` of the tolerance past their value: the objective
    counts what lies within the tolerance as equal. Returns ``(group widths or None,
    status)``: ``"optimal"`` when both stages are."""
    start = time.perf_counter()
    k1, status = stage(p, None, time_limit_s / 2)
    if k1 is None:
        return None, status
    cap = max(p.time(k1), p.window) + SLACK * p.tol_t
    k2, second = stage(p, cap, max(start + time_limit_s - time.perf_counter(), 1e-3))
    if status == "optimal":
        status = second.removesuffix("_no_solution")
    if k2 is None or not p.no_worse(p.variance(k2), p.time(k2), p.variance(k1), p.time(k1)):
        return k1, status
    return k2, status


def sort_full_groups(p: Groups, k: np.ndarray) -> np.ndarray:
    """Give each channel's full-size groups non-increasing widths, heaviest group first.

    Bytes are unchanged and variance cannot rise (heavier groups get the smaller factors), so
    this only canonicalises: equal-weight groups tie-break by message order.
    """
    k = k.copy()
    for c in range(p.num_channels):
        groups = np.flatnonzero((p.chan == c) & p.full)
        k[groups] = np.sort(k[groups])[::-1]
    return k
