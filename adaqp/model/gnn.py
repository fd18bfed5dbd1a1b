"""GNN models: a stack of graph convolutions with dropout, optional LayerNorm and ReLU.

Dropout is :class:`adaqp.model.dropout.Dropout` (nn.Dropout's distribution, a compiled mask on
CPU), its kernel loaded when the model is built so that no timed epoch compiles it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from adaqp.config import ModelConfig
from adaqp.model.dropout import Dropout
from adaqp.model.layers import GATConv, GCNConv, SAGEConv

CONVS = {"gcn": GCNConv, "sage": SAGEConv, "gat": GATConv}

Propagate = Callable[..., torch.Tensor]
"""``propagate(h, layer, finish)``: see ``adaqp.model.layers.Propagation``."""


class GNN(nn.Module):
    """``layers`` convolutions: in_dim -> hidden -> ... -> out_dim.

    Before every layer: dropout. After every hidden layer: LayerNorm (optional), ReLU.

    Args:
        config: architecture.
        in_dim, out_dim: feature and class counts.
        transform_first: let GCN and SAGE layers that narrow the rows transform before
            aggregating (GAT layers always do).
        cached_input: layer 0 receives its halo rows with the input (nothing to narrow).
        kernels: the dropout mask's path (``auto``, ``torch``, ``compiled``; None: the process
            default, see adaqp/quant/kernels.py).
    """

    def __init__(
        self,
        config: ModelConfig,
        in_dim: int,
        out_dim: int,
        transform_first: bool = False,
        cached_input: bool = False,
        kernels: str | None = None,
    ):
        super().__init__()
        conv = CONVS[config.name]
        if config.name == "gat":
            # Hidden layers: heads x hidden, concatenated; the output layer's heads averaged.
            width = config.heads * config.hidden
            dims = [in_dim] + [width] * (config.layers - 1) + [out_dim]
            self.convs = nn.ModuleList(
                GATConv(a, config.hidden, config.heads, True, config.attn_dropout, kernels)
                for a in dims[:-2]
            )
            self.convs.append(
                GATConv(dims[-2], out_dim, config.output_heads, False, config.attn_dropout, kernels)
            )
        else:
            dims = [in_dim] + [config.hidden] * (config.layers - 1) + [out_dim]
            self.convs = nn.ModuleList(
                conv(
                    a,
                    b,
                    transform_first=transform_first and b < a and not (layer == 0 and cached_input),
                )
                for layer, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True))
            )
        self.norms = nn.ModuleList(
            nn.LayerNorm(d) if config.layernorm else nn.Identity() for d in dims[1:-1]
        )
        self.dropout = Dropout(config.dropout, kernels)
        if not torch.cuda.is_available():  # a CUDA model never runs the CPU mask
            for module in self.modules():
                if isinstance(module, Dropout):
                    module.warm_up()
        self.norm = conv.norm

    def forward(self, x_ID: torch.Tensor, propagate: Propagate) -> torch.Tensor:
        """Returns logits [I, out_dim] for the inner nodes.

        ``x`` is [I, F], or [I + H, F] with the halo rows of the input appended (cached).
        """
        h = x_ID
        for layer, conv in enumerate(self.convs):
            h = conv(self.dropout(h), propagate, layer)
            if layer < len(self.convs) - 1:
                h = torch.relu(self.norms[layer](h))
        return h
