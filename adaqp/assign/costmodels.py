"""Cost models: what predicts an exchange's time ``T``, and the fit of one link's profile.

An exchange (one layer, one direction) is a set of channels ``p -> q`` that run
concurrently; a row at ``b`` bits costs ``message_bytes(1, D, b)`` wire bytes (packed codes
+ float32 min/max), ``4 * D`` at ``FULL_PRECISION_BITS``
(:func:`~adaqp.assign.channel.row_bytes_table`). The type of the model object picks the
cost model (:func:`adaqp.assign.kinds.kind_of`); each prices per-message widths with
``exchange_time``:

* :class:`LinkModel`: channel ``p -> q`` takes ``alpha_pq + bytes_pq / beta_pq`` seconds (0 when
  it carries nothing); ``T`` is the slowest channel. Widths up to 8 bits only.
* :class:`HostModel`: ranks live on hosts with full-duplex NICs behind a switch. One exchange
  (an all-to-all) ends when its busiest host is done, or when the switch has carried every
  byte between hosts, whichever is later::

      T   = alpha + max(max_h [max(out_h / beta_out_h, in_h / beta_in_h) + max_{r on h} c_r],
                        F + max_r c_r)
      c_r = s_r * D * (sum of quant_s[b_v] over r's sent values + sum of dequant_s[b_v]
            over r's received values) + local_r / beta_local
      F   = (out_0 + ... + out_{H-1}) / fabric

  ``out_h``/``in_h`` are the bytes of the channels that leave/enter host ``h``: ranks on one host
  share its NIC. A channel between two ranks of one host never touches the network; its bytes
  ``local_r`` are a copy charged to the sending rank ``r`` (it writes into the receiver's
  buffer). ``s_r`` is rank ``r``'s CPU scale: how much longer its (de)quantization takes
  than the fastest rank's (``quant_s``/``dequant_s``), sustained, on its host's share of
  the CPU (a host under a CPU quota runs the same kernels slower than one with its own
  core; 1 for every rank by default). ``fabric`` is what the switch carries in all
  (``inf`` by default: no bound), less than the NICs together where it is oversubscribed
  or forwards in software on shared cores.
  Modelling choices: a rank quantizes before it sends and dequantizes after it has received,
  so compute and network add (no overlap is assumed); ranks of one host (de)quantize in
  parallel (each on its own device), so a host waits for its slowest rank; rows cross the
  fabric after they are quantized and are dequantized after, so the fabric's ``F`` adds
  to the slowest rank's ``c_r`` as a NIC's time adds to its host's (without that, a fabric
  slower than the NICs would make quantization look free until the hosts catch up with
  it); ``alpha`` is paid once per exchange and not at all by an empty one. Full
  precision (32) has no (de)quantization cost unless the model gives one, so a fast network
  with a slow quantizer selects it.

:func:`fit_alpha_beta` fits one link's ``alpha``/``beta`` to timed transfers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from scipy.optimize import nnls

from adaqp.assign.channel import Channel, row_bytes_table
from adaqp.quant.bits import BIT_WIDTHS, FULL_PRECISION_BITS, SUPPORTED_BITS


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

    def exchange_time(
        self, channels: Sequence[Channel], dim: int, widths: Sequence[np.ndarray]
    ) -> float:
        """``T`` of per-message widths: the slowest channel's time (0 when none sends)."""
        table = row_bytes_table(dim)
        pairs = zip(channels, widths, strict=True)
        return max((self.time(c.src, c.dst, int(table[b].sum())) for c, b in pairs), default=0.0)


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
        cpu_scale: float64 ``[P]``, each rank's (de)quantization seconds as a multiple of
            ``quant_s_per_value``/``dequant_s_per_value`` (finite, > 0; None, the default:
            1 for every rank).
    """

    host_of_rank: np.ndarray
    alpha_s: float
    beta_out_Bps: np.ndarray
    beta_in_Bps: np.ndarray
    beta_local_Bps: float
    quant_s_per_value: Mapping[int, float] = field(default_factory=dict)
    dequant_s_per_value: Mapping[int, float] = field(default_factory=dict)
    fabric_Bps: float = math.inf
    cpu_scale: np.ndarray | Sequence[float] | None = None

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
        scale = np.ones(hosts.size) if self.cpu_scale is None else np.array(self.cpu_scale, float)
        if scale.shape != hosts.shape or not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise ValueError(f"cpu_scale must be [{hosts.size}] finite and positive, got {scale}")
        for arr in (hosts, beta_out, beta_in, scale):
            arr.flags.writeable = False
        object.__setattr__(self, "cpu_scale", scale)
        object.__setattr__(self, "host_of_rank", hosts)
        object.__setattr__(self, "alpha_s", float(self.alpha_s))
        object.__setattr__(self, "beta_out_Bps", beta_out)
        object.__setattr__(self, "beta_in_Bps", beta_in)
        object.__setattr__(self, "beta_local_Bps", float(self.beta_local_Bps))
        object.__setattr__(self, "fabric_Bps", float(self.fabric_Bps))
        for name in ("quant_s_per_value", "dequant_s_per_value"):
            costs = {int(b): float(s) for b, s in dict(getattr(self, name)).items()}
            if any(
                b not in BIT_WIDTHS or not (math.isfinite(s) and s >= 0) for b, s in costs.items()
            ):
                raise ValueError(
                    f"{name} maps widths in {BIT_WIDTHS} to finite seconds >= 0: {costs}"
                )
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
        cpu_scale: Sequence[float] | None = None,
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
            cpu_scale,  # checked and made an array in __post_init__
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

    def per_value_costs(self, widths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
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

    def channel_map(self, channels: Sequence[Channel]) -> np.ndarray:
        """float64 ``[3, C, R]``: seconds each resource spends per byte, per second of
        quantization and per second of dequantization of each channel (the latter two at
        the fastest rank's rate: the sender's and the receiver's ``cpu_scale``).

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
            out[1, c, 2 * h + ch.src] = self.cpu_scale[ch.src]
            out[2, c, 2 * h + ch.dst] = self.cpu_scale[ch.dst]
        return out

    def exchange_time(
        self, channels: Sequence[Channel], dim: int, widths: Sequence[np.ndarray]
    ) -> float:
        """``T`` of per-message widths under the host model (module docstring)."""
        if not any(c.num_messages for c in channels):
            return 0.0
        quant, dequant = self.per_value_costs(np.unique(np.concatenate(widths)))
        table = row_bytes_table(dim)
        per_channel = np.array(
            [[table[b].sum(), dim * quant[b].sum(), dim * dequant[b].sum()] for b in widths]
        )  # [C, 3]: bytes, quantize seconds, dequantize seconds
        use = np.einsum("ck,kcr->r", per_channel, self.channel_map(channels))
        return self.alpha_s + float(self.host_and_fabric_times(use).max())

    def host_and_fabric_times(self, use: np.ndarray) -> np.ndarray:
        """float64 ``[..., H + 1]``: each host's busy seconds (the busier of its NIC's two
        directions plus its slowest rank's (de)quantization and copies), then the fabric's
        (its use plus the slowest rank's), all without ``alpha``, from resource use
        ``[..., R]`` (``channel_map``'s columns). ``T`` is ``alpha`` plus their maximum;
        the solvers (``adaqp.assign.problem``, ``adaqp.assign.host``) price a change of
        widths by what it does to these."""
        h = self.num_hosts
        net = np.maximum(use[..., :h], use[..., h : 2 * h])
        order = np.argsort(self.host_of_rank, kind="stable")
        used, starts = np.unique(self.host_of_rank[order], return_index=True)
        compute = np.zeros(net.shape)
        compute[..., used] = np.maximum.reduceat(use[..., 2 * h + order], starts, axis=-1)
        fabric = use[..., -1:] + compute.max(axis=-1, keepdims=True)
        return np.concatenate([net + compute, fabric], axis=-1)


CostModel = LinkModel | HostModel
"""What the solver prices an exchange with."""


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
