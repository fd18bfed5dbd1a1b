"""A dense GAT written out from the paper's formulas, outside the project's code path.

It reads only the parameters of a ``GNN`` built with ``model.name = "gat"`` (per layer:
``linear.weight``, ``att_src``, ``att_dst``, ``bias``; LayerNorm between layers) and
computes every layer with a dense ``[heads, N, N]`` score matrix masked to the edges and
self-loops: no sparse matrix, no edge list, no local ids. Autograd reaches the parameters,
so gradients can be compared as well. In training (an epoch given) it drops what the
project's keyed dropout drops on the whole graph: node i's row keyed by i, the attention
weight of edge v -> u by ``(u << 32) | v``, drawn by ``adaqp.quant.draws.keep_mask``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from adaqp.quant.draws import Draw, RowKeys, draw_key, keep_mask


def edge_mask(indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> torch.Tensor:
    """bool [N, N]: ``mask[u, v]`` when v -> u is an edge (CSR of in-edges) or u == v."""
    mask = torch.eye(num_nodes, dtype=torch.bool)
    rows = np.repeat(np.arange(num_nodes), np.diff(indptr))
    mask[torch.from_numpy(rows), torch.from_numpy(np.asarray(indices, dtype=np.int64))] = True
    return mask


def _kept(base: np.uint64, rows: np.ndarray, cols: int, p: float, dtype) -> torch.Tensor:
    """[R, cols]: ``1 / (1 - p)`` where keyed dropout keeps a value, else 0."""
    keep = keep_mask(RowKeys.of(base, rows), cols, round(p * 2**32))
    scale = torch.ones((), dtype=dtype).div_(1 - p)
    return torch.where(keep, scale, torch.zeros((), dtype=dtype))


def gat_layer(
    conv, h: torch.Tensor, mask: torch.Tensor, attention_key: np.uint64 | None = None
) -> torch.Tensor:
    """One GAT layer, dense: [N, D] -> [N, heads * F] (concatenated) or [N, F] (averaged);
    with ``attention_key``, its attention dropout keyed by it."""
    heads, width = conv.att_src.shape
    weight, att_src, att_dst, bias = (
        p.to(h.dtype) for p in (conv.linear.weight, conv.att_src, conv.att_dst, conv.bias)
    )
    z = (h @ weight.T).view(-1, heads, width)  # [N, K, F]
    source = (z * att_src).sum(-1).T  # [K, N]
    target = (z * att_dst).sum(-1).T  # [K, N]
    scores = nn.functional.leaky_relu(target[:, :, None] + source[:, None, :], 0.2)
    scores = scores.masked_fill(~mask, float("-inf"))  # [K, N (dst), N (src)]
    alpha = torch.softmax(scores, dim=-1)
    if attention_key is not None and conv.attn_dropout.p > 0:
        dst, src = mask.nonzero(as_tuple=True)
        keys = (dst.numpy().astype(np.uint64) << np.uint64(32)) | src.numpy().astype(np.uint64)
        factor = torch.zeros_like(alpha)
        factor[:, dst, src] = _kept(attention_key, keys, heads, conv.attn_dropout.p, h.dtype).T
        alpha = alpha * factor
    out = torch.einsum("kuv,vkf->ukf", alpha, z)
    out = out.reshape(out.shape[0], -1) if conv.concat else out.mean(1)
    return out + bias


def dense_gat(model, x: torch.Tensor, mask: torch.Tensor, epoch: int | None = None):
    """The whole model, [N, classes]: in evaluation (no ``epoch``) without dropout; with
    ``epoch``, its input and attention dropout keyed by ``model.seed`` and ``epoch``."""
    h = x
    for layer, conv in enumerate(model.convs):
        attention_key = None
        if epoch is not None:
            nodes = np.arange(h.shape[0], dtype=np.uint64)
            if model.dropout.p > 0:
                base = draw_key(model.seed, epoch, layer, Draw.DROPOUT)
                h = h * _kept(base, nodes, h.shape[1], model.dropout.p, h.dtype)
            attention_key = draw_key(model.seed, epoch, layer, Draw.ATTENTION)
        h = gat_layer(conv, h, mask, attention_key)
        if layer < len(model.convs) - 1:
            norm = model.norms[layer]
            if isinstance(norm, nn.LayerNorm):
                h = nn.functional.layer_norm(
                    h,
                    norm.normalized_shape,
                    norm.weight.to(h.dtype),
                    norm.bias.to(h.dtype),
                    norm.eps,
                )
            h = torch.relu(h)
    return h
