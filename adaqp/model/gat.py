"""The GAT layer: attention over a row's in-edges, its rows transformed before they are
exchanged (``adaqp/graph/attention.py`` computes the attention; ``adaqp/model/layers.py``
the propagation that exchanges)."""

from __future__ import annotations

import torch
from torch import nn

from adaqp.graph.aggregate import SparseAdjacency
from adaqp.graph.attention import attend
from adaqp.model.dropout import Dropout


class GATConv(nn.Module):
    """GAT layer: per head k, out_uk = sum_v alpha_uvk W_k h_v over u's in-edges and u
    itself, alpha the softmax of LeakyReLU(a_src_k . W_k h_v + a_dst_k . W_k h_u)
    (``adaqp/graph/attention.py``); heads concatenated, or averaged (``concat=False``,
    the output layer), then a bias.

    Rows are transformed first: the exchanged rows are the ``heads x out_dim`` transformed
    ones, so a halo neighbour's score and message both come from its row as received
    (quantized or stale in those modes). Attention dropout keys each edge's weights by the
    edge's global ids (the block's ``edge_keys``), head by head.
    """

    norm = "gat"
    aggregates_linearly = False

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        heads: int = 1,
        concat: bool = True,
        attn_dropout: float = 0.0,
        kernels: str = "auto",
    ):
        super().__init__()
        self.heads, self.out_dim, self.concat = heads, out_dim, concat
        self.linear = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim))
        self.attn_dropout = Dropout(attn_dropout, kernels)
        for weight in (self.linear.weight, self.att_src, self.att_dst):
            nn.init.xavier_uniform_(weight)

    def forward(self, h: torch.Tensor, propagate, layer: int, key=None) -> torch.Tensor:
        """``key``: the base key of the attention dropout's draws (None outside training)."""
        hw = nn.functional.linear(h, self.linear.weight)
        out = propagate(hw, layer, aggregate=lambda *block: self._attend(*block, key))
        if not self.concat:
            out = out.view(out.shape[0], self.heads, self.out_dim).mean(1)
        return out + self.bias

    def _attend(self, block: SparseAdjacency, x_MD: torch.Tensor, rows: slice, key):
        # Explicit shapes: a block may have no rows (a part without central or marginal
        # nodes), and -1 cannot be inferred from 0 elements.
        x_MKF = x_MD.view(x_MD.shape[0], self.heads, self.out_dim)
        args = (block, x_MKF, self.att_src, self.att_dst, rows, self.attn_dropout, key)
        out = attend(*args)
        return out.view(out.shape[0], self.heads * self.out_dim)
