"""Attention aggregation over the edges of a sparse adjacency (GAT).

For an edge v -> u (self-loops included) and head k, with transformed rows ``x``:

    e_uvk = LeakyReLU(<x_vk, a_src_k> + <x_uk, a_dst_k>)
    alpha_uvk = exp(e_uvk) / sum over u's in-edges w of exp(e_uwk)
    out_uk = sum over u's in-edges v of alpha_uvk x_vk

The adjacency supplies the edges only (its values are unused here; the planner reads them
as the uniform attention ``1 / (in-degree + 1)``, see ``LocalGraph.adjacency``). Memory
stays at the per-edge, per-head level: no dense ``N x N`` and no ``E x heads x F`` tensor.
The weighted sum runs as one CSR product per head; its backward multiplies by the
prepared transpose (the weights permuted into its order) and computes the weights'
gradient as per-edge dot products over bounded chunks of edges.

A block's destinations are the rows ``rows`` of the inner nodes, and inner node ``u``'s
own transformed row is column ``u`` of ``x`` (inner columns come first), so the
destination terms are read from ``x`` itself.

Shapes: N destination rows, M source columns, E edges, K heads, F features per head.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from adaqp.graph.aggregate import SparseAdjacency, csr_tensor
from adaqp.quant.draws import RowKeys

NEGATIVE_SLOPE = 0.2
"""LeakyReLU slope of the scores (the GAT paper's)."""

_CHUNK_VALUES = 1 << 22
"""At most this many floats per temporary of the weights' gradient (16 MB)."""


class _WeightedSum(torch.autograd.Function):
    """``out[u, k] = sum_e alpha[e, k] x[src_e, k]`` over the edges e into u."""

    @staticmethod
    def forward(ctx, adjacency: SparseAdjacency, alpha_EK, x_MKF):
        ctx.adjacency = adjacency
        ctx.save_for_backward(alpha_EK, x_MKF)
        return _per_head_product(adjacency.forward, alpha_EK, x_MKF)

    @staticmethod
    def backward(ctx, grad_NKF):
        alpha_EK, x_MKF = ctx.saved_tensors
        adjacency = ctx.adjacency
        grad_NKF = grad_NKF.contiguous()
        grad_alpha = grad_x = None
        dst, src, order = adjacency.edges()
        if ctx.needs_input_grad[1]:
            # Per-edge <grad_out[u], x[v]>, a bounded chunk of edges at a time.
            grad_alpha = alpha_EK.new_empty(alpha_EK.shape)
            step = max(1, _CHUNK_VALUES // max(1, x_MKF.shape[1] * x_MKF.shape[2]))
            for lo in range(0, dst.numel(), step):
                hi = min(lo + step, dst.numel())
                grad_alpha[lo:hi] = (grad_NKF[dst[lo:hi]] * x_MKF[src[lo:hi]]).sum(-1)
        if ctx.needs_input_grad[2]:
            grad_x = _per_head_product(adjacency.transpose, alpha_EK[order], grad_NKF)
        return None, grad_alpha, grad_x


def _per_head_product(matrix: torch.Tensor, weights_EK, dense_MKF) -> torch.Tensor:
    """``[N, K, F]``: for each head k, the CSR ``matrix``'s structure valued with
    ``weights_EK[:, k]`` (in its entry order) times ``dense_MKF[:, k]``."""
    num_rows, num_cols = matrix.shape
    out = dense_MKF.new_empty(num_rows, dense_MKF.shape[1], dense_MKF.shape[2])
    for k in range(dense_MKF.shape[1]):
        head = csr_tensor(
            matrix.crow_indices(),
            matrix.col_indices(),
            weights_EK[:, k].contiguous(),
            (num_rows, num_cols),
        )
        out[:, k] = torch.sparse.mm(head, dense_MKF[:, k].contiguous())
    return out


def attention_weights(
    adjacency: SparseAdjacency,
    x_MKF: torch.Tensor,
    att_src_KF: torch.Tensor,
    att_dst_KF: torch.Tensor,
    rows: slice,
) -> torch.Tensor:
    """The softmax-normalised weights ``alpha`` [E, K] of the block's edges (CSR order)."""
    dst, src, _ = adjacency.edges()
    num_rows = adjacency.shape[0]
    heads = x_MKF.shape[1]
    source_MK = (x_MKF * att_src_KF).sum(-1)
    target_NK = (x_MKF[rows.start : rows.start + num_rows] * att_dst_KF).sum(-1)
    scores_EK = F.leaky_relu(source_MK[src] + target_NK[dst], NEGATIVE_SLOPE)
    # Shift by each destination's largest score (a constant for the softmax: no gradient).
    top_NK = scores_EK.new_full((num_rows, heads), float("-inf")).scatter_reduce(
        0, dst.view(-1, 1).expand(-1, heads), scores_EK.detach(), "amax"
    )
    exp_EK = torch.exp(scores_EK - top_NK[dst])
    total_NK = exp_EK.new_zeros(num_rows, heads).index_add(0, dst, exp_EK)
    return exp_EK / total_NK[dst]


def attend(
    adjacency: SparseAdjacency,
    x_MKF: torch.Tensor,
    att_src_KF: torch.Tensor,
    att_dst_KF: torch.Tensor,
    rows: slice,
    attn_dropout=None,
    dropout_key: np.uint64 | None = None,
) -> torch.Tensor:
    """The attention-weighted sum of every destination's in-neighbours, [N, K, F].

    Args:
        adjacency: the block's edges, [N, M] (destinations ``rows`` of the inner nodes).
        x_MKF: transformed source rows, inner rows first.
        att_src_KF, att_dst_KF: the heads' source and destination attention vectors.
        rows: the inner rows the block's destinations are.
        attn_dropout: applied to the weights after the softmax (a module or None), each
            edge's weights keyed by the edge (``adjacency.edge_keys()``: global ids), so that
            every rank drops an edge's weights as one process on the whole graph does.
        dropout_key: the base key of the dropout's draws (``adaqp.quant.draws``); None
            outside training.
    """
    if x_MKF.shape[0] != adjacency.shape[1]:
        raise ValueError(
            f"attend: adjacency has {adjacency.shape[1]} columns but x has {x_MKF.shape[0]} rows"
        )
    alpha_EK = attention_weights(adjacency, x_MKF, att_src_KF, att_dst_KF, rows)
    if attn_dropout is not None:
        keys = None if dropout_key is None else RowKeys(dropout_key, adjacency.edge_keys())
        alpha_EK = attn_dropout(alpha_EK, keys)
    return _WeightedSum.apply(adjacency, alpha_EK, x_MKF)
