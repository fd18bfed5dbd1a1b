"""GNN models: a stack of graph convolutions with dropout, optional LayerNorm and ReLU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from adaqp.config import ModelConfig
from adaqp.layers import GCNConv, SAGEConv

CONVS = {"gcn": GCNConv, "sage": SAGEConv}

Propagate = Callable[[torch.Tensor, int], torch.Tensor]


class GNN(nn.Module):
    """``layers`` convolutions: in_dim -> hidden -> ... -> out_dim.

    Before every layer: dropout. After every hidden layer: LayerNorm (optional), ReLU.
    """

    def __init__(self, config: ModelConfig, in_dim: int, out_dim: int):
        super().__init__()
        conv = CONVS[config.name]
        dims = [in_dim] + [config.hidden] * (config.layers - 1) + [out_dim]
        self.convs = nn.ModuleList(conv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.norms = nn.ModuleList(
            nn.LayerNorm(d) if config.layernorm else nn.Identity() for d in dims[1:-1]
        )
        self.dropout = nn.Dropout(config.dropout)
        self.norm = conv.norm

    def forward(self, x_ID: torch.Tensor, propagate: Propagate) -> torch.Tensor:
        """Returns logits [I, out_dim] for the inner nodes."""
        h = x_ID
        for layer, conv in enumerate(self.convs):
            h = conv(self.dropout(h), propagate, layer)
            if layer < len(self.convs) - 1:
                h = torch.relu(self.norms[layer](h))
        return h
