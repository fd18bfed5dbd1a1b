"""Graph convolution layers over a partitioned graph.

A layer never sees the partition: it calls ``propagate(h, layer, finish)``, which
aggregates the in-neighbours of every inner node, halo rows included, and applies the
layer's row-wise ``finish(agg, rows)`` (its dense transform) to the aggregated rows.
Where the input already holds its halo rows (the cached layer-0 input, ``[I + H, D]``)
the ``Propagation`` is told so when it is built, and no exchange runs for that layer.

Otherwise the exchange is two autograd nodes around the layer's local work
(``adaqp/model/flight.py``): ``ExchangeStart`` sends the boundary rows and
``ExchangeLand`` waits for the halo rows.
A linear aggregation (a :class:`~adaqp.graph.aggregate.LinearAggregation`, such as the
default product) splits the adjacency by columns: every inner row's sum over its inner
in-neighbours (``[I, I]`` block) runs first, with ``overlap`` on while the exchange is in
flight, and the marginal rows' halo terms (``[M, H]`` block) are added once it lands; the
finish then runs once over all rows. Any other aggregation (GAT's attention, whose
softmax spans a row's every in-edge) splits by rows instead: the central rows (no halo
in-neighbour) are aggregated and finished in flight, the marginal rows after landing.
Both splits rely on central rows having no halo entry, which is checked when the
``Propagation`` is built. Neither split happens where the policy says the layer will
not wait (e.g. stale rows already landed). Backward mirrors it: ``ExchangeLand``'s
backward sends the halo gradients to their owners and ``ExchangeStart``'s waits for
them, and autograd, which runs the nodes recorded last first, computes the in-flight
work's gradients in between. A layer's dense ``transform`` of a linear aggregation (GCN's
weight, SAGE's neighbour weight) adds to that window: its backward returns only the
input's gradient, and ``ExchangeLand``'s backward, once the halo gradients are sent,
computes the weight's (one ``[O, D]`` product over all rows) and lets go of the rows it
read before the inner rows' gradients are made, as pipeline schedules split a layer's
backward into the input's and the weights' gradients. That needs a backward exchange to hide in,
and one runs only where the input needs a gradient: layer 0's features do not, so there
the weights' gradients come from the transform itself and no halo gradient is sent.
Which rows an exchange resolves to (fresh, quantized, or buffered from an earlier epoch)
is the exchange policy's business.

Shapes: I inner rows (C central first, then M marginal), H halo rows, S rows sent to
peers, D features, O output features.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import torch
from torch import nn

from adaqp.exchange.policy import ExchangePolicy
from adaqp.graph.aggregate import (
    PRODUCT,
    GradHand,
    LinearAggregation,
    SparseAdjacency,
    add_spmm_,
    spmm,
)
from adaqp.graph.local import LocalGraph
from adaqp.graph.loss_rows import LayerRows
from adaqp.model.first import transforms_first
from adaqp.model.flight import DeferredLinear, ExchangeLand, ExchangeStart, InFlight
from adaqp.model.transform import Handoff, transform

Finish = Callable[[torch.Tensor, slice], torch.Tensor]
"""A layer's row-wise work after aggregation: ``finish(agg_XD, rows) -> [X, O]`` for
the inner rows ``rows`` (a slice of 0..I)."""

First = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor | None]]
"""``first(h_ID, O) -> (hw_IF, sum_OF | None)``: a layer's transform run before its
aggregation (``adaqp/model/transform.py``), and the sum its aggregation adds into, if any
(SAGE's root term over the O output rows)."""

Aggregate = Callable[[SparseAdjacency, torch.Tensor, slice], torch.Tensor]
"""``aggregate(block, x_MD, rows) -> [X, D]``: the in-neighbour aggregation of the inner
rows ``rows`` over a block of the adjacency (``[X, M]``); by default ``block @ x``
(:data:`~adaqp.graph.aggregate.PRODUCT`). GAT passes its attention here. A
:class:`~adaqp.graph.aggregate.LinearAggregation` is split by columns, any other by rows."""


def _whole(agg: torch.Tensor, rows: slice) -> torch.Tensor:
    return agg


class Propagation:
    """Aggregates in-neighbours for one worker: local rows, plus halo rows when P > 1.

    Args:
        graph: this worker's local graph.
        adjacency: its ``[I, I + H]`` aggregation matrix (``graph.adjacency(norm)``).
        policy: the exchange policy; None for a single worker (no halo).
        overlap: run the aggregation that needs no halo row while the exchange is in flight.
        cached_input: layer 0's input already holds the halo rows ``[I + H, D]``.
        linear: every call's aggregation is a ``LinearAggregation`` (GCN's, SAGE's). With a
            policy, the adjacency is then held only as its two column blocks, built here
            (each entry once, not twice), and the cached layer-0 input is aggregated block
            by block too; a call with another aggregation is an error.
        rows: the rows this propagation reads and writes (``adaqp/graph/loss_rows.py``),
            ``adjacency`` cut to them; None: every row of ``graph``.
        blocks: a linear aggregation's two column blocks, already cut (``adjacency`` then
            None), for a policy's linear ``Propagation``.
    """

    def __init__(
        self,
        graph: LocalGraph,
        adjacency: SparseAdjacency,
        policy: ExchangePolicy | None,
        overlap: bool = False,
        cached_input: bool = False,
        linear: bool = False,
        rows: LayerRows | None = None,
        blocks: tuple[SparseAdjacency, SparseAdjacency] | None = None,
    ):
        if policy is None and graph.num_halo:
            raise ValueError("a graph with halo nodes needs an exchange policy")
        rows = rows or LayerRows.whole(graph)
        self.graph = graph
        self.rows = rows
        self.policy = policy
        self.overlap = overlap and policy is not None
        self.cached_input = cached_input
        self.linear = linear
        self.adjacency: SparseAdjacency | None = adjacency
        """The whole ``[I, I + H]`` matrix; None where only the column blocks are kept."""
        self.global_rows: tuple[int, int] | None = None
        """The layer's input and output rows summed over the workers, which decide whether
        it transforms first: every worker decides alike (one that transforms first sends
        ``h W``, one that does not ``h``). None: this worker's rows (every row, or one
        worker)."""
        if blocks is not None:
            if not (linear and policy is not None):
                raise ValueError("column blocks are for a policy's linear Propagation")
            self._column_blocks = blocks
            return
        # Both splits drop the central rows' halo columns: by definition there are none,
        # and an adjacency that disagrees with the graph's count would lose edges silently.
        stray = adjacency.count(slice(0, rows.num_central), slice(rows.num_in, None))
        if stray:
            raise ValueError(
                f"{stray} adjacency entries of the {rows.num_central} central rows read halo "
                f"columns (>= {rows.num_in}); central rows must have no halo in-neighbour "
                "(LocalGraph.from_part orders them so): is the adjacency this graph's?"
            )
        if linear and policy is not None:
            self._column_blocks = self._split_columns(adjacency)
            self.adjacency = None

    def transforms_first(self, layer: int, in_dim: int, out_dim: int) -> bool:
        """Whether a layer allowed to transform first does (``adaqp/model/first.py``), on
        ``global_rows`` where set, else on this worker's rows."""
        num_in, num_out = self.global_rows or (self.rows.num_in, self.rows.num_out)
        return transforms_first(in_dim, out_dim, num_in, num_out)

    def prepare_backward(self) -> None:
        """Builds now the transposes backward reads (``SparseAdjacency.transpose``), which
        would otherwise be built in the first backward, beside that step's activations."""
        if self.adjacency is None:
            matrices = self._column_blocks
        else:
            matrices = (self.adjacency, *(self._row_blocks if self.overlap else ()))
        for matrix in matrices:
            _ = matrix.transpose

    @property
    def column_blocks(self) -> tuple[SparseAdjacency, SparseAdjacency]:
        """A linear aggregation's ``[O, I]`` inner and ``[O - C, H]`` halo blocks."""
        return self._column_blocks

    @cached_property
    def _column_blocks(self) -> tuple[SparseAdjacency, SparseAdjacency]:
        """A linear aggregation's split: the ``[I, I]`` inner block and the marginal
        rows' ``[M, H]`` halo block (built on first use, or when the ``Propagation`` is)."""
        return self._split_columns(self.adjacency)

    def _split_columns(self, adjacency: SparseAdjacency) -> tuple[SparseAdjacency, SparseAdjacency]:
        inner, central = self.rows.num_in, self.rows.num_central
        return (
            adjacency.block(slice(0, None), slice(0, inner)),
            adjacency.block(slice(central, inner), slice(inner, None)),
        )

    @cached_property
    def _row_blocks(self) -> tuple[SparseAdjacency, SparseAdjacency]:
        """Another aggregation's split: the central rows' ``[C, I]`` block (they read
        only inner columns) and the marginal rows' ``[M, I + H]`` (built on first use)."""
        rows = self.rows
        return (
            self.adjacency.row_slice(0, rows.num_central, num_cols=rows.num_in),
            self.adjacency.row_slice(rows.num_central, rows.num_out),
        )

    def __call__(
        self,
        h_RD: torch.Tensor,
        layer: int,
        finish: Finish = _whole,
        aggregate: Aggregate = PRODUCT,
        transform: nn.Linear | None = None,
        first: First | None = None,
    ) -> torch.Tensor:
        """Returns ``finish(transform(agg), rows)`` of the aggregation ``agg`` of every inner
        row, [I, O] (``transform``: none by default). A transform's weight gradients are
        computed while the layer's halo gradients travel, where a linear aggregation
        exchanges and the input needs a gradient. ``first``: the layer transforms its
        rows before aggregating them (``_transformed_first``)."""
        if first is not None:  # h_RD may be handed off (``Handoff``)
            return self._transformed_first(h_RD, layer, finish, aggregate, first)
        rows = self.rows
        every = slice(0, rows.num_out)
        local = self.policy is None or (layer == 0 and self.cached_input)
        linear = isinstance(aggregate, LinearAggregation)
        if self.linear and not linear:
            raise ValueError(
                "this Propagation was built for linear aggregations only (linear=True) and "
                "keeps no whole adjacency for another"
            )
        in_flight = not local and self.overlap and self.policy.waits(layer)
        # Deferred weight gradients make the exchange's ticket need a gradient, so its
        # backward exchange runs: worth it only where the input's gradient needs it anyway.
        # Where the layer overlaps, the inner rows' gradient hides the exchange: the weight
        # gradient is made at once, and its input and output gradient let go before the
        # halo gradients' buffers are made (results/bench/memory/hosts-1gbit/).
        defer = linear and not local and h_RD.requires_grad and not in_flight
        if transform is not None and not defer:
            # Nothing to defer its weight gradients to: part of the finish.
            return self(h_RD, layer, lambda agg, rows: finish(transform(agg), rows), aggregate)
        if local and self.adjacency is None:
            # The halo rows already present, the adjacency held as its column blocks.
            inner_block, halo_block = self._column_blocks
            marginal = slice(rows.num_central, rows.num_out)
            agg_ID = aggregate(inner_block, h_RD[: rows.num_in], every)
            agg_ID = aggregate.add_(
                agg_ID, marginal.start, halo_block, h_RD[rows.num_in :], marginal
            )
            return finish(agg_ID, every)
        if local:
            # No halo, or its rows already present.
            return finish(aggregate(self.adjacency, h_RD, every), every)
        # Every rank joins every exchange, also one whose part has no halo rows: its
        # peers may still need its rows.
        flight = InFlight(self.policy, layer, selected=rows.send_keep is not None)
        # A linear aggregation's inner rows come first. Not overlapped, the exchange starts
        # only after them, and in backward its halo gradients land before the inner rows'
        # gradient is made: their buffers are never beside it.
        flight.hold_launch = linear and not in_flight
        params = () if transform is None else _params(transform)
        ticket = ExchangeStart.apply(h_RD, rows.send_idx, flight, *params)
        central = slice(0, rows.num_central)
        marginal = slice(rows.num_central, rows.num_out)
        if linear:
            inner_block, halo_block = self._column_blocks
            # The product hands its input gradient to the exchange, which adds the landed
            # gradients into it where it is (adaqp/model/flight.py).
            agg_ID = _add_inner(aggregate, inner_block, h_RD, every, None, flight.hand_inner_grad)
            flight.launch()
            halo_HD = ExchangeLand.apply(ticket, flight)
            agg_ID = aggregate.add_(agg_ID, marginal.start, halo_block, halo_HD, marginal)
            del halo_HD  # added: not kept while the transform runs
            if transform is not None:
                bias = None if transform.bias is None else transform.bias.detach()
                agg_ID = DeferredLinear.apply(agg_ID, transform.weight.detach(), bias, flight)
            return finish(agg_ID, every)
        if not in_flight:
            halo_HD = ExchangeLand.apply(ticket, flight)
            return finish(aggregate(self.adjacency, torch.cat([h_RD, halo_HD]), every), every)
        # Central rows need no halo: aggregated and finished while the exchange travels.
        central_block, marginal_block = self._row_blocks
        central_CO = finish(aggregate(central_block, h_RD, central), central)
        halo_HD = ExchangeLand.apply(ticket, flight)
        marginal_MO = finish(
            aggregate(marginal_block, torch.cat([h_RD, halo_HD]), marginal), marginal
        )
        return torch.cat([central_CO, marginal_MO])

    def _transformed_first(
        self,
        h_RD: torch.Tensor,
        layer: int,
        finish: Finish,
        aggregate: Aggregate,
        first: First,
    ) -> torch.Tensor:
        """``finish(sum, rows)`` where ``first(h, O) -> (hw [I, F], sum [O, F] | None)``
        transforms the rows (``adaqp/model/transform.py``) and the aggregation of ``hw``
        is added into ``sum`` (SAGE's root term) or makes it. The inner rows are aggregated
        before the halo rows are waited for, so that ``hw`` goes before they land (this
        Propagation holds the only reference); without ``overlap`` the exchange starts
        only then. In backward the halo gradients travel while the inner rows' gradient
        is made, in either case (autograd's order: the land node is recorded later)."""
        if not isinstance(aggregate, LinearAggregation):
            raise ValueError("a layer that transforms first needs a linear aggregation")
        rows = self.rows
        every = slice(0, rows.num_out)
        marginal = slice(rows.num_central, rows.num_out)
        if isinstance(h_RD, Handoff):
            h_RD = h_RD.take()
        hw_IF, sum_OF = first(h_RD, rows.num_out)
        del h_RD  # transformed: kept, if at all, by the transform's node
        if self.policy is None or (layer == 0 and self.cached_input):
            if self.adjacency is not None:
                sum_OF = _add_inner(aggregate, self.adjacency, hw_IF, every, sum_OF)
                return finish(sum_OF, every)
            inner_block, halo_block = self._column_blocks
            sum_OF = _add_inner(aggregate, inner_block, hw_IF[: rows.num_in], every, sum_OF)
            halo_HF = hw_IF[rows.num_in :]
        else:
            flight = InFlight(self.policy, layer, selected=rows.send_keep is not None)
            # Not overlapped, the exchange starts once the inner rows are aggregated: its
            # buffers are not made beside the transformed rows.
            flight.hold_launch = not (self.overlap and self.policy.waits(layer))
            ticket = ExchangeStart.apply(hw_IF, rows.send_idx, flight)
            inner_block, halo_block = self._column_blocks
            sum_OF = _add_inner(
                aggregate, inner_block, hw_IF, every, sum_OF, flight.hand_inner_grad
            )
            del hw_IF  # aggregated: let go before the halo rows land
            flight.launch()
            halo_HF = ExchangeLand.apply(ticket, flight)
        sum_OF = aggregate.add_(sum_OF, marginal.start, halo_block, halo_HF, marginal)
        return finish(sum_OF, every)


def _add_inner(
    aggregate: LinearAggregation,
    block: SparseAdjacency,
    x_MD: torch.Tensor,
    rows: slice,
    into: torch.Tensor | None = None,
    hand: GradHand | None = None,
) -> torch.Tensor:
    """``aggregate``'s aggregation of ``x_MD`` over ``block`` for ``rows``, added into
    ``into`` where given. The product hands its input gradient to ``hand`` (the exchange,
    which adds the landed gradients into it: ``adaqp/model/flight.py``); another linear
    aggregation leaves it to autograd."""
    if hand is not None and aggregate is PRODUCT:
        return spmm(block, x_MD, hand) if into is None else add_spmm_(into, 0, block, x_MD, hand)
    if into is None:
        return aggregate(block, x_MD, rows)
    return aggregate.add_(into, 0, block, x_MD, rows)


def _first_here(conv: nn.Module, propagate, layer: int, linear: nn.Linear) -> bool:
    """Whether ``conv``, allowed to transform first, does on ``propagate``'s rows for
    ``layer`` (a propagation that does not say: it does)."""
    if not conv.transform_first:
        return False
    decide = getattr(propagate, "transforms_first", None)
    return decide is None or decide(layer, linear.in_features, linear.out_features)


def _taken(h) -> torch.Tensor:
    """The input itself, where it was handed off to a layer that aggregates first."""
    return h.take() if isinstance(h, Handoff) else h


def _params(linear: nn.Linear) -> tuple[nn.Parameter, ...]:
    return (linear.weight,) if linear.bias is None else (linear.weight, linear.bias)


class GCNConv(nn.Module):
    """GCN layer: (D^-1/2 (A + I) D^-1/2 h) W + b.

    With ``transform_first`` the product runs as D^-1/2 (A + I) D^-1/2 (h W) + b: the same
    result, but the exchanged rows are ``out_dim`` wide instead of ``in_dim``.
    """

    norm = "gcn"
    aggregates_linearly = True

    def __init__(self, in_dim: int, out_dim: int, transform_first: bool = False):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)
        self.transform_first = transform_first

    def forward(self, h: torch.Tensor, propagate, layer: int, key=None) -> torch.Tensor:
        """``key``: the base key of the layer's own draws (GAT's); unused here."""
        if _first_here(self, propagate, layer, self.linear):
            weight = self.linear.weight
            out = propagate(h, layer, first=lambda h, num_out: (transform(h, weight), None))
            return out.add_(self.linear.bias)
        return propagate(_taken(h), layer, transform=self.linear)


