"""Profiling the running cluster (collective): what the cost models are built from.

Links: :func:`profile_links` times ping-pongs between every ordered pair of ranks (probe
sizes ``PROFILE_SIZES``), disjoint pairs at once in round-robin rounds, and fits each
pair's alpha and beta: the :class:`~adaqp.assign.costmodels.LinkModel`.

Hosts for the ``host`` cost model: which rank runs where, how fast each host's network
link is, and what (de)quantization costs per value.

The host of a rank is torchrun's node (``GROUP_RANK``: one agent per host, also in an
emulated cluster whose namespaces share one hostname), else its hostname. Link rates come
from the per-pair profile (``profile_links``, no rank in two pairs at once): a host's
send rate is the median over pairs leaving it, its receive rate the median over pairs
entering it, and copies between two ranks of one host run at the median of those pairs.
Every tensor a probe sends lives on the backend's device (NCCL refuses CPU tensors),
and every timing waits for the device's queued work. (De)quantization is timed on every
rank at once (:func:`time_quantization`): in bursts, the fastest of a few, for each
width's cost per value, and sustained for ``SUSTAIN_S``, long enough for a host's CPU
quota to throttle it (several of the emulated cluster's 10 ms periods) and for ranks
that share cores to share them. The fastest rank's burst figures are the costs per
width; each rank's sustained time over them is its CPU scale, so that a message costs
its sender and its receiver the CPU their hosts have.

Pairs timed alone do not show what the network carries when every host sends at once: a
switch whose backplane (or uplinks) carry less than the sum of its ports, or hosts whose
packets are forwarded by shared cores, as in the emulated cluster. ``profile_fabric``
times one all-to-all in which every host's NIC is busy for about as long as its rates
allow; if it takes clearly longer than those rates predict, the fabric's aggregate rate is
the inter-host bytes over the time taken, else it is unbounded.
"""

from __future__ import annotations

import math
import os
import socket
import time
import zlib
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from adaqp.assign.costmodels import HostModel, LinkModel, fit_alpha_beta
from adaqp.quant.bits import FULL_PRECISION_BITS
from adaqp.quant.mixed import dequantize_mixed, mixed_buffer_bytes, quantize_mixed

if TYPE_CHECKING:
    from adaqp.runtime import World

SUSTAIN_S = 0.06
"""Seconds each rank (de)quantizes without a break when timing its sustained rate: six
periods of the emulated cluster's CPU quota (10 ms), so a host held to half a core shows
about half a core's rate."""

PROFILE_SIZES = (4_096, 1_048_576, 4_194_304)
"""Bytes per probe transfer when profiling links. The large probes exceed the burst a
shaped link lets through at line rate (the emulated cluster's token bucket holds 256 KB),
so the fitted bandwidth is the sustained rate that a whole exchange sees. The planner
probes each size once (``repeats`` is for callers that want the fastest of several)."""

CHECK_SIZES = (4_096, 1_048_576)
"""Probe sizes (one repeat each) when the profile only decides between the uniform width
and float32 (the uniform scheme). The answer turns where float32's bytes cost what
quantizing them costs, so a rate read somewhat high (a 1 MB probe on a link whose first
256 KB pass at line rate) moves it only for links near that rate; skipping the 4 MB probe
and the repeats keeps the start-up short on a slow link (docs/cost-models.md#profiling)."""


