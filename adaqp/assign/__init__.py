"""Bit-width assignment for halo messages: trade quantization variance against exchange time.

An exchange (one layer, one direction) is a set of channels ``p -> q`` that run concurrently.
Message ``v`` quantized to ``b`` bits adds variance ``w_v / (2**b - 1)**2`` to its receiver's
aggregation and costs ``message_bytes(1, D, b)`` bytes (packed codes + float32 min/max). Width
``FULL_PRECISION_BITS`` (32) sends the float32 row itself: ``4 * D`` bytes, no metadata, no
variance. With ``V`` the total variance and ``T`` the predicted exchange time we minimise::

    lam * (V - V_min) / (V_max - V_min) + (1 - lam) * (T - T_min) / (T_max - T_min)

``V_min``/``V_max`` and ``T_min``/``T_max`` are the least and greatest over the uniform
assignments (every message at one allowed width); a zero range zeroes its term. Full
precision is a choice but not part of the range: a range reaching float32 (many times the
bytes) would shrink every difference in time between quantized plans and spend bytes on
variance, which measured slower on the emulated cluster. Under the link
model these are the all-max/all-min bit assignments; under the host model a mixed assignment can
be faster than every uniform one, so there the time term can go below zero. Each channel's
messages are sorted by weight (heaviest first, stable) and cut into groups of ``group_size``;
each group gets one width.

Cost models (the type of ``link_model`` picks one):

* :class:`LinkModel`: channel ``p -> q`` takes ``alpha_pq + bytes_pq / beta_pq`` seconds (0 when
  it carries nothing); ``T`` is the slowest channel. Widths up to 8 bits only.
* :class:`HostModel`: ranks live on hosts with full-duplex NICs behind a switch. One exchange
  (an all-to-all) ends when its busiest host is done, or when the switch has carried every
  byte between hosts, whichever is later::

      T   = alpha + max(max_h [max(out_h / beta_out_h, in_h / beta_in_h) + max_{r on h} c_r],
                        F + max_r c_r)
      c_r = D * (sum of quant_s[b_v] over r's sent values + sum of dequant_s[b_v] over
            r's received values) + local_r / beta_local
      F   = (out_0 + ... + out_{H-1}) / fabric

  ``out_h``/``in_h`` are the bytes of the channels that leave/enter host ``h``: ranks on one host
  share its NIC. A channel between two ranks of one host never touches the network; its bytes
  ``local_r`` are a copy charged to the sending rank ``r`` (it writes into the receiver's
  buffer). ``fabric`` is what the switch carries in all (``inf`` by default: no bound), less
  than the NICs together where it is oversubscribed or forwards in software on shared cores.
  Modelling choices: a rank quantizes before it sends and dequantizes after it has received,
  so compute and network add (no overlap is assumed); ranks of one host (de)quantize in
  parallel (each on its own device), so a host waits for its slowest rank; rows cross the
  fabric after they are quantized and are dequantized after, so the fabric's ``F`` adds
  to the slowest rank's ``c_r`` as a NIC's time adds to its host's (without that, a fabric
  slower than the NICs would make quantization look free until the hosts catch up with
  it); ``alpha`` is paid once per exchange and not at all by an empty one. Full
  precision (32) has no (de)quantization cost unless the model gives one, so a fast network
  with a slow quantizer selects it.

Solvers (:func:`solve_assignment`):

* ``"milp"``: exact, HiGHS through :func:`scipy.optimize.milp`. Width of group ``g`` is encoded
  incrementally, ``y[g, k] = [width index >= k]`` for ``k = 1..K-1`` with ``y[g, k] >= y[g, k+1]``
  (equivalent to one-hot ``x[g, b] = y[g, b] - y[g, b+1]`` with ``sum_b x[g, b] = 1``). A
  continuous ``tau = (T - T_min) / (T_max - T_min)`` bounds every channel's time (link model),
  or every host's ``N_h + C_h`` with continuous ``N_h >= out_h / beta_out_h``, ``N_h >=
  in_h / beta_in_h`` and ``C_h >= c_r`` for its ranks, and, where the fabric is finite, every
  ``F + C_h`` (host model). On a time limit the better of HiGHS's incumbent and the greedy is
  used. HiGHS does not check its clock inside every root-node heuristic: from ~10k groups it
  overruns the limit by up to ~0.5 s, and once (20k groups, 2 s limit) took 6 s. Such models
  rarely finish anyway (the gap is ~1e-5), so use the greedy for them, or a group size that
  keeps groups to a few thousand. The host model is harder to prove: planner-sized exchanges
  (240-280 groups, 2-8 ranks) took 0.04-0.4 s, but about 2% of random instances of 20-300
  groups needed more than 20 s (one of 82 groups took 9 s: a real integrality gap); the
  rounded LP is then the usual answer.
* ``"greedy"``: link model: for every candidate time cap, each channel independently fills its
  budget with width upgrades in order of variance decrease per byte (a multiple-choice knapsack
  greedy); the best cap wins. Host model: the MILP's LP relaxation (HiGHS) with every group
  rounded down and to nearest, the best of those and the uniform assignments kept. If HiGHS
  returns no LP solution, a pure greedy instead: each group starts at its cheapest width and
  climbs the lower convex hull of its (priced seconds, variance) options; for a grid of caps on
  ``T``, upgrades are taken in order of variance saved per priced second wherever every host
  and the fabric stay within the cap; seconds are priced alike on every resource, then by where
  the best so far sets ``T``. (That greedy alone, being blind to which resources bind, was up
  to 1e-2 off the MILP where the rounded LP is within 1e-3; see ``tests/assign/test_solve.py``.)
* ``"brute"``: enumerates all combinations (refused above ``max_combos``); for tests.

MILP and greedy results are then polished by single-group moves (strict improvements first, then
moves that save bytes, or seconds of the hosts' resources under the host model, without raising
the objective, e.g. for zero-weight messages), and each channel's full-size groups are sorted to
non-increasing widths, which keeps every resource's use and cannot raise variance: ties between
equal weights go to the earlier messages.

Determinism: identical inputs give identical results on one software stack, except when the MILP
(or the greedy's LP, given the same time limit) hits its time limit (where it stops depends on
machine speed): compute on one rank and broadcast.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp, nnls
from scipy.sparse import coo_matrix

from adaqp.bits import BIT_WIDTHS, DEFAULT_ALLOWED_BITS, FULL_PRECISION_BITS, SUPPORTED_BITS
from adaqp.quant import message_bytes

__all__ = [
    "DEFAULT_BITS",
    "FULL_PRECISION_BITS",
    "Assignment",
    "Channel",
    "HostModel",
    "LinkModel",
    "evaluate_assignment",
    "fit_alpha_beta",
    "random_assignment",
    "solve_assignment",
    "uniform_assignment",
]

logger = logging.getLogger(__name__)

DEFAULT_BITS = DEFAULT_ALLOWED_BITS
_WIDTHS = BIT_WIDTHS  # every width a message can be priced at
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


@dataclass(frozen=True, eq=False)
class HostModel:
    """Hosts with full-duplex NICs behind a switch (see the module docstring for ``T``).

    Attributes:
        host_of_rank: int64 ``[P]`` host of each rank, in ``[0, H)``.
        alpha_s: start-up latency of one exchange in seconds (>= 0).
        beta_out_Bps: float64 ``[H]`` bytes per second each host's NIC sends (> 0).
        beta_in_Bps: float64 ``[H]`` bytes per second each host's NIC receives (> 0).
        beta_local_Bps: bytes per second of a copy between two ranks of one host (> 0, may be
            ``inf`` for free copies).
        quant_s_per_value: seconds to quantize one value, per width. Every quantized width a
            solve allows must be given; ``FULL_PRECISION_BITS`` defaults to 0.
        dequant_s_per_value: seconds to dequantize one value, per width; same rules.
        fabric_Bps: bytes per second the switch carries in all, summed over every channel
            between two hosts (> 0; ``inf``, the default, for a non-blocking switch). Copies
            within a host do not load it.
    """

    host_of_rank: np.ndarray
    alpha_s: float
    beta_out_Bps: np.ndarray
    beta_in_Bps: np.ndarray
    beta_local_Bps: float
    quant_s_per_value: Mapping[int, float] = field(default_factory=dict)
    dequant_s_per_value: Mapping[int, float] = field(default_factory=dict)
    fabric_Bps: float = math.inf

    def __post_init__(self) -> None:
        hosts = np.array(self.host_of_rank)
        beta_out = np.array(self.beta_out_Bps, dtype=np.float64)
        beta_in = np.array(self.beta_in_Bps, dtype=np.float64)
        if beta_out.ndim != 1 or beta_out.size == 0 or beta_in.shape != beta_out.shape:
            raise ValueError(
                f"beta_out/beta_in must both be [H]; got {beta_out.shape}, {beta_in.shape}"
            )
        if not (np.all(np.isfinite(beta_out)) and np.all(beta_out > 0)):
            raise ValueError("beta_out_Bps must be finite and positive")
        if not (np.all(np.isfinite(beta_in)) and np.all(beta_in > 0)):
            raise ValueError("beta_in_Bps must be finite and positive")
        if (
            hosts.ndim != 1
            or hosts.size == 0
            or not np.issubdtype(hosts.dtype, np.integer)
            or hosts.min() < 0
            or hosts.max() >= beta_out.size
        ):
            raise ValueError(
                f"host_of_rank must be a 1-D int array with values in [0, {beta_out.size})"
            )
        if not (math.isfinite(self.alpha_s) and self.alpha_s >= 0):
            raise ValueError(f"alpha_s must be finite and non-negative, got {self.alpha_s}")
        if not self.beta_local_Bps > 0:  # inf is allowed: free local copies
            raise ValueError(f"beta_local_Bps must be positive, got {self.beta_local_Bps}")
        if not self.fabric_Bps > 0:  # inf is allowed: no aggregate bound
            raise ValueError(f"fabric_Bps must be positive, got {self.fabric_Bps}")
        hosts = hosts.astype(np.int64)
        for arr in (hosts, beta_out, beta_in):
            arr.flags.writeable = False
        object.__setattr__(self, "host_of_rank", hosts)
        object.__setattr__(self, "alpha_s", float(self.alpha_s))
        object.__setattr__(self, "beta_out_Bps", beta_out)
        object.__setattr__(self, "beta_in_Bps", beta_in)
        object.__setattr__(self, "beta_local_Bps", float(self.beta_local_Bps))
        object.__setattr__(self, "fabric_Bps", float(self.fabric_Bps))
        for name in ("quant_s_per_value", "dequant_s_per_value"):
            costs = {int(b): float(s) for b, s in dict(getattr(self, name)).items()}
            if any(b not in _WIDTHS or not (math.isfinite(s) and s >= 0) for b, s in costs.items()):
                raise ValueError(f"{name} maps widths in {_WIDTHS} to finite seconds >= 0: {costs}")
            costs.setdefault(FULL_PRECISION_BITS, 0.0)
            object.__setattr__(self, name, MappingProxyType(dict(sorted(costs.items()))))

    @classmethod
    def uniform(
        cls,
        host_of_rank: Sequence[int],
        alpha_s: float,
        beta_Bps: float,
        beta_local_Bps: float,
        *,
        quant_s_per_value: float = 0.0,
        dequant_s_per_value: float = 0.0,
        fabric_Bps: float = math.inf,
    ) -> HostModel:
        """Equal NICs both ways, and one (de)quantization cost for every quantized width."""
        num_hosts = int(max(host_of_rank)) + 1
        beta = np.full(num_hosts, float(beta_Bps))
        return cls(
            np.asarray(host_of_rank),
            alpha_s,
            beta,
            beta,
            beta_local_Bps,
            dict.fromkeys(SUPPORTED_BITS, quant_s_per_value),
            dict.fromkeys(SUPPORTED_BITS, dequant_s_per_value),
            fabric_Bps,
        )

    @property
    def num_ranks(self) -> int:
        return self.host_of_rank.size

    @property
    def num_hosts(self) -> int:
        return self.beta_out_Bps.size

    @property
    def num_resources(self) -> int:
        """Resources a message uses: each host's send and receive NIC, each rank, the fabric."""
        return 2 * self.num_hosts + self.num_ranks + 1

    def _per_value_costs(self, widths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """float64 ``([33], [33])`` quantize/dequantize seconds per value, indexed by width.

        Raises:
            ValueError: a width in ``widths`` has no cost.
        """
        tables = []
        for name in ("quant_s_per_value", "dequant_s_per_value"):
            costs = getattr(self, name)
            missing = sorted({int(b) for b in widths} - set(costs))
            if missing:
                raise ValueError(
                    f"{name} has no entry for widths {missing}; profile them or pass 0"
                )
            table = np.zeros(FULL_PRECISION_BITS + 1)
            for b, s in costs.items():
                table[b] = s
            tables.append(table)
        return tables[0], tables[1]

    def _channel_map(self, channels: Sequence[Channel]) -> np.ndarray:
        """float64 ``[3, C, R]``: seconds each resource spends per byte, per second of
        quantization and per second of dequantization of each channel.

        Resources (``R = 2H + P + 1``): columns ``[0, H)`` host send NICs, ``[H, 2H)`` host
        receive NICs, ``[2H, 2H + P)`` ranks, ``2H + P`` (the last) the fabric. Bytes between two
        hosts load the sender's send NIC, the receiver's receive NIC and the fabric (not at all
        when it is infinite); bytes within a host are a copy by the sending rank.
        """
        h, hosts = self.num_hosts, self.host_of_rank
        out = np.zeros((3, len(channels), self.num_resources))
        for c, ch in enumerate(channels):
            src_host, dst_host = hosts[ch.src], hosts[ch.dst]
            if src_host == dst_host:
                out[0, c, 2 * h + ch.src] = 1.0 / self.beta_local_Bps
            else:
                out[0, c, src_host] = 1.0 / self.beta_out_Bps[src_host]
                out[0, c, h + dst_host] = 1.0 / self.beta_in_Bps[dst_host]
                out[0, c, -1] = 1.0 / self.fabric_Bps
            out[1, c, 2 * h + ch.src] = 1.0
            out[2, c, 2 * h + ch.dst] = 1.0
        return out

    def _host_times(self, use: np.ndarray) -> np.ndarray:
        """float64 ``[..., H + 1]`` host times, then the fabric's (its use plus the slowest
        rank's; all without ``alpha``), from resource use ``[..., R]``; ``T`` is ``alpha``
        plus their maximum."""
        h = self.num_hosts
        net = np.maximum(use[..., :h], use[..., h : 2 * h])
        order = np.argsort(self.host_of_rank, kind="stable")
        used, starts = np.unique(self.host_of_rank[order], return_index=True)
        compute = np.zeros(net.shape)
        compute[..., used] = np.maximum.reduceat(use[..., 2 * h + order], starts, axis=-1)
        fabric = use[..., -1:] + compute.max(axis=-1, keepdims=True)
        return np.concatenate([net + compute, fabric], axis=-1)


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


CostModel = LinkModel | HostModel
"""What the solver prices an exchange with."""


def _check_bits(bits: Sequence[int], full_precision: bool = True) -> np.ndarray:
    widths = _WIDTHS if full_precision else SUPPORTED_BITS
    arr = np.unique(np.asarray(bits, dtype=np.int64))
    if arr.size == 0 or any(int(b) not in widths for b in arr):
        raise ValueError(f"bit widths must be a non-empty subset of {widths}, got {bits}")
    return arr


def _normalising(bits: np.ndarray) -> np.ndarray:
    """The widths whose uniform assignments set the objective's ranges: the quantized ones
    (all of ``bits`` when full precision is the only choice)."""
    quantized = bits[bits != FULL_PRECISION_BITS]
    return quantized if quantized.size else bits


def _row_bytes_table(dim: int) -> np.ndarray:
    """int64 ``[33]``: entry ``b`` is the wire bytes of one row at ``b`` bits (0 if unpriced)."""
    table = np.zeros(FULL_PRECISION_BITS + 1, dtype=np.int64)
    for b in SUPPORTED_BITS:
        table[b] = message_bytes(1, dim, b)
    table[FULL_PRECISION_BITS] = 4 * dim  # float32 values, no metadata
    return table


def _variance_table() -> np.ndarray:
    """float64 ``[33]``: entry ``b`` is the variance per unit weight at ``b`` bits (0 at 32)."""
    f = np.zeros(FULL_PRECISION_BITS + 1)
    for b in SUPPORTED_BITS:
        f[b] = 1.0 / (2.0**b - 1.0) ** 2
    return f


def _check_channels(channels: Sequence[Channel], link_model: CostModel | None) -> None:
    pairs = [(c.src, c.dst) for c in channels]
    if len(set(pairs)) != len(pairs):
        raise ValueError("each (src, dst) pair may appear in only one channel")
    if link_model is not None and any(max(p) >= link_model.num_ranks for p in pairs):
        raise ValueError(f"channel rank outside the cost model's {link_model.num_ranks} ranks")


def _host_exchange_time(
    model: HostModel, channels: Sequence[Channel], dim: int, widths: Sequence[np.ndarray]
) -> float:
    """``T`` of per-message widths under the host model (module docstring)."""
    if not any(c.num_messages for c in channels):
        return 0.0
    quant, dequant = model._per_value_costs(np.unique(np.concatenate(widths)))
    table = _row_bytes_table(dim)
    per_channel = np.array(
        [[table[b].sum(), dim * quant[b].sum(), dim * dequant[b].sum()] for b in widths]
    )  # [C, 3]: bytes, quantize seconds, dequantize seconds
    use = np.einsum("ck,kcr->r", per_channel, model._channel_map(channels))
    return model.alpha_s + float(model._host_times(use).max())


def evaluate_assignment(
    channels: Sequence[Channel],
    dim: int,
    message_bits: Sequence[np.ndarray],
    link_model: CostModel | None,
    *,
    bits: Sequence[int] = DEFAULT_BITS,
    lam: float = 0.5,
) -> tuple[float, float, float]:
    """``(objective, V, T)`` of per-message widths; ``bits`` sets the normalisation range.

    Objective and ``T`` are NaN without a cost model. Under a :class:`HostModel`, ``T`` is
    the predicted exchange time to compare with a measured one.
    """
    allowed = _check_bits(bits)
    table = _row_bytes_table(dim)
    message_bits = [np.asarray(b, dtype=np.int64) for b in message_bits]
    if len(message_bits) != len(channels) or any(
        b.shape != (c.num_messages,) or not np.isin(b, _WIDTHS).all()
        for c, b in zip(channels, message_bits, strict=True)
    ):
        raise ValueError("need one array of supported widths per channel, one per message")
    f = _variance_table()
    var = sum(float(np.sum(c.weights * f[b])) for c, b in zip(channels, message_bits, strict=True))
    w_sum = sum(float(np.sum(c.weights)) for c in channels)
    if link_model is None:
        return math.nan, var, math.nan

    def exchange_time(widths: Sequence[np.ndarray]) -> float:
        if isinstance(link_model, HostModel):
            return _host_exchange_time(link_model, channels, dim, widths)
        pairs = zip(channels, widths, strict=True)
        return max(
            (link_model.time(c.src, c.dst, int(table[b].sum())) for c, b in pairs), default=0.0
        )

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


class _Groups:
    """Channels cut into ``G`` groups, as flat arrays (a channel's groups are contiguous).

    Width choices are indices ``k`` into ``self.bits`` (``[K]``, ascending), set by subclasses.
    """

    bits: np.ndarray

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

    def message_bits(self, k: np.ndarray) -> tuple[np.ndarray, ...]:
        """Group widths ``k`` ``[G]`` -> per channel int8 ``[n_c]`` in original message order."""
        out, first = [], 0
        for order in self.orders:
            b = np.empty(order.size, dtype=np.int8)
            b[order] = self.bits[k[first + np.arange(order.size) // self.group_size]]
            out.append(b)
            first += -(-order.size // self.group_size)
        return tuple(out)


class _Problem(_Groups):
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
        self.bits = _check_bits(bits, full_precision=False)
        self.f = _variance_table()[self.bits]  # [K] variance factor per unit weight
        self.r = _row_bytes_table(dim)[self.bits]  # [K] bytes per row
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


class _HostProblem(_Groups):
    """A grouped instance under the host model; resources as in :meth:`HostModel._channel_map`."""

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
        self.bits = _check_bits(bits)
        self.f = _variance_table()[self.bits]
        quant, dequant = model._per_value_costs(self.bits)
        per_row = np.stack(
            [_row_bytes_table(dim)[self.bits], dim * quant[self.bits], dim * dequant[self.bits]]
        )  # [3, K]: bytes, quantize seconds, dequantize seconds of one row
        # [C, K, R]: seconds each resource spends on one row of channel c at width index k.
        self.row_use = np.einsum("ik,icr->ckr", per_row, model._channel_map(channels))
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
        return self.alpha + float(self.model._host_times(self.use(k)).max())

    def objective(self, k: np.ndarray) -> float:
        v = float(np.sum(self.w * self.f[k]))
        return self.wv * (v - self.v_min) + self.wt * (self.time(k) - self.t_min)


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


def _sort_full_groups(p: _Groups, k: np.ndarray) -> np.ndarray:
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


# --------------------------------------------------------------------------- host model solvers


def _host_polish(p: _HostProblem, k: np.ndarray, deadline: float) -> np.ndarray:
    """:func:`_polish` under the host model; ties must lower the seconds the group takes on
    the hosts' resources (the fabric's seconds repeat the bytes on the NICs)."""
    k = k.copy()
    groups = np.arange(k.size)
    use = p.use(k)
    for _ in range(4 * k.size * p.bits.size + 10):
        if time.perf_counter() > deadline:
            break
        delta = p.unit - p.unit[groups, k][:, None, :]  # [G, K, R] use change of each move
        t = p.alpha + p.model._host_times(use).max()
        new_t = p.alpha + p.model._host_times(use + delta).max(axis=-1)  # [G, K]
        dobj = p.wv * p.w[:, None] * (p.f[None, :] - p.f[k][:, None]) + p.wt * (new_t - t)
        best = int(np.argmin(dobj))
        if dobj.flat[best] >= -_TOL:
            tie = (dobj <= _TOL) & (delta[..., :-1].sum(axis=-1) < 0)
            if not tie.any():
                break
            best = int(np.argmax(tie))
        g, j = divmod(best, p.bits.size)
        use = use + delta[g, j]
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


def _host_prices(p: _HostProblem, k: np.ndarray) -> np.ndarray:
    """float64 ``[R]`` price per second of each resource, from where ``T`` is set at ``k``.

    A resource costs 1 where it sets its host's time (the busier NIC direction, the slowest
    rank) on a host within 1% of ``T``, or is the fabric, or the slowest rank, with the
    fabric's time within 1% of ``T`` (both without ``alpha``), and ``_SLACK_PRICE``
    elsewhere: growing it barely moves ``T``.
    """
    H, use = p.model.num_hosts, p.use(k)
    times = p.model._host_times(use)  # [H + 1]: the fabric's last
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


def _host_fill(p: _HostProblem, price: np.ndarray, num_caps: int) -> list[np.ndarray]:
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
    caps = np.r_[np.linspace(t_base, max(t_base, p.time(top), p.t_max), num_caps), np.inf]
    fills = fill(caps)
    i = int(np.argmin([p.objective(k) for k in fills]))
    if np.isfinite(caps[i]):
        lo, hi = caps[max(i - 1, 0)], caps[min(i + 1, caps.size - 2)]
        fills += fill(np.linspace(lo, hi, num_caps))
    return [base, *fills]


def _host_greedy(p: _HostProblem, time_limit_s: float, num_caps: int = 32) -> np.ndarray:
    """The heuristic of the module docstring: the LP relaxation rounded, else capped fills.

    Candidates are the uniform assignments and the LP solution rounded down and to nearest;
    the best wins. Without an LP solution (HiGHS failed within ``time_limit_s``) they are the
    capped fills of :func:`_host_fill`, priced first by every resource second alike, then by
    where the best so far sets ``T`` (:func:`_host_prices`).
    """
    candidates = [np.full(p.w.size, k, np.int64) for k in range(p.bits.size)]
    relaxed = _host_relaxation(p, time_limit_s) if p.wt > 0 else None
    if relaxed is not None:
        candidates += [(relaxed > 1.0 - 1e-9).sum(axis=1), (relaxed > 0.5).sum(axis=1)]
    elif p.wt > 0:
        candidates += _host_fill(p, np.ones(p.model.num_resources), num_caps)
        best = min(candidates, key=p.objective)  # first minimum
        candidates += _host_fill(p, _host_prices(p, best), num_caps)
    return min(candidates, key=p.objective).astype(np.int64)


def _host_formulation(p: _HostProblem) -> tuple:
    """The MILP of the module docstring: ``(cost, lower, upper, A, ub)``.

    Variables are ``y`` (``[G, K-1]`` row-major), ``tau``, ``N`` ``[H]``, ``C`` ``[H]``; the
    constraints are ``A @ x <= ub``. An infinite fabric gets no row: it never sets ``T``.
    """
    G, K1 = p.w.size, p.bits.size - 1
    H, R = p.model.num_hosts, p.model.num_resources - 1  # R: the hosts' resources
    ny = G * K1
    i_tau, i_net, i_cpu = ny, ny + 1, ny + 1 + H  # then tau, N_h [H], C_h [H]
    nv = ny + 1 + 2 * H
    var = np.arange(ny).reshape(G, K1)
    cost = np.zeros(nv)
    cost[:ny] = (p.wv * p.w[:, None] * np.diff(p.f)[None, :]).ravel()
    cost[i_tau] = p.wt * (p.t_max - p.t_min)  # tau is in units of T_max - T_min
    chain = var[:, 1:].ravel()
    r = np.arange(chain.size)
    rows, cols, vals = [r, r], [chain, var[:, :-1].ravel()], [np.ones(r.size), -np.ones(r.size)]
    ub = [np.zeros(r.size)]
    first = chain.size  # the time rows start here
    free = np.zeros(nv - ny)  # tau, N, C stay 0 when time does not count
    if p.wt > 0:
        dt = p.t_max - p.t_min
        use0 = p.use(np.zeros(G, np.int64))  # [R + 1], the fabric's last
        step = p.unit[:, 1:, :] - p.unit[:, :-1, :]  # [G, K1, R + 1]
        # Resource rows: use(y) / dt <= N_h (NICs of h) or C_h (ranks on h).
        g, k, res = np.nonzero(step[..., :-1])
        owner = np.r_[i_net + np.arange(H), i_net + np.arange(H), i_cpu + p.model.host_of_rank]
        rows += [first + res, first + np.arange(R)]
        cols += [var[g, k], owner]
        vals += [step[g, k, res] / dt, -np.ones(R)]
        ub.append(-use0[:-1] / dt)
        # Host rows: alpha + dt * (N_h + C_h) <= T_min + dt * tau.
        hosts = first + R + np.arange(H)
        rows += [hosts, hosts, hosts]
        cols += [i_net + np.arange(H), i_cpu + np.arange(H), np.full(H, i_tau)]
        vals += [np.ones(H), np.ones(H), -np.ones(H)]
        ub.append(np.full(H, (p.t_min - p.alpha) / dt))
        if math.isfinite(p.model.fabric_Bps):
            # Fabric rows, one per host: alpha + dt * (F + C_h) <= T_min + dt * tau, with
            # F = use(y) of the fabric (so F plus the slowest rank's C).
            g, k = np.nonzero(step[..., -1])
            for h in range(H):
                rows.append(np.full(g.size + 2, first + R + H + h))
                cols.append(np.r_[var[g, k], i_cpu + h, i_tau])
                vals.append(np.r_[step[g, k, -1] / dt, 1.0, -1.0])
                ub.append([(p.t_min - p.alpha - use0[-1]) / dt])
        free = np.r_[np.inf, np.full(2 * H, np.inf)]
    ub = np.concatenate(ub)
    a = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), (ub.size, nv)
    )
    lower = np.zeros(nv)
    lower[i_tau] = -free[0]  # T can fall below T_min: a mix can beat every uniform width
    upper = np.r_[np.ones(ny), free]
    return cost * _MILP_COST_SCALE, lower, upper, a.tocsr(), ub


def _host_milp(p: _HostProblem, time_limit_s: float) -> tuple[np.ndarray | None, str]:
    """Exact solve under the host model; returns ``(group widths or None, status)``."""
    cost, lower, upper, a, ub = _host_formulation(p)
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


def _host_relaxation(p: _HostProblem, time_limit_s: float) -> np.ndarray | None:
    """The LP relaxation's ``y`` ``[G, K-1]`` in ``[0, 1]``, or None if HiGHS fails."""
    cost, lower, upper, a, ub = _host_formulation(p)
    res = linprog(
        cost,
        A_ub=a,
        b_ub=ub,
        bounds=np.column_stack([lower, upper]),
        method="highs",
        options={"time_limit": float(time_limit_s)},
    )
    if res.status != 0:
        return None
    return res.x[: p.w.size * (p.bits.size - 1)].reshape(p.w.size, -1)


def _host_brute(p: _HostProblem, max_combos: int) -> np.ndarray:
    """:func:`_brute` under the host model."""
    G, K = p.w.size, p.bits.size
    if max_combos < K**G:
        raise ValueError(f"brute force over {K}**{G} combinations exceeds {max_combos}")
    radix = K ** np.arange(G - 1, -1, -1, dtype=np.int64)
    best_obj, best_idx = math.inf, 0
    for start in range(0, K**G, 1 << 14):
        idx = np.arange(start, min(start + (1 << 14), K**G), dtype=np.int64)
        k = (idx[:, None] // radix[None, :]) % K  # [chunk, G]
        use = np.zeros((idx.size, p.model.num_resources))
        for g in range(G):
            use += p.unit[g, k[:, g]]
        t = p.alpha + p.model._host_times(use).max(axis=1)
        v = (p.w[None, :] * p.f[k]).sum(axis=1)
        obj = p.wv * (v - p.v_min) + p.wt * (t - p.t_min)
        i = int(np.argmin(obj))
        if obj[i] < best_obj:
            best_obj, best_idx = float(obj[i]), int(idx[i])
    return (best_idx // radix) % K


def solve_assignment(
    channels: Sequence[Channel],
    dim: int,
    link_model: CostModel,
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
        link_model: cost model covering every channel's ranks: a :class:`LinkModel` or a
            :class:`HostModel`.
        bits: allowed widths, a subset of ``SUPPORTED_BITS``; with a :class:`HostModel` it
            may also hold ``FULL_PRECISION_BITS``.
        group_size: messages per group after sorting by weight.
        lam: variance weight in ``[0, 1]``; 1 gives all max bits; 0 gives all min bits under
            the link model and the fastest assignment under the host model.
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
    p: _Problem | _HostProblem
    if isinstance(link_model, HostModel):
        p = _HostProblem(channels, dim, link_model, bits, group_size, lam)
        exact, brute, local = _host_milp, _host_brute, _host_polish

        def greedy(p: _HostProblem) -> np.ndarray:
            return _host_greedy(p, time_limit_s)

        trivial = lam == 1.0  # lam = 0 still needs the fastest mix, not a uniform width
    elif isinstance(link_model, LinkModel):
        if FULL_PRECISION_BITS in tuple(bits):
            # Its greedy takes each group's upgrades in order of bytes, which 32 bits breaks.
            raise ValueError("full precision (32 bits) is a choice of the HostModel only")
        p = _Problem(channels, dim, link_model, bits, group_size, lam)
        greedy, exact, brute, local = _greedy, _milp, _brute, _polish
        trivial = lam in (0.0, 1.0)
    else:
        raise TypeError(f"link_model must be a LinkModel or HostModel, got {type(link_model)}")
    G, K = p.w.size, p.bits.size
    if G == 0 or K == 1 or trivial:
        k, status = np.full(G, K - 1 if lam == 1.0 else 0, np.int64), "trivial"
    elif method == "brute":
        k, status = _sort_full_groups(p, brute(p, max_combos)), "optimal"
    else:
        if method == "greedy":
            k, status = greedy(p), "heuristic"
        else:
            k, status = exact(p, max(start + time_limit_s - time.perf_counter(), 1e-3))
            if status != "optimal":
                # The greedy is cheap: use it when the MILP has nothing, or something worse.
                k_greedy = greedy(p)
                if k is None or p.objective(k_greedy) < p.objective(k):
                    logger.warning("MILP stopped (%s); using the greedy solution", status)
                    k, status = k_greedy, status + "_greedy"
        if polish:  # a short budget even after a timeout; a no-op on a true optimum
            k = local(p, k, max(start + time_limit_s, time.perf_counter() + 0.05))
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
    link_model: CostModel | None = None,
    bits: Sequence[int] = DEFAULT_BITS,
    lam: float = 0.5,
) -> Assignment:
    """Every message at ``width`` bits (``FULL_PRECISION_BITS`` for unquantized float32); cost
    evaluated against ``bits``' range when possible."""
    _check_bits([width])
    widths = [np.full(c.num_messages, width, np.int8) for c in channels]
    return _fixed(channels, dim, widths, link_model, bits, lam, "uniform")


def random_assignment(
    channels: Sequence[Channel],
    dim: int,
    bits_choices: Sequence[int],
    seed: int,
    *,
    link_model: CostModel | None = None,
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
    link_model: CostModel | None,
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