class SAGEConv(nn.Module):
    """GraphSAGE layer, mean aggregator with root weight: h W_root + mean(h_N) W_neigh + b.

    With ``transform_first`` the neighbour term runs as mean((h W_neigh)_N), the same
    result with ``out_dim``-wide exchanged rows.
    """

    norm = "mean"
    aggregates_linearly = True

    def __init__(self, in_dim: int, out_dim: int, transform_first: bool = False):
        super().__init__()
        self.root = nn.Linear(in_dim, out_dim)
        self.neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.transform_first = transform_first

    def forward(self, h: torch.Tensor, propagate, layer: int, key=None) -> torch.Tensor:
        """``key``: the base key of the layer's own draws (GAT's); unused here."""
        if _first_here(self, propagate, layer, self.root):
            # The root term over the output rows is the sum the aggregation adds into.
            neigh, root = self.neigh.weight, self.root

            def first(h, num_out):
                return transform(h, neigh, root.weight, root.bias, num_out)

            return propagate(h, layer, first=first)
        # h may carry halo rows after the inner ones (cached input): the root term is
        # taken over the inner rows, row range by row range with the aggregation. The sum
        # goes into the root term's rows (no third [rows, out_dim] tensor).
        h = _taken(h)
        return propagate(h, layer, lambda z, rows: self.root(h[rows]).add_(z), transform=self.neigh)
