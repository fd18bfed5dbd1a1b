"""Adaptive bit widths across ranks: tracing, link profiling, solving, and installing plans.

Every exchange (layer, direction) is planned on its own; the planner belongs to the
adaptive exchange policy (``adaqp/exchange/policy.py``), which asks it for plans and hands
it the rows to trace. Per message v the variance weight is ``w_v = s_v · D · E[(M_v -
m_v)²] / 4``: ``s_v`` is the sum of the receiver's squared aggregation coefficients over
the rows that read v (forward; shipped once from receivers to senders), or 1 for
gradients (the owner adds them unscaled); the squared range is traced on the sender
during each assignment cycle. The plans, the traces and the buffer that carries plans to
every rank are kept by a :class:`~adaqp.exchange.plan_book.PlanBook`.

After the first cycle (``first_cycle`` epochs) and every ``assign_cycle`` epochs after it
the ranks send their weights to rank 0, which solves every exchange with ``adaqp.assign``
(a pure function) against the alpha-beta link model profiled at start-up
(``adaqp.assign.profile``), and broadcasts all per-message widths in one buffer. Every
rank installs the same plans before the next epoch, so all ranks switch together. The
first cycle runs at the run's uniform width (``quant.bits``, unless ``initial_bits`` is
set) while tracing, so that it costs what the uniform scheme costs.

Which pairs send float32 is ``quant.full_precision``'s: under ``auto`` (the default) the
messages between ranks of one host travel as float32 in every plan, uniform or solved,
and only the channels between hosts are planned, so the same command gives the same
numerics on any machine and under any load; ``never`` plans every channel; under
``profile`` (and the host cost model) either scheme sends an exchange's uniform plan as
float32 where a start-up profile predicts that no slower, and the adaptive scheme has
float32 among its widths. Each solve minimises the
predicted time its exchange's overlap window does not hide within a variance budget
relative to that uniform width (``adaqp.assign.problem``); the window is estimated from
the waits measured under the plan that ran (``MeasuredExchanges.window_s``). When to
re-solve and how long each solve may take are :mod:`adaqp.exchange.resolving`'s. Which
cost model prices the plans, and what that means for profiling, solving and reporting, is
decided once, by the run's ``adaqp.assign.CostModelKind`` (``cost_kind``).

The cost model prices an exchange from the profiled links; what it does not see is
measured: each re-solve fits the model's figures to the exchange times measured under
the last ``CALIBRATION_PLANS`` plans and states the new plans' times through it
(:class:`~adaqp.exchange.resolving.MeasuredExchanges`).

The profiling functions (``profile_links``, ``time_quantization``, ``profile_fabric``) and
``solve_exchange`` are called through this module's names, so that a test can pin them
(``tests/run/test_checkpoint.py`` does, to repeat runs bit for bit).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np
import torch
import torch.distributed as dist

from adaqp.assign import (
    CHECK_SIZES,
    PROFILE_SIZES,
    Channel,
    HostModel,
    LinkModel,
    cost_model_kind,
    host_model,
    host_of_rank,
    profile_fabric,
    profile_links,
    random_assignment,
    solve_exchange,
    time_quantization,
)
from adaqp.config import QuantConfig
from adaqp.exchange.first_plans import FirstPlans
from adaqp.exchange.plan_book import PlanBook, forward_coefficients, gather_counts
from adaqp.exchange.resolving import MeasuredExchanges, budget_share, solves_before
from adaqp.exchange.transport import BitPlan, ExchangeKey, HaloTransport
from adaqp.graph.aggregate import SparseAdjacency
from adaqp.graph.local import LocalGraph
from adaqp.quant.bits import FULL_PRECISION_BITS, SUPPORTED_BITS
from adaqp.runtime import World

logger = logging.getLogger(__name__)


class BitWidthPlanner:
    """Owns the bit plans of a quantized mode and re-solves them after the first cycle and
    every ``assign_cycle`` epochs after it.

    Args:
        config: the quant section.
        transport: this rank's halo transport (used for the start-up exchanges only).
        graph: this rank's local graph.
        adjacency: its aggregation matrix (receiver-side coefficients).
        world: rank and world size.
    """

    def __init__(
        self,
        config: QuantConfig,
        transport: HaloTransport,
        graph: LocalGraph,
        adjacency: SparseAdjacency,
        world: World,
    ):
        self.config = config
        self.world = world
        self.device = graph.device
        self.transport = transport
        self.counts, sent = gather_counts(transport, world.world_size, self.device)
        """Per direction, int ``[P, P]``: ``counts[src, dst]`` messages src sends dst in
        a whole exchange (evaluation's; the plans' layout)."""
        self.book = PlanBook(self.counts, world.rank, self.device, transport.kernels)
        """This rank's plans and traces (``adaqp.exchange.plan_book``)."""
        self.cost_kind = cost_model_kind(config)
        """Which cost model plans (``adaqp.assign.kinds``): what is profiled, solved with
        and reported."""
        self.link_model: LinkModel | None = None
        self.host_model: HostModel | None = None
        self.hosts = host_of_rank(world)
        """int64 ``[P]``: the host of each rank (torchrun's node, else the hostname)."""
        self.first = FirstPlans(config, self.hosts, self.counts, world.rank, sent)
        """The plans before anything is solved, float32 within a host by default."""
        self.forward_coef = None
        self.last_status: dict[str, str] = {}
        self._said_full_precision = False
        self.solutions: dict[int, dict[str, dict[str, float]]] = {}
        """Rank 0, per re-solve epoch: ``"predicted_s"`` (tag -> the cost model's time of
        its plan), ``"pair_bits"`` ("src->dst" -> mean planned width, all exchanges), and
        once measured exchanges are there ``"calibration"`` (``fit_calibration``'s, on the
        plans before) and ``"calibrated_s"`` (tag -> the plan's time through it)."""
        self.measured = MeasuredExchanges()
        """Rank 0, with a cost model: the exchanges measured under the plans that ran."""
        self.windows: dict[int, dict[str, float]] = {}
        """Rank 0, per re-solve epoch: tag -> the overlap window the solve assumed, in the
        cost model's seconds."""
        if config.scheme == "adaptive":
            self.forward_coef = forward_coefficients(transport, graph, adjacency, self.device)
        if world.is_main:
            self.first.say()
        if self.cost_kind.profiles_links:
            self._profile()

    def _profile(self) -> None:
        """Profiles the links (and for the host model the hosts) of every rank (collective)."""
        world = self.world
        p = world.world_size
        # Planning by pair needs every probe size; choosing between the uniform width and
        # float32 (the uniform scheme), two. One repeat each either way: the calibration
        # fitted to the measured exchanges absorbs a probe's noise, and repeats of the
        # 4 MB probe on a slow link cost seconds, paid before training.
        started = time.perf_counter()
        sizes = PROFILE_SIZES if self.cost_kind.plans_by_pair else CHECK_SIZES
        self.link_model = profile_links(world, sizes, repeats=1)
        if self.cost_kind.profiles_hosts:
            # Every width the wire carries: the first cycle's (the uniform width) is
            # priced too, allowed or not.
            quant, dequant, scale = time_quantization(SUPPORTED_BITS, 64, world)
            nics = host_model(self.link_model, self.hosts, quant, dequant, cpu_scale=scale)
            fabric = profile_fabric(nics, world, repeats=1)
            self.host_model = dataclasses.replace(nics, fabric_Bps=fabric)
            if world.is_main:
                logger.info(
                    "hosts %s: send %s, receive %s MB/s, all hosts at once %s, local "
                    "copies %.0f MB/s; (de)quantization %s ns/value, sustained on each "
                    "rank's CPU %sx that",
                    self.hosts.tolist(),
                    np.round(self.host_model.beta_out_Bps / 1e6).tolist(),
                    np.round(self.host_model.beta_in_Bps / 1e6).tolist(),
                    "unbounded" if math.isinf(fabric) else f"{fabric / 1e6:.0f} MB/s",
                    self.host_model.beta_local_Bps / 1e6,
                    {b: round(1e9 * (quant[b] + dequant[b]), 1) for b in quant},
                    np.round(self.host_model.cpu_scale, 2).tolist(),
                )
        if world.is_main:
            off = ~np.eye(p, dtype=bool)
            logger.info(
                "links: alpha %.1f-%.1f us, beta %.2f-%.2f GB/s (profiled in %.1f s)",
                1e6 * self.link_model.alpha_s[off].min(),
                1e6 * self.link_model.alpha_s[off].max(),
                self.link_model.beta_Bps[off].min() / 1e9,
                self.link_model.beta_Bps[off].max() / 1e9,
                time.perf_counter() - started,
            )

    @property
    def tracing(self) -> bool:
        """Whether training exchanges are traced (every scheme but uniform)."""
        return self.config.scheme != "uniform"

    @property
    def plans(self) -> dict[ExchangeKey, BitPlan]:
        """The installed plans (a copy)."""
        return dict(self.book.plans)

    def plan(self, key: ExchangeKey, out_rows: int, in_rows: int, dim: int) -> BitPlan:
        """The plan of a training exchange of ``dim``-wide rows: the solved one, else the
        first cycle's (``_first_widths``)."""
        plan = self.book.plan(
            key, lambda: self.first.plan(key, self._first_widths(key, dim), self.device)
        )
        if plan.out_bits.numel() != out_rows or plan.in_bits.numel() != in_rows:
            raise RuntimeError(
                f"rank {self.world.rank}: {key} sends {out_rows} rows and receives {in_rows}, "
                f"but its plan has {plan.out_bits.numel()} and {plan.in_bits.numel()}"
            )
        return plan

    def _first_widths(self, key: ExchangeKey, dim: int, say: bool = True) -> np.ndarray:
        """int8 ``[P, P]``: ``key``'s first widths by pair (``FirstPlans.widths``; the
        host model's prediction under ``quant.full_precision = "profile"``)."""
        profile = self.host_model if self.cost_kind.offers_full_precision else None
        return self.first.widths(key, dim, profile, say)

    def trace(
        self, key: ExchangeKey, rows_RD: torch.Tensor, squared: torch.Tensor | None = None
    ) -> None:
        """Accumulates the squared row ranges of one outgoing block (``squared``: as the
        quantizer read them, where it did)."""
        self.book.trace(key, rows_RD, squared)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plans, traces of the current cycle and the link model (for checkpoints)."""
        state = self.book.state_dict()
        if self.cost_kind.profiles_links:
            state["links/alpha"] = torch.from_numpy(self.link_model.alpha_s.copy())
            state["links/beta"] = torch.from_numpy(self.link_model.beta_Bps.copy())
        if self.cost_kind.profiles_hosts:
            quant, dequant = self.host_model.quant_s_per_value, self.host_model.dequant_s_per_value
            state["hosts/costs"] = torch.tensor(
                [[b, quant[b], dequant[b]] for b in sorted(quant)], dtype=torch.float64
            )
            state["hosts/fabric"] = torch.tensor([self.host_model.fabric_Bps], dtype=torch.float64)
            state["hosts/cpu_scale"] = torch.from_numpy(self.host_model.cpu_scale.copy())
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.book.load_state_dict(state)
        if "links/alpha" in state:
            self.link_model = LinkModel(state["links/alpha"].numpy(), state["links/beta"].numpy())
        if "hosts/costs" in state and self.cost_kind.profiles_hosts:
            # The checkpoint's profile, not this start-up's: the run continues as it was.
            rows = state["hosts/costs"].tolist()
            quant, dequant = {int(b): q for b, q, _ in rows}, {int(b): d for b, _, d in rows}
            fabric = float(state["hosts/fabric"]) if "hosts/fabric" in state else math.inf
            scale = state["hosts/cpu_scale"].numpy() if "hosts/cpu_scale" in state else None
            self.host_model = host_model(
                self.link_model, self.hosts, quant, dequant, fabric, cpu_scale=scale
            )

    def end_epoch(
        self,
        epoch: int,
        exchange_s_by_tag: dict[str, float] | None = None,
        wait_s_by_tag: dict[str, float] | None = None,
    ) -> float:
        """Re-solves where ``solves_before`` says; returns the seconds it took.

        ``exchange_s_by_tag``: this epoch's measured exchange times (the same on every
        rank), which calibrate the cost model's figures at the next re-solve;
        ``wait_s_by_tag``: how long the ranks waited for each exchange (the same on every
        rank), which gives its overlap window."""
        if self.cost_kind.plans_by_pair and self.world.is_main:  # what the re-solve reads
            self.measured.record(exchange_s_by_tag or {}, wait_s_by_tag or {})
        earlier = solves_before(epoch, self.config)
        if not self.tracing or earlier is None:
            return 0.0
        start = time.perf_counter()
        every = self.config.profile_every
        if self.cost_kind.plans_by_pair and every and earlier and earlier % every == 0:
            self._profile()
        self._resolve(epoch, first=earlier == 0)
        return time.perf_counter() - start

    def _resolve(self, epoch: int, first: bool) -> None:
        """Gathers every traced exchange's weights on rank 0, which solves them within
        one budget; broadcasts the widths and installs them on every rank (collective)."""
        p, rank = self.world.world_size, self.world.rank
        keys = sorted(self.book.traces, key=str)
        check = torch.tensor([len(keys), -len(keys)], dtype=torch.int64, device=self.device)
        dist.all_reduce(check, op=dist.ReduceOp.MIN)
        if check[0] != len(keys) or -check[1] != len(keys):
            names = [str(k) for k in keys]
            raise RuntimeError(f"rank {rank}: ranks traced different exchanges ({names})")
        if not keys:  # nothing traced (adaqp-s: every exchange stale): the plans stay
            self.measured.restart()
            return
        blocks, calibration = [], None
        # The plans that ran since the last re-solve: none before the first, or after a
        # resume.
        before = self.solutions.get(epoch - self.config.assign_cycle, {}).get("predicted_s", {})
        if rank == 0 and self.cost_kind.plans_by_pair:
            calibration = self.measured.fit(before)
        deadline = time.perf_counter() + self.config.resolve_budget_s
        for i, key in enumerate(keys):
            counts = self.counts[key.direction]
            weights = torch.from_numpy(self._sent_weights(key))
            longest = int(counts.sum(1).max())
            padded = torch.zeros(longest, dtype=torch.float64, device=self.device)
            padded[: len(weights)] = weights.to(self.device)
            gathered = [torch.zeros_like(padded) for _ in range(p)] if rank == 0 else None
            dist.gather(padded, gathered, dst=0)
            if rank == 0:
                limit = budget_share(deadline, len(keys) - i, self.config.time_limit_s)
                ran = self._ran_s(key, before, first)
                blocks.append(self._solve(key, counts, gathered, epoch, limit, ran, calibration))
        total = sum(int(self.counts[k.direction].sum()) for k in keys)
        if rank == 0:
            flat = torch.cat([widths for widths, _ in blocks])
            travels = torch.cat([sent for _, sent in blocks])
            solution = self.solutions.setdefault(epoch, {})
            solution["pair_bits"] = self.book.pair_bits(keys, flat, travels)
            self.measured.state(solution, calibration)
            flat = flat.to(self.device)
        else:
            flat = torch.empty(total, dtype=torch.uint8, device=self.device)
        dist.broadcast(flat, src=0)
        self.book.install(keys, flat.cpu())
        self.measured.restart()

    def _sent_weights(self, key: ExchangeKey) -> np.ndarray:
        """float64 ``[S]``: this rank's variance weight of each message of ``key`` (the
        whole exchange's layout), NaN for those its training exchanges do not send (a
        layer that computes only the rows its loss reads): they are neither solved nor
        priced."""
        weights = self.book.weights(key, self.forward_coef)
        selection = self.transport.selection(key, selected=True)
        if selection is not None:
            sent = np.zeros(weights.size, dtype=bool)
            sent[selection.keep(key.direction.sends_inner)[0].cpu().numpy()] = True
            weights = np.where(sent, weights, np.nan)
        return weights

    def _ran_s(
        self, key: ExchangeKey, before: dict[str, float], first: bool
    ) -> tuple[np.ndarray | None, float | None]:
        """What ran of exchange ``key`` since the last re-solve, for its window: the first
        cycle's widths by pair (priced when solving), else the last solve's prediction
        (None after a resume: unknown)."""
        if first:
            return self._first_widths(key, self.book.dim(key), say=False), None
        return None, before.get(str(key))

    def _solve(
        self,
        key: ExchangeKey,
        counts: np.ndarray,
        gathered: list[torch.Tensor],
        epoch: int,
        time_limit_s: float,
        ran: tuple[np.ndarray | None, float | None],
        calibration: dict | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank 0: widths of every channel of one exchange, in (src, dst) order, and
        whether each message travels in training (bool, the same layout).

        Only the messages that travel are solved and priced (``gathered`` holds NaN for
        the others, which keep the reference width: they never leave). ``ran``: the first
        cycle's widths by pair where that plan ran (else None) and its predicted seconds
        where known; with this cycle's waits and ``calibration`` they give the exchange's
        overlap window. Under ``quant.full_precision = "auto"`` the channels within a host
        are float32 and only the others are solved."""
        p = self.world.world_size
        dim = self.book.dim(key)
        every, sent = [], []
        for src in range(p):
            offsets = np.concatenate([[0], np.cumsum(counts[src])])
            for dst in range(p):
                if src != dst:
                    weights = gathered[src][offsets[dst] : offsets[dst + 1]].cpu().numpy()
                    sent.append(~np.isnan(weights))
                    every.append(Channel(src, dst, weights[sent[-1]]))
        travels = torch.from_numpy(np.concatenate(sent)) if sent else torch.zeros(0, dtype=bool)
        local = [self.first.is_local(c.src, c.dst) for c in every]
        channels = [c for c, within in zip(every, local, strict=True) if not within]
        if not channels:  # every channel within a host: nothing to solve
            widths = torch.full((int(counts.sum()),), FULL_PRECISION_BITS, dtype=torch.uint8)
            return widths, travels
        cfg = self.config
        if cfg.scheme == "random":
            result = random_assignment(channels, dim, cfg.allowed_bits, cfg.seed + epoch)
            widths = result.bits
        else:
            first, ran_s = ran
            if first is not None:  # the first cycle's plan: priced here, by this cycle's model
                ran_s = self.cost_kind.uniform_time(
                    channels,
                    dim,
                    self.link_model,
                    self.host_model,
                    int(first[channels[0].src, channels[0].dst]),
                )
            window = (
                self.measured.window_s(str(key), ran_s, calibration)
                if self.cost_kind.measures_window
                else 0.0
            )
            result, widths = solve_exchange(
                self.cost_kind,
                channels,
                dim,
                self.link_model,
                self.host_model,
                bits=cfg.allowed_bits,
                reference_bits=cfg.bits,
                group_size=cfg.group_size,
                budget=cfg.variance_budget,
                window_s=window,
                method=cfg.solver,
                time_limit_s=time_limit_s,
            )
            self.windows.setdefault(epoch, {})[str(key)] = window
        self.last_status[str(key)] = result.status
        if math.isfinite(result.time_s):
            predicted = self.solutions.setdefault(epoch, {}).setdefault("predicted_s", {})
            predicted[str(key)] = result.time_s
        logger.info(
            "epoch %d %s: avg %.2f bits, %.1f ms predicted, %.1f ms exposed beyond a %.1f ms "
            "window (%s, %s, %.3fs)",
            epoch,
            key,
            result.avg_bits,
            1e3 * result.time_s,
            1e3 * result.exposed_s,
            1e3 * self.windows.get(epoch, {}).get(str(key), 0.0),
            result.method,
            result.status,
            result.solve_time_s,
        )
        if result.avg_bits >= 32 and not self._said_full_precision:
            self._said_full_precision = True  # why, once a run
            logger.info(
                "%s is sent in full precision: the links are faster than quantizing "
                "(quant.cost_model = %s; 'shared' or quant.full_precision = 'never' "
                "quantizes regardless)",
                key,
                cfg.cost_model,
            )
        solved = iter(widths)
        blocks = []
        for travel, within in zip(sent, local, strict=True):
            block = np.full(travel.size, FULL_PRECISION_BITS if within else cfg.bits)
            if not within:
                block[travel] = next(solved)
            blocks.append(block.astype(np.uint8))
        return torch.from_numpy(np.concatenate(blocks)), travels
