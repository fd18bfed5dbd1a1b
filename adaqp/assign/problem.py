"""The assignment problem: the objective over a set of channels, and its grouped instances.

An exchange (one layer, one direction) is a set of channels ``p -> q`` that run concurrently.
Message ``v`` quantized to ``b`` bits adds variance ``w_v / (2**b - 1)**2`` to its receiver's
aggregation and costs ``message_bytes(1, D, b)`` bytes (packed codes + float32 min/max). Width
``FULL_PRECISION_BITS`` (32) sends the float32 row itself: ``4 * D`` bytes, no metadata, no
variance. With ``V`` the total variance and ``T`` the predicted exchange time we minimise::

    lam * (V - V_min) / (V_max - V_min) + (1 - lam) * (T - T_min) / (T_max - T_min)

``V_min``/``V_max`` and ``T_min``/``T_max`` are the least and greatest over the uniform
assignments (every message at one allowed width); a zero range zeroes its term. Full
precision is a choice but not part of the range: a range reaching float32 (many times the
bytes) would shrink every difference in time between quantized plans, so the objective
would spend bytes on variance (``docs/cost-models.md``). Under the link model these are
the all-max/all-min bit assignments; under the host model a mixed assignment can be
faster than every uniform one, so there the time term can go below zero. Each channel's
messages are sorted by weight (heaviest first, stable) and cut into groups of ``group_size``;
each group gets one width.

What lives here, shared by every solver: :class:`Assignment` (the result; the input, a
:class:`~adaqp.assign.channel.Channel` per pair, is defined in :mod:`adaqp.assign.channel`),
:func:`evaluate_assignment` (``(objective, V, T)`` of any widths), the per-width tables of
variance, the groups (``Groups``) and the grouped instances the solvers work on
(``LinkProblem`` under the link model, ``HostProblem`` under the host model), and the
canonical order of a channel's group widths (``sort_full_groups``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from adaqp.assign.channel import Channel, row_bytes_table
from adaqp.assign.costmodels import CostModel, HostModel, LinkModel
from adaqp.bits import BIT_WIDTHS, DEFAULT_ALLOWED_BITS, FULL_PRECISION_BITS, SUPPORTED_BITS

OBJECTIVE_TOL = 1e-12
"""Ties in the objective: it is normalised to O(1), so the solvers treat smaller
differences as equal (and then prefer fewer bytes)."""

MILP_COST_SCALE = 1e4
"""What the MILPs multiply the objective by. HiGHS stops at an absolute gap of 1e-6 (not
settable through scipy); scaled, that is 1e-10 of the O(1) objective, so "optimal" matches
brute force to 1e-9."""


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


def _normalising(bits: np.ndarray) -> np.ndarray:
    """The widths whose uniform assignments set the objective's ranges: the quantized ones
    (all of ``bits`` when full precision is the only choice)."""
    quantized = bits[bits != FULL_PRECISION_BITS]
    return quantized if quantized.size else bits


def _variance_table() -> np.ndarray:
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
    bits: Sequence[int] = DEFAULT_ALLOWED_BITS,
    lam: float = 0.5,
) -> tuple[float, float, float]:
    """``(objective, V, T)`` of per-message widths; ``bits`` sets the normalisation range.

    Objective and ``T`` are NaN without a cost model. Under a :class:`HostModel`, ``T`` is
    the predicted exchange time to compare with a measured one.
    """
    allowed = check_bits(bits)
    message_bits = [np.asarray(b, dtype=np.int64) for b in message_bits]
    if len(message_bits) != len(channels) or any(
        b.shape != (c.num_messages,) or not np.isin(b, BIT_WIDTHS).all()
        for c, b in zip(channels, message_bits, strict=True)
    ):
        raise ValueError("need one array of supported widths per channel, one per message")
    f = _variance_table()
    var = sum(float(np.sum(c.weights * f[b])) for c, b in zip(channels, message_bits, strict=True))
    w_sum = sum(float(np.sum(c.weights)) for c in channels)
    if link_model is None:
        return math.nan, var, math.nan

    def exchange_time(widths: Sequence[np.ndarray]) -> float:
        return link_model.exchange_time(channels, dim, widths)

    t = exchange_time(message_bits)
    ranging = _normalising(allowed)
    uniform_t = [
        exchange_time([np.full(c.num_messages, b) for c in channels]) for b in ranging.tolist()
    ]
    t_min, t_max = min(uniform_t), max(uniform_t)
    v_min, v_max = w_sum * f[ranging].min(), w_sum * f[ranging].max()
    obj = lam * (var - v_min) / (v_max - v_min) if v_max > v_min else 0.0
    obj += (1.0 - lam) * (t - t_min) / (t_max - t_min) if t_max > t_min else 0.0
    return float(obj), var, t


class Groups:
    """Channels cut into ``G`` groups, as flat arrays (a channel's groups are contiguous).

    Width choices are indices ``k`` into ``self.bits`` (``[K]``, ascending), set by subclasses.
    """

    bits: np.ndarray
    f: np.ndarray  # [K] variance factor per unit weight
    wv: float
    wt: float
    v_min: float
    t_min: float

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

    def _set_weights(self, lam: float) -> None:
        """Objective weights per unit of V and T; zero when that range is empty."""
        self.wv = lam / (self.v_max - self.v_min) if self.v_max > self.v_min else 0.0
        self.wt = (1.0 - lam) / (self.t_max - self.t_min) if self.t_max > self.t_min else 0.0

    def exhaustive(
        self, max_combos: int, chunk: int, times: Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """Exhaustive search in lexicographic order (first group most significant); the first
        minimum. ``times(k)``: float64 ``[N]`` predicted times of the widths ``k`` ``[N, G]``;
        ``chunk`` combinations are scored at a time."""
        G, K = self.w.size, self.bits.size
        if max_combos < K**G:
            raise ValueError(f"brute force over {K}**{G} combinations exceeds {max_combos}")
        radix = K ** np.arange(G - 1, -1, -1, dtype=np.int64)
        best_obj, best_idx = math.inf, 0
        for start in range(0, K**G, chunk):
            idx = np.arange(start, min(start + chunk, K**G), dtype=np.int64)
            k = (idx[:, None] // radix[None, :]) % K  # [chunk, G]
            v = (self.w[None, :] * self.f[k]).sum(axis=1)
            obj = self.wv * (v - self.v_min) + self.wt * (times(k) - self.t_min)
            i = int(np.argmin(obj))
            if obj[i] < best_obj:
                best_obj, best_idx = float(obj[i]), int(idx[i])
        return (best_idx // radix) % K

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
        lam: float,
    ) -> None:
        super().__init__(channels, group_size)
        self.bits = check_bits(bits, full_precision=False)
        self.f = _variance_table()[self.bits]  # [K] variance factor per unit weight
        self.r = row_bytes_table(dim)[self.bits]  # [K] bytes per row
        self.alpha = np.array([link_model.alpha_s[c.src, c.dst] for c in channels], np.float64)
        self.beta = np.array([link_model.beta_Bps[c.src, c.dst] for c in channels], np.float64)
        # Bytes grow with the width (up to 8 bits), so the extremes are the uniform extremes.
        self.t_min = float(self.times(np.zeros(self.w.size, np.int64)).max(initial=0.0))
        self.t_max = float(self.times(np.full(self.w.size, self.bits.size - 1)).max(initial=0.0))
        self.v_max, self.v_min = self.w.sum() * self.f[0], self.w.sum() * self.f[-1]
        self._set_weights(lam)

    def channel_bytes(self, k: np.ndarray) -> np.ndarray:
        return np.bincount(self.chan, self.n * self.r[k], self.num_channels)

    def times(self, k: np.ndarray) -> np.ndarray:
        """float64 ``[C]`` channel times for group widths ``k`` ``[G]``."""
        return np.where(self.nonempty, self.alpha + self.channel_bytes(k) / self.beta, 0.0)

    def objective(self, k: np.ndarray) -> float:
        v = float(np.sum(self.w * self.f[k]))
        t = float(self.times(k).max(initial=0.0))
        return self.wv * (v - self.v_min) + self.wt * (t - self.t_min)


class HostProblem(Groups):
    """A grouped instance under the host model; resources as in :meth:`HostModel.channel_map`."""

    def __init__(
        self,
        channels: Sequence[Channel],
        dim: int,
        model: HostModel,
        bits: Sequence[int],
        group_size: int,
        lam: float,
    ) -> None:
        super().__init__(channels, group_size)
        self.model = model
        self.bits = check_bits(bits)
        self.f = _variance_table()[self.bits]
        quant, dequant = model.per_value_costs(self.bits)
        per_row = np.stack(
            [row_bytes_table(dim)[self.bits], dim * quant[self.bits], dim * dequant[self.bits]]
        )  # [3, K]: bytes, quantize seconds, dequantize seconds of one row
        # [C, K, R]: seconds each resource spends on one row of channel c at width index k.
        self.row_use = np.einsum("ik,icr->ckr", per_row, model.channel_map(channels))
        self.unit = self.n[:, None, None] * self.row_use[self.chan]  # [G, K, R] per group
        self.alpha = model.alpha_s
        ranging = np.flatnonzero(np.isin(self.bits, _normalising(self.bits)))
        uniform = [self.time(np.full(self.w.size, k)) for k in ranging]
        self.t_min, self.t_max = min(uniform), max(uniform)
        f = self.f[ranging]
        self.v_max, self.v_min = self.w.sum() * f.max(), self.w.sum() * f.min()
        self._set_weights(lam)

    def use(self, k: np.ndarray) -> np.ndarray:
        """float64 ``[R]`` resource seconds for group widths ``k`` ``[G]``."""
        return self.unit[np.arange(self.w.size), k].sum(axis=0)

    def time(self, k: np.ndarray) -> float:
        if self.w.size == 0:  # nothing to send: not even the start-up latency
            return 0.0
        return self.alpha + float(self.model.host_and_fabric_times(self.use(k)).max())

    def objective(self, k: np.ndarray) -> float:
        v = float(np.sum(self.w * self.f[k]))
        return self.wv * (v - self.v_min) + self.wt * (self.time(k) - self.t_min)


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
