"""A dense GAT written out from the paper's formulas, outside the project's code path.

It reads only the parameters of a ``GNN`` built with ``model.name = "gat"`` (per layer:
``linear.weight``, ``att_src``, ``att_dst``, ``bias``; LayerNorm between layers) and
computes every layer with a dense ``[heads, N, N]`` score matrix masked to the edges and
self-loops: no sparse matrix, no edge list, no local ids. Autograd reaches the parameters,
so gradients can be compared as well.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def edge_mask(indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> torch.Tensor:
    """bool [N, N]: ``mask[u, v]`` when v -> u is an edge (CSR of in-edges) or u == v."""
    mask = torch.eye(num_nodes, dtype=torch.bool)
    rows = np.repeat(np.arange(num_nodes), np.diff(indptr))
    mask[torch.from_numpy(rows), torch.from_numpy(np.asarray(indices, dtype=np.int64))] = True
    return mask


def gat_layer(conv, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One GAT layer, dense: [N, D] -> [N, heads * F] (concatenated) or [N, F] (averaged)."""
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
    out = torch.einsum("kuv,vkf->ukf", alpha, z)
    out = out.reshape(out.shape[0], -1) if conv.concat else out.mean(1)
    return out + bias


def dense_gat(model, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The whole model (evaluation: no dropout), [N, classes]."""
    h = x
    for layer, conv in enumerate(model.convs):
        h = gat_layer(conv, h, mask)
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
