"""GNN models: a stack of graph convolutions with dropout, optional LayerNorm and ReLU.

Dropout is :class:`adaqp.model.dropout.Dropout` (nn.Dropout's distribution, a compiled mask on
CPU), its kernel loaded when the model is built so that no timed epoch compiles it. Its masks
are keyed, not drawn from a generator: layer ``l``'s input dropout in epoch ``e`` hashes
(``seed``, ``e``, ``l``, :class:`~adaqp.quant.draws.Draw`) into a base key and keys each row
by its node's global id, GAT's attention dropout each edge by its global ids; so every rank
drops what one process on the whole graph drops.

Backward keeps per layer only what it reads (``adaqp/model/recompute.py``): the norm's input,
the ReLU's mask as bits and the aggregated rows its weights need; a hidden layer's
dropped-out input is computed again from the norm's input, bit for bit."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from adaqp.config import ModelConfig
from adaqp.model.dropout import Dropout
from adaqp.model.gat import GATConv
from adaqp.model.layers import GCNConv, SAGEConv
from adaqp.model.recompute import Observer, SavedTensors, norm_relu, norm_relu_again
from adaqp.model.transform import Handoff
from adaqp.quant.draws import Draw, RowKeys, draw_key

CONVS = {"gcn": GCNConv, "sage": SAGEConv, "gat": GATConv}

Propagate = Callable[..., torch.Tensor]
"""``propagate(h, layer, finish)``: see ``adaqp.model.layers.Propagation``."""


class GNN(nn.Module):
    """``layers`` convolutions: in_dim -> hidden -> ... -> out_dim.

    Before every layer: dropout. After every hidden layer: LayerNorm (optional), ReLU.
    ``observe_saved``: None, or ``observe(layer, tensor)``, called with every tensor a
    forward pass keeps for backward (measurement and tests).

    Args:
        config: architecture.
        in_dim, out_dim: feature and class counts.
        transform_first: let GCN and SAGE layers that do not widen the rows transform
            before aggregating (``adaqp/model/transform.py``; GAT layers always do).
        cached_input: layer 0 receives its halo rows with the input (nothing to narrow).
        kernels: the dropout masks' path (``auto``, ``torch``, ``compiled``, see
            adaqp/quant/kernels.py; ``quant.kernels`` in training), kept by every dropout.
        seed: the seed the dropout masks are keyed by (``train.seed``).
    """

    def __init__(
        self,
        config: ModelConfig,
        in_dim: int,
        out_dim: int,
        transform_first: bool = False,
        cached_input: bool = False,
        kernels: str = "auto",
        seed: int = 0,
    ):
        super().__init__()
        self.seed = seed
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
                    transform_first=transform_first
                    and b <= a
                    and not (layer == 0 and cached_input),
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
        self.aggregates_linearly = conv.aggregates_linearly
        """Every layer aggregates with the product (``Propagation``'s ``linear``)."""
        self.observe_saved: Observer | None = None

    def forward(
        self,
        x_ID: torch.Tensor,
        propagate: Propagate,
        epoch: int | None = None,
        row_ids: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Returns logits [I, out_dim] for the inner nodes.

        Args:
            x_ID: [I, F], or [I + H, F] with the halo rows of the input appended (cached).
            propagate: the aggregation (``adaqp.model.layers.Propagation``).
            epoch: the epoch the dropout masks are keyed by; needed in training with
                dropout, unused in evaluation.
            row_ids: int64 [rows of x]: the global id of each row's node, inner rows first
                (a layer's output rows are the inner nodes, the first rows of ``x``); None:
                the row index (one process on the whole graph, global ids 0..N-1).
        """
        saved = SavedTensors(self.observe_saved)
        # Without autograd (evaluation) nothing is computed again, so nothing is kept to
        # compute it from: a layer's rows before its norm go as soon as the norm is done.
        recomputes = torch.is_grad_enabled()
        with saved.hooks():
            h, before_norm = x_ID, None
            for layer, conv in enumerate(self.convs):
                saved.layer = layer
                ids = None if row_ids is None else row_ids[: h.shape[0]]
                keys = None
                if epoch is not None:
                    base = draw_key(self.seed, epoch, layer, Draw.DROPOUT)
                    keys = RowKeys.of(base, ids, h.shape[0])
                key = None if epoch is None else draw_key(self.seed, epoch, layer, Draw.ATTENTION)
                drops = self.dropout.drops(h)
                # The ReLU's output is this pass's own: dropped out where it is.
                dropped = self.dropout(h, keys, in_place=before_norm is not None)
                last = layer == len(self.convs) - 1
                # The last layer's input is read first in backward, beside its gradient:
                # kept, it costs no more than computed again, and no time; but a layer that
                # transforms first lets its input go before making the input's gradient.
                first = getattr(conv, "transform_first", False)
                keeps = last and not first
                recipe = None
                if not (keeps or not recomputes or (before_norm is None and not drops)):
                    # Saved as the way to compute it again (layer 0's undropped input, held
                    # anyway, and a kept one are saved as they are).
                    recipe = self._recipe(layer, before_norm, x_ID, keys, drops)
                del h  # the ReLU's output, once dropped out: nothing else keeps it
                with saved.recomputed(dropped, recipe):
                    # A layer that transforms first is handed its input, which then goes
                    # once transformed (adaqp/model/transform.py).
                    layer_in = Handoff(dropped) if first else dropped
                    del dropped
                    out = conv(layer_in, propagate, layer, key)
                    del layer_in
                if layer < len(self.convs) - 1:
                    h = norm_relu(out, self.norms[layer])
                    before_norm = out if recomputes else None
                else:
                    h = out
                del out
        return h

    def _recipe(
        self,
        layer: int,
        before_norm: torch.Tensor | None,
        x_ID: torch.Tensor,
        keys: RowKeys | None,
        drops: bool,
    ) -> Callable[[], torch.Tensor]:
        """Layer ``layer``'s input computed again: the dropout (where ``drops``) of
        ``relu(norm(before_norm))``, the previous layer's, or of ``x_ID`` at layer 0."""
        source = x_ID.detach() if before_norm is None else before_norm.detach()
        norm = None if before_norm is None else self.norms[layer - 1]

        def recipe() -> torch.Tensor:
            h = source if norm is None else norm_relu_again(source, norm)
            # In place where h is this recipe's own (not the held input x_ID).
            return self.dropout.replay(h, keys, in_place=norm is not None) if drops else h

        return recipe
