"""Hosts for the ``host`` cost model: which rank runs where, how fast each host's network
link is, and what (de)quantization costs per value.

The host of a rank is torchrun's node (``GROUP_RANK``: one agent per host, also in an
emulated cluster whose namespaces share one hostname), else its hostname. Link rates come
from the per-pair profile (``planner.profile_links``, each pair timed alone): a host's
send rate is the median over pairs leaving it, its receive rate the median over pairs
entering it, and copies between two ranks of one host run at the median of those pairs.
(De)quantization is timed on every rank and the slowest rank's figure is used.
"""

from __future__ import annotations

import os
import socket
import time
import zlib

import numpy as np
import torch
import torch.distributed as dist

from adaqp.assigner import FULL_PRECISION_BITS, HostModel, LinkModel
from adaqp.quant import dequantize_mixed, mixed_buffer_bytes, quantize_mixed


def host_of_rank(world_size: int) -> np.ndarray:
    """int64 [P]: a host index per rank, in order of first appearance (collective)."""
    node = os.environ.get("GROUP_RANK")
    name = f"node-{node}" if node is not None else socket.gethostname()
    mine = torch.tensor([zlib.crc32(name.encode())], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine)
    return hosts_from_names([int(t.item()) for t in every])


def hosts_from_names(names: list) -> np.ndarray:
    """Host indices 0, 1, ... for a list of per-rank host names, by first appearance."""
    index: dict = {}
    return np.array([index.setdefault(n, len(index)) for n in names], dtype=np.int64)


def host_model(
    links: LinkModel,
    hosts: np.ndarray,
    quant_s_per_value: dict[int, float],
    dequant_s_per_value: dict[int, float],
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
    )


def time_quantization(
    widths: tuple[int, ...], dim: int, device, rows: int = 2048, repeats: int = 3
) -> tuple[dict[int, float], dict[int, float]]:
    """Seconds per value to quantize and to dequantize at each width, on this rank (the
    fastest of ``repeats``), then the slowest rank's (collective)."""
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, dim, generator=generator, device=device)
    figures = []
    for bits in widths:
        plan = torch.full((rows,), bits, dtype=torch.int8, device=device)
        buf = torch.empty(mixed_buffer_bytes(plan, dim), dtype=torch.uint8, device=device)
        out = torch.empty_like(x)
        best_q = best_d = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            quantize_mixed(x, plan, generator, out=buf)
            t1 = time.perf_counter()
            dequantize_mixed(buf, plan, dim, out=out)
            t2 = time.perf_counter()
            best_q, best_d = min(best_q, t1 - t0), min(best_d, t2 - t1)
        figures += [best_q / x.numel(), best_d / x.numel()]
    slowest = torch.tensor(figures, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    values = slowest.tolist()
    quant = {b: values[2 * i] for i, b in enumerate(widths)}
    dequant = {b: values[2 * i + 1] for i, b in enumerate(widths)}
    return quant, dequant
