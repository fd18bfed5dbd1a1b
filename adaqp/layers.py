"""Graph convolution layers over a partitioned graph.

A layer never sees the partition: it calls ``propagate(h, layer)`` which returns the
aggregation of the in-neighbours of every inner node, halo rows included. The halo
exchange and the aggregation live together in one autograd function, so the backward
pass returns halo gradients to their owners in the mirror order of the forward pass.

Shapes: I inner rows, H halo rows, S rows sent to peers, D features.
"""

from __future__ import annotations

import torch
from torch import nn

from adaqp.aggregate import SparseAdjacency, spmm
from adaqp.comm import HaloExchanger
from adaqp.local_graph import LocalGraph


class _HaloAggregate(torch.autograd.Function):
    """out = A @ [h ; halo(h)], where halo(h) are peers' rows fetched by the exchanger."""

    @staticmethod
    def forward(
        ctx, h_ID: torch.Tensor, adjacency: SparseAdjacency, exchanger: HaloExchanger, layer: int
    ) -> torch.Tensor:
        pending = exchanger.start(h_ID.detach(), tag=f"layer{layer}/forward")
        halo_HD = pending.wait()
        ctx.adjacency, ctx.exchanger, ctx.layer = adjacency, exchanger, layer
        ctx.num_inner = h_ID.shape[0]
        return torch.sparse.mm(adjacency.forward, torch.cat([h_ID.detach(), halo_HD]))

    @staticmethod
    def backward(ctx, grad_ID: torch.Tensor):
        grad_all = torch.sparse.mm(ctx.adjacency.transpose, grad_ID.contiguous())
        grad_inner = grad_all[: ctx.num_inner]
        pending = ctx.exchanger.start_grad(
            grad_all[ctx.num_inner :], tag=f"layer{ctx.layer}/backward"
        )
        grad_SD = pending.wait()
        grad_inner = grad_inner.index_add(0, ctx.exchanger.send_idx, grad_SD)
        return grad_inner, None, None, None


class Propagation:
    """Aggregates in-neighbours for one worker: local rows, plus halo rows when P > 1.

    Args:
        graph: this worker's local graph.
        norm: ``gcn`` or ``mean`` (see ``LocalGraph.adjacency``).
        exchanger: the halo transport; None for a single worker (no halo).
    """

    def __init__(self, graph: LocalGraph, norm: str, exchanger: HaloExchanger | None):
        if exchanger is None and graph.num_halo:
            raise ValueError("a graph with halo nodes needs an exchanger")
        self.graph = graph
        self.norm = norm
        self.adjacency = graph.adjacency(norm)
        self.exchanger = exchanger

    def __call__(self, h_ID: torch.Tensor, layer: int) -> torch.Tensor:
        if self.exchanger is None:
            return spmm(self.adjacency, h_ID)
        # Eval passes run without autograd; the forward half of the function still runs.
        return _HaloAggregate.apply(h_ID, self.adjacency, self.exchanger, layer)


class GCNConv(nn.Module):
    """GCN layer: (D^-1/2 (A + I) D^-1/2 h) W + b."""

    norm = "gcn"

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)

    def forward(self, h: torch.Tensor, propagate, layer: int) -> torch.Tensor:
        return self.linear(propagate(h, layer))


class SAGEConv(nn.Module):
    """GraphSAGE layer, mean aggregator with root weight: h W_root + mean(h_N) W_neigh + b."""

    norm = "mean"

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.root = nn.Linear(in_dim, out_dim)
        self.neigh = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, h: torch.Tensor, propagate, layer: int) -> torch.Tensor:
        return self.root(h) + self.neigh(propagate(h, layer))
