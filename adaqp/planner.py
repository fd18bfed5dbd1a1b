"""Adaptive bit widths across ranks: tracing, link profiling, solving, and installing plans.

Every tagged exchange (layer, direction) is planned on its own. Per message v the
variance weight is ``w_v = s_v · D · E[(M_v - m_v)²] / 4``: ``s_v`` is the sum of the
receiver's squared aggregation coefficients over the rows that read v (forward; shipped
once from receivers to senders), or 1 for gradients (the owner adds them unscaled);
the squared range is traced on the sender during each assignment cycle.

At the end of every ``assign_cycle`` epochs the ranks send their weights to rank 0,
which solves every exchange with ``adaqp.assigner`` (a pure function) against the
alpha-beta link model profiled at start-up, and broadcasts all per-message widths in
one buffer. Every rank installs the same plans before the next epoch, so all ranks
switch together. The first cycle runs at ``initial_bits`` while tracing.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
import torch.distributed as dist

from adaqp.assigner import (
    Channel,
    LinkModel,
    fit_alpha_beta,
    random_assignment,
    solve_assignment,
)
from adaqp.comm import BitPlan, HaloExchanger
from adaqp.config import QuantConfig
from adaqp.layers import Propagation
from adaqp.runtime import World

logger = logging.getLogger(__name__)

PROFILE_SIZES = (4_096, 65_536, 524_288)
"""Bytes per probe transfer when profiling links."""


def profile_links(
    world: World, sizes: tuple[int, ...] = PROFILE_SIZES, repeats: int = 3
) -> LinkModel:
    """Times ping-pongs between every ordered pair of ranks and fits alpha/beta per pair.

    Each pair runs alone (the others proceed to their own pairs), so the figures are
    per-link, not shared. A fit that fails (timings too noisy to grow with size, as on an
    idle loopback) falls back to alpha = fastest probe and beta from the largest probe.
    """
    p = world.world_size
    alpha, beta = np.zeros((p, p)), np.ones((p, p))
    reply = torch.zeros(1, dtype=torch.uint8)
    for src in range(p):
        for dst in range(p):
            if src == dst or world.rank not in (src, dst):
                continue
            times = []
            for size in sizes:
                payload = torch.zeros(size, dtype=torch.uint8)
                best = float("inf")
                for _ in range(repeats):
                    if world.rank == src:
                        t0 = time.perf_counter()
                        dist.send(payload, dst)
                        dist.recv(reply, dst)
                        best = min(best, time.perf_counter() - t0)
                    else:
                        dist.recv(payload, src)
                        dist.send(reply, src)
                times.append(best)
            if world.rank == src:
                try:
                    alpha[src, dst], beta[src, dst] = fit_alpha_beta(sizes, times)
                except ValueError:
                    alpha[src, dst] = min(times)
                    beta[src, dst] = sizes[-1] / max(times[-1], 1e-9)
    # Each sender measured its own links: summing the matrices shares them with everyone.
    mine = ~np.eye(p, dtype=bool) & (np.arange(p)[:, None] == world.rank)
    packed = torch.tensor(np.stack([np.where(mine, alpha, 0.0), np.where(mine, beta, 0.0)]))
    dist.all_reduce(packed)
    alpha, beta = packed[0].numpy(), packed[1].numpy()
    np.fill_diagonal(beta, 1.0)
    return LinkModel(alpha, beta)


def _direction(tag: str) -> str:
    """``forward`` for feature exchanges ("layer1/forward"), ``backward`` for gradients."""
    return "forward" if tag.endswith("/forward") else "backward"


class BitWidthPlanner:
    """Installs bit plans on ``exchanger`` and re-solves them every ``assign_cycle`` epochs.

    Args:
        config: the quant section.
        exchanger: this rank's halo transport (plans and tracer are set on it).
        propagation: gives the receiver-side aggregation coefficients.
        world: rank and world size.
    """

    def __init__(
        self, config: QuantConfig, exchanger: HaloExchanger, propagation: Propagation, world: World
    ):
        self.config = config
        self.exchanger = exchanger
        self.world = world
        p = world.world_size
        counts = torch.tensor([exchanger.send_counts, exchanger.recv_counts], dtype=torch.int64)
        gathered = [torch.zeros_like(counts) for _ in range(p)]
        dist.all_gather(gathered, counts)
        # counts[tag direction][src][dst]: messages src sends dst in that direction.
        self.counts = {
            "forward": np.stack([g[0].numpy() for g in gathered]),
            "backward": np.stack([g[1].numpy() for g in gathered]),
        }
        self.traces: dict[str, list] = {}
        self.link_model = None
        self.forward_coef = None
        self.last_status: dict[str, str] = {}
        self.cost_model = config.cost_model
        if config.scheme == "adaptive":
            self.forward_coef = self._forward_coefficients(propagation)
            exchanger.stats.reset()
            self.link_model = profile_links(world)
            if world.is_main:
                off = ~np.eye(p, dtype=bool)
                logger.info(
                    "links: alpha %.1f-%.1f us, beta %.2f-%.2f GB/s",
                    1e6 * self.link_model.alpha_s[off].min(),
                    1e6 * self.link_model.alpha_s[off].max(),
                    self.link_model.beta_Bps[off].min() / 1e9,
                    self.link_model.beta_Bps[off].max() / 1e9,
                )
        exchanger.default_plan = self._default_plan

    def _forward_coefficients(self, propagation: Propagation) -> torch.Tensor:
        """Σ_u c_uv² per message this rank sends (float64 [S], aligned with send_idx)."""
        adj = propagation.adjacency.forward
        graph = propagation.graph
        squares = torch.zeros(graph.num_inner + graph.num_halo, dtype=torch.float64)
        squares.index_add_(0, adj.col_indices().cpu(), adj.values().double().cpu() ** 2)
        halo = squares[graph.num_inner :].to(torch.float32).view(-1, 1)
        self.exchanger.step = "set-up (aggregation coefficients)"
        return self.exchanger.start_grad(halo, tag="set-up/coefficients").wait()[:, 0].double()

    def _default_plan(self, tag: str, out_rows: int, in_rows: int) -> BitPlan:
        width = self.config.bits if self.config.scheme == "uniform" else self.config.initial_bits
        device = self.exchanger.send_idx.device
        return BitPlan(
            torch.full((out_rows,), width, dtype=torch.int8, device=device),
            torch.full((in_rows,), width, dtype=torch.int8, device=device),
        )

    def training(self, on: bool) -> None:
        """Quantize (and trace, unless uniform) during training steps only."""
        self.exchanger.quantize = on
        tracing = on and self.config.scheme != "uniform"
        self.exchanger.tracer = self._trace if tracing else None

    def _trace(self, tag: str, rows_RD: torch.Tensor) -> None:
        if rows_RD.shape[1] == 0:
            return
        squared = ((rows_RD.amax(1) - rows_RD.amin(1)).double() ** 2).detach().cpu()
        entry = self.traces.get(tag)
        if entry is None:
            self.traces[tag] = [squared, 1, rows_RD.shape[1]]
        else:
            entry[0] += squared
            entry[1] += 1

    def end_epoch(self, epoch: int) -> float:
        """Re-solves after every ``assign_cycle``-th epoch; returns the seconds it took."""
        if self.config.scheme == "uniform" or epoch % self.config.assign_cycle:
            return 0.0
        start = time.perf_counter()
        self._resolve(epoch)
        return time.perf_counter() - start

    def _weights(self, tag: str) -> np.ndarray:
        squared, cycles, dim = self.traces[tag]
        weights = (squared / cycles) * dim / 4.0
        if _direction(tag) == "forward" and self.forward_coef is not None:  # None: random scheme
            weights = weights * self.forward_coef
        return weights.numpy()

    def _resolve(self, epoch: int) -> None:
        p, rank = self.world.world_size, self.world.rank
        tags = sorted(self.traces)
        check = torch.tensor([len(tags), -len(tags)], dtype=torch.int64)
        dist.all_reduce(check, op=dist.ReduceOp.MIN)
        if check[0] != len(tags) or -check[1] != len(tags):
            raise RuntimeError(f"rank {rank}: ranks traced different exchanges ({tags})")
        blocks = []
        for tag in tags:
            counts = self.counts[_direction(tag)]
            weights = torch.from_numpy(self._weights(tag))
            longest = int(counts.sum(1).max())
            padded = torch.zeros(longest, dtype=torch.float64)
            padded[: len(weights)] = weights
            gathered = [torch.zeros_like(padded) for _ in range(p)] if rank == 0 else None
            dist.gather(padded, gathered, dst=0)
            if rank == 0:
                blocks.append(self._solve(tag, counts, gathered, epoch))
        total = sum(int(self.counts[_direction(t)].sum()) for t in tags)
        flat = torch.cat(blocks) if rank == 0 else torch.empty(total, dtype=torch.uint8)
        dist.broadcast(flat, src=0)
        self._install(tags, flat)
        self.traces = {}

    def _solve(
        self, tag: str, counts: np.ndarray, gathered: list[torch.Tensor], epoch: int
    ) -> torch.Tensor:
        """Rank 0: widths of every channel of one exchange, in (src, dst) order."""
        p = self.world.world_size
        dim = self.traces[tag][2]
        channels = []
        for src in range(p):
            offsets = np.concatenate([[0], np.cumsum(counts[src])])
            for dst in range(p):
                if src != dst:
                    weights = gathered[src][offsets[dst] : offsets[dst + 1]].numpy()
                    channels.append(Channel(src, dst, weights))
        cfg = self.config
        if cfg.scheme == "random":
            result = random_assignment(channels, dim, cfg.allowed_bits, cfg.seed + epoch)
            widths = result.bits
        else:
            solve_channels, link_model = channels, self.link_model
            if self.cost_model != "link":
                solve_channels, link_model, members = _merge(
                    channels, self.link_model, shared=self.cost_model == "shared"
                )
            result = solve_assignment(
                solve_channels,
                dim,
                link_model,
                bits=cfg.allowed_bits,
                group_size=cfg.group_size,
                lam=cfg.lam,
                method=cfg.solver,
                time_limit_s=cfg.time_limit_s,
            )
            widths = result.bits
            if self.cost_model != "link":
                widths = _split(result.bits, members, channels)
        self.last_status[tag] = result.status
        logger.info(
            "epoch %d %s: avg %.2f bits (%s, %s, %.3fs)",
            epoch,
            tag,
            result.avg_bits,
            result.method,
            result.status,
            result.solve_time_s,
        )
        return torch.from_numpy(np.concatenate([b.astype(np.uint8) for b in widths]))

    def _install(self, tags: list[str], flat: torch.Tensor) -> None:
        p, rank = self.world.world_size, self.world.rank
        device = self.exchanger.send_idx.device
        offset = 0
        for tag in tags:
            counts = self.counts[_direction(tag)]
            channel = {}
            for src in range(p):
                for dst in range(p):
                    if src != dst:
                        n = int(counts[src, dst])
                        channel[src, dst] = flat[offset : offset + n]
                        offset += n
            empty = torch.zeros(0, dtype=torch.uint8)
            out_bits = torch.cat([channel.get((rank, dst), empty) for dst in range(p)])
            in_bits = torch.cat([channel.get((src, rank), empty) for src in range(p)])
            self.exchanger.plans[tag] = BitPlan(
                out_bits.to(torch.int8).to(device), in_bits.to(torch.int8).to(device)
            )


def _merge(channels: list[Channel], links: LinkModel, shared: bool):
    """Channels that share one link become one channel (their bytes add up).

    ``shared``: every channel shares one resource (ranks on one host); otherwise each
    sender's channels share its link. A merged channel is filed under ``(src, src + 1)``
    with the median latency and bandwidth of the pairs it covers: each pair was profiled
    alone, i.e. at the full rate of the shared link. Returns the merged channels, their
    link model, and the member channels (in order) of each merged channel.
    """
    p = links.num_ranks
    alpha, beta = np.zeros((p, p)), np.ones((p, p))
    groups: dict[int, list[Channel]] = {}
    for c in channels:
        groups.setdefault(0 if shared else c.src, []).append(c)
    merged, members = [], []
    for src, group in sorted(groups.items()):
        dst = (src + 1) % p
        pairs = tuple(zip(*[(c.src, c.dst) for c in group], strict=True))
        alpha[src, dst] = float(np.median(links.alpha_s[pairs]))
        beta[src, dst] = float(np.median(links.beta_Bps[pairs]))
        merged.append(Channel(src, dst, np.concatenate([c.weights for c in group])))
        members.append(group)
    return merged, LinkModel(alpha, beta), members


def _split(
    merged_bits: tuple[np.ndarray, ...], members: list[list[Channel]], channels: list[Channel]
) -> list[np.ndarray]:
    """Inverse of ``_merge`` for the widths: per original channel, in the original order."""
    widths = {}
    for bits, group in zip(merged_bits, members, strict=True):
        offset = 0
        for c in group:
            widths[c.src, c.dst] = bits[offset : offset + c.num_messages]
            offset += c.num_messages
    return [widths[c.src, c.dst] for c in channels]
