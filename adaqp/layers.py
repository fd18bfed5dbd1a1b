"""Graph convolution layers over a partitioned graph.

A layer never sees the partition: it calls ``propagate(h, layer)`` which returns the
aggregation of the in-neighbours of every inner node, halo rows included. Where the
input already holds its halo rows (the cached layer-0 input, ``[I + H, D]``) the
``Propagation`` is told so when it is built, and no exchange runs for that layer.
Otherwise the halo exchange and the aggregation live together in one autograd function,
``_HaloAggregate``, which also owns the overlap: with ``overlap`` on, the central rows
(no halo in-neighbour) are aggregated while the exchange is in flight, and the marginal
rows after it lands; backward mirrors it, returning halo gradients to their owners while
the central rows' gradients are computed. Which rows the exchange resolves to (fresh,
quantized, or buffered from an earlier epoch) is the exchange policy's business.

Shapes: I inner rows (C central first, then M marginal), H halo rows, S rows sent to
peers, D features.
"""

from __future__ import annotations

import torch
from torch import nn

from adaqp.aggregate import SparseAdjacency, spmm
from adaqp.comm import ExchangeKey
from adaqp.local_graph import LocalGraph
from adaqp.policy import ExchangePolicy


class _HaloAggregate(torch.autograd.Function):
    """out = A @ [h ; halo(h)], where halo(h) are peers' rows fetched through the policy."""

    @staticmethod
    def forward(ctx, h_ID: torch.Tensor, prop: Propagation, layer: int) -> torch.Tensor:
        ctx.prop, ctx.layer = prop, layer
        h_ID = h_ID.detach()
        send_SD = h_ID.index_select(0, prop.graph.send_idx)
        pending = prop.policy.start(ExchangeKey.forward(layer), send_SD)
        if not prop.overlap:
            return torch.sparse.mm(prop.adjacency.forward, torch.cat([h_ID, pending.wait()]))
        # Central rows need no halo: computed while the exchange is in flight.
        central_CD = torch.sparse.mm(prop.central.forward, h_ID)
        marginal_MD = torch.sparse.mm(prop.marginal.forward, torch.cat([h_ID, pending.wait()]))
        return torch.cat([central_CD, marginal_MD])

    @staticmethod
    def backward(ctx, grad_ID: torch.Tensor):
        prop = ctx.prop
        grad_ID = grad_ID.contiguous()
        num_inner = grad_ID.shape[0]
        key = ExchangeKey.backward(ctx.layer)
        if not prop.overlap:
            grad_all = torch.sparse.mm(prop.adjacency.transpose, grad_ID)
            pending = prop.policy.start(key, grad_all[num_inner:])
            grad_inner = grad_all[:num_inner]
        else:
            num_central = prop.graph.num_central
            grad_all = torch.sparse.mm(prop.marginal.transpose, grad_ID[num_central:])
            pending = prop.policy.start(key, grad_all[num_inner:])
            # The central rows' gradient is computed while the halo gradients travel.
            grad_inner = grad_all[:num_inner] + torch.sparse.mm(
                prop.central.transpose, grad_ID[:num_central]
            )
        grad_SD = pending.wait()
        return grad_inner.index_add(0, prop.graph.send_idx, grad_SD), None, None


class Propagation:
    """Aggregates in-neighbours for one worker: local rows, plus halo rows when P > 1.

    Args:
        graph: this worker's local graph.
        adjacency: its ``[I, I + H]`` aggregation matrix (``graph.adjacency(norm)``).
        policy: the exchange policy; None for a single worker (no halo).
        overlap: aggregate central rows while the exchange is in flight.
        cached_input: layer 0's input already holds the halo rows ``[I + H, D]``.
    """

    def __init__(
        self,
        graph: LocalGraph,
        adjacency: SparseAdjacency,
        policy: ExchangePolicy | None,
        overlap: bool = False,
        cached_input: bool = False,
    ):
        if policy is None and graph.num_halo:
            raise ValueError("a graph with halo nodes needs an exchange policy")
        self.graph = graph
        self.adjacency = adjacency
        self.policy = policy
        self.overlap = overlap and policy is not None
        self.cached_input = cached_input
        if self.overlap:
            num_inner, num_central = graph.num_inner, graph.num_central
            # Central rows read only inner columns: a [C, I] block.
            self.central = self.adjacency.row_slice(0, num_central, num_cols=num_inner)
            self.marginal = self.adjacency.row_slice(num_central, num_inner)

    def __call__(self, h_RD: torch.Tensor, layer: int) -> torch.Tensor:
        if self.policy is None or (layer == 0 and self.cached_input):
            return spmm(self.adjacency, h_RD)  # no halo, or its rows already present
        # Every rank joins every exchange, also one whose part has no halo rows: its
        # peers may still need its rows.
        return _HaloAggregate.apply(h_RD, self, layer)


class GCNConv(nn.Module):
    """GCN layer: (D^-1/2 (A + I) D^-1/2 h) W + b.

    With ``transform_first`` the product runs as D^-1/2 (A + I) D^-1/2 (h W) + b: the same
    result, but the exchanged rows are ``out_dim`` wide instead of ``in_dim``.
    """

    norm = "gcn"

    def __init__(self, in_dim: int, out_dim: int, transform_first: bool = False):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)
        self.transform_first = transform_first

    def forward(self, h: torch.Tensor, propagate, layer: int) -> torch.Tensor:
        if self.transform_first:
            hw = nn.functional.linear(h, self.linear.weight)
            return propagate(hw, layer) + self.linear.bias
        return self.linear(propagate(h, layer))


class SAGEConv(nn.Module):
    """GraphSAGE layer, mean aggregator with root weight: h W_root + mean(h_N) W_neigh + b.

    With ``transform_first`` the neighbour term runs as mean((h W_neigh)_N), the same
    result with ``out_dim``-wide exchanged rows.
    """

    norm = "mean"

    def __init__(self, in_dim: int, out_dim: int, transform_first: bool = False):
        super().__init__()
        self.root = nn.Linear(in_dim, out_dim)
        self.neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.transform_first = transform_first

    def forward(self, h: torch.Tensor, propagate, layer: int) -> torch.Tensor:
        if self.transform_first:
            agg = propagate(self.neigh(h), layer)
            return self.root(h[: agg.shape[0]]) + agg
        agg = propagate(h, layer)
        # h may carry halo rows after the inner ones (cached input): the root term is inner.
        return self.root(h[: agg.shape[0]]) + self.neigh(agg)
