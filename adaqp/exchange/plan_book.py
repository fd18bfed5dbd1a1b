"""What the bit-width planner keeps on each rank: the installed plans, the traces they
are solved from, and the layout of the buffer that carries new plans to every rank.

Legend: ``R`` rows of one outgoing block, ``D`` their width; ``S`` messages this rank
sends in one direction (aligned with the transport's ``send_idx``).

Per message v the variance weight is ``w_v = s_v · D · E[(M_v - m_v)²] / 4``:

- ``s_v`` is the sum of the receiver's squared aggregation coefficients over the rows
  that read v (:func:`forward_coefficients`, forward exchanges; shipped once from
  receivers to senders, since only the receiver holds the coefficients), or 1 for
  gradients (the owner adds them unscaled);
- the squared range ``(M_v - m_v)²`` is traced on the sender during each assignment
  cycle (:meth:`PlanBook.trace`) and averaged over the epochs traced. Where the compiled
  quantizer sends the rows in one call it takes every row's minimum and maximum anyway,
  and the trace reads them from it; elsewhere (float32 rows in the plan, the torch path)
  the trace takes a pass of its own, the same bits.

Rank 0 solves every traced exchange and broadcasts all per-message widths in one flat
uint8 buffer: exchanges in sorted order, then channels ``(src, dst)`` in row-major order
(``src != dst``), each channel's messages in its send order. :meth:`PlanBook.install`
reads it back on every rank, so all ranks hold the same plans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist

from adaqp.exchange.transport import SETUP_KEY, BitPlan, Direction, ExchangeKey, HaloTransport
from adaqp.graph.aggregate import SparseAdjacency
from adaqp.graph.local import LocalGraph
from adaqp.quant.kernels import squared_ranges


def forward_coefficients(
    transport: HaloTransport, graph: LocalGraph, adjacency: SparseAdjacency, device
) -> torch.Tensor:
    """Σ_u c_uv² per message this rank sends (float64 ``[S]``, aligned with send_idx).

    The receiver holds the coefficients of the edges that read its halo rows, so each
    rank sums them per halo row and sends the sums back to the rows' owners with one
    start-up exchange (a collective: every rank calls it)."""
    adj = adjacency.forward
    squares = torch.zeros(graph.num_inner + graph.num_halo, dtype=torch.float64)
    squares.index_add_(0, adj.col_indices().cpu(), adj.values().double().cpu() ** 2)
    halo = squares[graph.num_inner :].to(torch.float32).view(-1, 1).to(device)
    transport.at("set-up (aggregation coefficients)")
    return transport.start(halo, SETUP_KEY).wait()[:, 0].double().cpu()


def gather_counts(
    transport: HaloTransport, world_size: int, device
) -> tuple[dict[Direction, np.ndarray], dict[int, dict[Direction, np.ndarray]]]:
    """Every rank's message counts (collective): per direction, int ``[P, P]``
    (``[src, dst]``: messages src sends dst) of the whole exchange, and of the messages
    that travel in training per layer that sends fewer (``HaloTransport.select``; the
    same layers on every rank)."""
    layers = sorted(transport.selections)
    rows = [(transport.send_counts, transport.recv_counts)]
    rows += [
        (transport.selections[layer].send_counts, transport.selections[layer].recv_counts)
        for layer in layers
    ]
    counts = torch.tensor(rows, dtype=torch.int64, device=device)  # [1 + L, 2, P]
    gathered = [torch.zeros_like(counts) for _ in range(world_size)]
    dist.all_gather(gathered, counts)
    by_src = np.stack([g.cpu().numpy() for g in gathered], axis=2)  # [1 + L, 2, src, dst]

    def directions(table: np.ndarray) -> dict[Direction, np.ndarray]:
        return {Direction.FORWARD: table[0], Direction.BACKWARD: table[1]}

    sent = {layer: directions(by_src[1 + i]) for i, layer in enumerate(layers)}
    return directions(by_src[0]), sent


class PlanBook:
    """This rank's plans and traces, by exchange.

    Args:
        counts: per direction, int ``[P, P]``: ``counts[src, dst]`` messages src sends
            dst (the same on every rank).
        rank: this rank.
        device: where plans live.
    """

    def __init__(
        self, counts: dict[Direction, np.ndarray], rank: int, device, kernels: str | None = None
    ):
        self.counts = counts
        self.rank = rank
        self.device = device
        self.kernels = kernels
        """The quantizer's path (``quant.kernels``), which the traces take too."""
        self.plans: dict[ExchangeKey, BitPlan] = {}
        self.traces: dict[ExchangeKey, list] = {}
        """Per exchange: ``[sum of squared row ranges (float64 [S]), epochs traced, D]``."""

    @property
    def num_ranks(self) -> int:
        return len(next(iter(self.counts.values())))

    def plan(self, key: ExchangeKey, first: Callable[[], BitPlan]) -> BitPlan:
        """The installed plan of ``key``, else ``first()``, installed."""
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = first()
        return plan

    def trace(
        self, key: ExchangeKey, rows_RD: torch.Tensor, squared: torch.Tensor | None = None
    ) -> None:
        """Accumulates the squared row ranges of one outgoing block: ``squared`` where the
        quantizer took them from the rows it quantized (``HaloTransport.start``), else
        ``squared_ranges`` (one compiled pass, bit for bit the same ``amax - amin``)."""
        if rows_RD.shape[1] == 0:
            return
        if squared is None:
            squared = squared_ranges(rows_RD, self.kernels).cpu()
        entry = self.traces.get(key)
        if entry is None:
            self.traces[key] = [squared, 1, rows_RD.shape[1]]
        else:
            entry[0] += squared
            entry[1] += 1

    def dim(self, key: ExchangeKey) -> int:
        """The row width ``D`` of a traced exchange."""
        return self.traces[key][2]

    def weights(self, key: ExchangeKey, forward_coef: torch.Tensor | None) -> np.ndarray:
        """float64 ``[S]``: this rank's variance weight of each message it sends in a
        traced exchange (module docstring); ``forward_coef`` None (the random scheme)
        leaves the forward weights unscaled."""
        squared, cycles, dim = self.traces[key]
        weights = (squared / cycles) * dim / 4.0
        if key.direction is Direction.FORWARD and forward_coef is not None:
            weights = weights * forward_coef
        return weights.numpy()

    def channel_widths(
        self, keys: list[ExchangeKey], flat: torch.Tensor
    ) -> Iterator[tuple[ExchangeKey, int, int, torch.Tensor]]:
        """Yields ``(key, src, dst, widths)`` of every channel in the broadcast buffer."""
        p, offset = self.num_ranks, 0
        for key in keys:
            counts = self.counts[key.direction]
            for src in range(p):
                for dst in range(p):
                    if src != dst:
                        n = int(counts[src, dst])
                        yield key, src, dst, flat[offset : offset + n]
                        offset += n

    def pair_bits(
        self, keys: list[ExchangeKey], flat: torch.Tensor, travels: torch.Tensor | None = None
    ) -> dict[str, float]:
        """``"src->dst"``: the mean width of the buffer's messages from src to dst, over
        all of ``keys``; with ``travels`` (bool, the buffer's layout), of those it marks
        (the messages that training sends)."""
        totals: dict[str, list[int]] = {}
        kept = self.channel_widths(keys, travels) if travels is not None else None
        for _, src, dst, widths in self.channel_widths(keys, flat):
            if kept is not None:
                widths = widths[next(kept)[3]]
            entry = totals.setdefault(f"{src}->{dst}", [0, 0])
            entry[0] += int(widths.sum(dtype=torch.int64))
            entry[1] += widths.numel()
        return {pair: bits / n for pair, (bits, n) in totals.items() if n}

    def install(self, keys: list[ExchangeKey], flat: torch.Tensor) -> None:
        """This rank's plans of ``keys`` from the broadcast buffer; the traces restart."""
        p, rank = self.num_ranks, self.rank
        channels: dict[ExchangeKey, dict[tuple[int, int], torch.Tensor]] = {k: {} for k in keys}
        for key, src, dst, widths in self.channel_widths(keys, flat):
            channels[key][src, dst] = widths
        empty = torch.zeros(0, dtype=torch.uint8)
        for key, channel in channels.items():
            out_bits = torch.cat([channel.get((rank, dst), empty) for dst in range(p)])
            in_bits = torch.cat([channel.get((src, rank), empty) for src in range(p)])
            self.plans[key] = BitPlan(
                out_bits.to(torch.int8).to(self.device), in_bits.to(torch.int8).to(self.device)
            )
        self.traces = {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plans and the traces of the current cycle (for checkpoints)."""
        state: dict[str, torch.Tensor] = {}
        for key, plan in self.plans.items():
            state[f"plan/{key}/out"] = plan.out_bits.cpu()
            state[f"plan/{key}/in"] = plan.in_bits.cpu()
        for key, (squared, cycles, dim) in self.traces.items():
            state[f"trace/{key}/squared"] = squared
            state[f"trace/{key}/cycles_dim"] = torch.tensor([cycles, dim])
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Reads back :meth:`state_dict`'s entries (others in ``state`` are ignored)."""
        plans: dict[ExchangeKey, dict[str, torch.Tensor]] = {}
        traces: dict[ExchangeKey, dict[str, torch.Tensor]] = {}
        for name, tensor in state.items():
            kind, _, rest = name.partition("/")
            if kind in ("plan", "trace"):
                key_name, _, field = rest.rpartition("/")
                into = plans if kind == "plan" else traces
                into.setdefault(ExchangeKey.parse(key_name), {})[field] = tensor
        self.plans = {
            key: BitPlan(p["out"].to(self.device), p["in"].to(self.device))
            for key, p in plans.items()
        }
        self.traces = {
            key: [t["squared"], int(t["cycles_dim"][0]), int(t["cycles_dim"][1])]
            for key, t in traces.items()
        }