def round_robin(world_size: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint rank pairs in which every pair meets once (the circle method):
    P - 1 rounds of P / 2 pairs for even P, P rounds with one rank idle in each for odd P."""
    if world_size < 2:
        return []
    n = world_size + world_size % 2  # an odd count gets a rank P that sits out
    order = list(range(n))
    rounds = []
    for _ in range(n - 1):
        pairs = [(order[i], order[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if max(a, b) < world_size])
        order = [order[0], order[-1], *order[1:-1]]
    return rounds


def profile_links(
    world: World, sizes: tuple[int, ...] = PROFILE_SIZES, repeats: int = 3
) -> LinkModel:
    """Times ping-pongs between every ordered pair of ranks and fits alpha/beta per pair.

    The pairs meet in :func:`round_robin`'s rounds: the pairs of a round are disjoint and
    run at once, each timing both its directions in turn, so start-up grows with P, not
    P². A pair shares no rank with another of its round, so the figures are per link as
    long as links of disjoint pairs do not share a wire (a fabric that does is probed
    apart: :func:`profile_fabric`). A fit that fails (timings too noisy to grow with size,
    as on an idle loopback) falls back to alpha = fastest probe and beta from the largest
    probe. Every tensor lives on ``world.device`` (NCCL takes no CPU tensors)."""
    p, device = world.world_size, world.device
    alpha, beta = np.zeros((p, p)), np.ones((p, p))
    reply = torch.zeros(1, dtype=torch.uint8, device=device)
    payloads = [torch.zeros(size, dtype=torch.uint8, device=device) for size in sizes]
    for pairs in round_robin(p):
        pair = next((pair for pair in pairs if world.rank in pair), None)
        if pair is None:
            continue  # this rank sits this round out (odd P)
        for src, dst in (pair, pair[::-1]):
            times = [_ping_pong(world, src, dst, payload, reply, repeats) for payload in payloads]
            if world.rank == src:
                try:
                    alpha[src, dst], beta[src, dst] = fit_alpha_beta(sizes, times)
                except ValueError:
                    alpha[src, dst] = min(times)
                    beta[src, dst] = sizes[-1] / max(times[-1], 1e-9)
    # Each sender measured its own links: summing the matrices shares them with everyone.
    mine = ~np.eye(p, dtype=bool) & (np.arange(p)[:, None] == world.rank)
    packed = np.stack([np.where(mine, alpha, 0.0), np.where(mine, beta, 0.0)])
    packed_t = torch.tensor(packed, dtype=torch.float64, device=device)
    dist.all_reduce(packed_t)
    alpha, beta = packed_t.cpu().numpy()
    np.fill_diagonal(beta, 1.0)
    return LinkModel(alpha, beta)


def _ping_pong(
    world: World, src: int, dst: int, payload: torch.Tensor, reply: torch.Tensor, repeats: int
) -> float:
    """Seconds for ``payload`` from src to dst and one byte back (the fastest of
    ``repeats``; src's figure, the other's is meaningless); a no-op elsewhere."""
    best = math.inf
    for _ in range(repeats):
        if world.rank == src:
            world.synchronize()  # device work queued before does not count
            t0 = time.perf_counter()
            dist.send(payload, dst)
            dist.recv(reply, dst)
            world.synchronize()
            best = min(best, time.perf_counter() - t0)
        elif world.rank == dst:
            dist.recv(payload, src)
            dist.send(reply, src)
    return best


def host_of_rank(world: World) -> np.ndarray:
    """int64 [P]: a host index per rank, in order of first appearance (collective).

    A rank's host is torchrun's node (``GROUP_RANK``: one agent per host, also in an
    emulated cluster whose namespaces share one hostname), else its hostname."""
    node = os.environ.get("GROUP_RANK")
    name = f"node-{node}" if node is not None else socket.gethostname()
    mine = torch.tensor([zlib.crc32(name.encode())], dtype=torch.int64, device=world.device)
    every = [torch.zeros_like(mine) for _ in range(world.world_size)]
    dist.all_gather(every, mine)
    return hosts_from_names([int(t.item()) for t in every])


def hosts_from_names(names: list) -> np.ndarray:
    """Host indices 0, 1, ... for a list of per-rank host names, by first appearance."""
    index: dict = {}
    return np.array([index.setdefault(n, len(index)) for n in names], dtype=np.int64)


FABRIC_PROBE_BYTES = 1_048_576
"""Bytes per probe channel between two ranks on the fastest hosts (slower hosts' channels
carry proportionally less), as large as a profiled link's largest probes need to reach
their sustained rate."""

FABRIC_MARGIN = 1.15
"""An all-to-all this much slower than the NICs predict is fabric-bound; below it, the
difference is taken for noise and the fabric left unbounded."""


def fabric_probe(hosts: np.ndarray, beta_out: np.ndarray, beta_in: np.ndarray) -> np.ndarray:
    """int64 [P, P]: bytes each rank sends each other rank in the fabric probe.

    A channel between hosts carries ``FABRIC_PROBE_BYTES`` scaled by the slower of the
    sender's send and the receiver's receive rate relative to the fastest pair; then the
    channels of a host whose NIC would stay busy longer than the least busy host's are
    shortened to match, so that no single NIC sets the probe's time (a slow host would
    otherwise hide the fabric). Channels within a host carry nothing.
    """
    src, dst = np.meshgrid(hosts, hosts, indexing="ij")
    remote = src != dst
    rate = np.minimum(beta_out[src], beta_in[dst])
    volume = FABRIC_PROBE_BYTES * rate / rate.max() * remote
    busy = _nic_seconds(hosts, volume, beta_out, beta_in)
    if remote.any():
        share = np.where(busy > 0, busy[busy > 0].min() / np.maximum(busy, 1e-300), 1.0)
        volume = volume * np.minimum(share[src], share[dst])
    return np.where(remote, np.maximum(np.floor(volume), 1), 0).astype(np.int64)


def _nic_seconds(
    hosts: np.ndarray, volume: np.ndarray, beta_out: np.ndarray, beta_in: np.ndarray
) -> np.ndarray:
    """float64 [H]: seconds each host's busier NIC direction needs for ``volume`` [P, P]
    (bytes between ranks; the caller zeroes channels within a host)."""
    num_hosts = beta_out.size
    out = np.bincount(hosts, weights=volume.sum(1), minlength=num_hosts)
    into = np.bincount(hosts, weights=volume.sum(0), minlength=num_hosts)
    return np.maximum(out / beta_out, into / beta_in)


def fabric_rate(model: HostModel, volume: np.ndarray, seconds: float) -> float:
    """Aggregate bytes per second of the fabric, given that the all-to-all ``volume``
    [P, P] took ``seconds``: ``inf`` unless that is over ``FABRIC_MARGIN`` times what the
    NICs alone predict (pure)."""
    hosts = model.host_of_rank
    remote = hosts[:, None] != hosts[None, :]
    total = float(volume[remote].sum())
    if total == 0:
        return math.inf
    nics = float(_nic_seconds(hosts, volume * remote, model.beta_out_Bps, model.beta_in_Bps).max())
    if seconds - model.alpha_s <= FABRIC_MARGIN * nics:
        return math.inf
    return total / (seconds - model.alpha_s)


def profile_fabric(model: HostModel, world: World, repeats: int = 3) -> float:
    """Times ``fabric_probe`` as one all-to-all (fastest of ``repeats``, slowest rank)
    and returns ``fabric_rate`` (collective; the same on every rank; tensors on
    ``world.device``)."""
    volume = fabric_probe(model.host_of_rank, model.beta_out_Bps, model.beta_in_Bps)
    rank, device = world.rank, world.device
    send = torch.zeros(int(volume[rank].sum()), dtype=torch.uint8, device=device)
    recv = torch.empty(int(volume[:, rank].sum()), dtype=torch.uint8, device=device)
    best = math.inf
    for _ in range(repeats):
        dist.barrier()
        world.synchronize()
        start = time.perf_counter()
        dist.all_to_all_single(recv, send, volume[:, rank].tolist(), volume[rank].tolist())
        world.synchronize()
        took = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        best = min(best, float(took.item()))
    return fabric_rate(model, volume, best)


def host_model(
    links: LinkModel,
    hosts: np.ndarray,
    quant_s_per_value: dict[int, float],
    dequant_s_per_value: dict[int, float],
    fabric_Bps: float = math.inf,
    cpu_scale: np.ndarray | None = None,
) -> HostModel:
    """A ``HostModel`` from a per-pair profile (see the module docstring)."""
    p = links.num_ranks
    num_hosts = int(hosts.max()) + 1
    src, dst = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    remote = hosts[src] != hosts[dst]
    local = (hosts[src] == hosts[dst]) & (src != dst)
    fallback = float(np.median(links.beta_Bps[src != dst])) if p > 1 else 1e9
    beta_out, beta_in = np.full(num_hosts, fallback), np.full(num_hosts, fallback)
    for h in range(num_hosts):
        leaving = remote & (hosts[src] == h)
        entering = remote & (hosts[dst] == h)
        if leaving.any():
            beta_out[h] = float(np.median(links.beta_Bps[leaving]))
        if entering.any():
            beta_in[h] = float(np.median(links.beta_Bps[entering]))
    # Per-exchange latency: of the network if any channel crosses it, else of local copies.
    pairs = remote if remote.any() else local
    alpha = float(np.median(links.alpha_s[pairs])) if pairs.any() else 0.0
    beta_local = float(np.median(links.beta_Bps[local])) if local.any() else float("inf")
    return HostModel(
        hosts,
        alpha,
        beta_out,
        beta_in,
        beta_local,
        quant_s_per_value={**quant_s_per_value, FULL_PRECISION_BITS: 0.0},
        dequant_s_per_value={**dequant_s_per_value, FULL_PRECISION_BITS: 0.0},
        fabric_Bps=fabric_Bps,
        cpu_scale=cpu_scale,
    )


def time_quantization(
    widths: tuple[int, ...],
    dim: int,
    world: World,
    rows: int = 2048,
    repeats: int = 3,
    sustain_s: float = SUSTAIN_S,
) -> tuple[dict[int, float], dict[int, float], np.ndarray]:
    """(De)quantization timed on every rank at once (collective; module docstring).

    Returns seconds per value to quantize and to dequantize at each width, the fastest
    rank's (each the fastest of ``repeats`` bursts), and float64 ``[P]``: each rank's
    sustained time, (de)quantizing every width in turn for ``sustain_s``, over the time
    those figures give for the same work (at least 1). The rows live on
    ``world.device``, and every timing waits for the device's work (``synchronize``),
    so that an asynchronous device is timed at its work, not at its launches."""
    device, clock = world.device, _stopwatch(world)
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, dim, generator=generator, device=device)
    plans, bufs, figures = [], [], []
    out = torch.empty_like(x)
    for bits in widths:
        plan = torch.full((rows,), bits, dtype=torch.int8, device=device)
        buf = torch.empty(mixed_buffer_bytes(plan, dim), dtype=torch.uint8, device=device)
        best_q = best_d = math.inf
        for _ in range(repeats):
            t0 = clock()
            quantize_mixed(x, plan, out=buf)
            t1 = clock()
            dequantize_mixed(buf, plan, dim, out=out)
            t2 = clock()
            best_q, best_d = min(best_q, t1 - t0), min(best_d, t2 - t1)
        figures += [best_q / x.numel(), best_d / x.numel()]
        plans.append(plan)
        bufs.append(buf)
    dist.barrier()  # every rank sustains at once, as in training
    rounds, start = 0, clock()
    while True:
        for plan, buf in zip(plans, bufs, strict=True):
            quantize_mixed(x, plan, out=buf)
            dequantize_mixed(buf, plan, dim, out=out)
        rounds += 1
        sustained = clock() - start
        if sustained >= sustain_s:
            break
    mine = torch.tensor(
        [*figures, sustained / (rounds * x.numel())], dtype=torch.float64, device=device
    )
    every = [torch.zeros_like(mine) for _ in range(world.world_size)]
    dist.all_gather(every, mine)
    table = torch.stack(every).cpu().numpy()  # [P, 2W + 1]
    fastest = table[:, :-1].min(axis=0)
    quant = {b: float(fastest[2 * i]) for i, b in enumerate(widths)}
    dequant = {b: float(fastest[2 * i + 1]) for i, b in enumerate(widths)}
    scale = np.maximum(table[:, -1] / fastest.sum(), 1.0)
    return quant, dequant, scale


def _stopwatch(world: World):
    """``perf_counter`` after the device's queued work is done (a sync point on CUDA,
    free on CPU)."""

    def clock() -> float:
        world.synchronize()
        return time.perf_counter()

    return clock
