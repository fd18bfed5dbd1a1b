"""A layer's dense transform run before its aggregation, and its backward in the order
that holds least.

GCN and SAGE layers that do not widen the rows (``out_dim <= in_dim``) transform first:
``A (h W)`` is ``(A h) W``, the exchanged rows are as wide either way, and the layer then
keeps nothing for backward but its input ``h``, which a hidden layer computes again
(``adaqp/model/recompute.py``). Aggregating first would keep the aggregated rows
``[O, D]`` until backward reaches the layer, besides the transform's input gradient
``[O, D]`` backward makes from them.

:class:`Transform` is ``h W`` over every row, and where a layer has a root weight (SAGE)
``h[:O] W_root + b`` over its output rows alone: the sum the aggregation then adds into
(no separate ``[O, F]`` aggregation). Its backward makes the weights' gradients first,
lets the input go (a recomputed input is this node's alone), then makes the input's
gradient in one ``[R, D]`` buffer: the input and its gradient are never held together.

Shapes: R input rows, O output rows (the first O of R), D input features, F output
features.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class Transform(torch.autograd.Function):
    """``(h W^T, h[:O] W_root^T + bias)``; without ``root_weight``, ``h W^T`` alone."""

    @staticmethod
    def forward(ctx, h_RD, weight_FD, root_weight_FD, root_bias_F, num_out: int):
        ctx.save_for_backward(h_RD, weight_FD, root_weight_FD)
        ctx.num_out, ctx.has_bias = num_out, root_bias_F is not None
        hw_RF = h_RD.mm(weight_FD.t())
        if root_weight_FD is None:
            return hw_RF
        h_OD = h_RD[:num_out]
        if root_bias_F is None:
            return hw_RF, h_OD.mm(root_weight_FD.t())
        return hw_RF, torch.addmm(root_bias_F, h_OD, root_weight_FD.t())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_RF, grad_OF=None):
        h_RD, weight_FD, root_weight_FD = ctx.saved_tensors
        num_out = ctx.num_out
        if grad_RF is not None and grad_RF.layout != torch.strided:
            grad_RF = grad_RF.to_dense()  # only landed rows reached it (no local use)
        grad_weight = None if grad_RF is None else grad_RF.t().mm(h_RD)
        grad_root = grad_bias = None
        if grad_OF is not None:
            grad_root = grad_OF.t().mm(h_RD[:num_out])
            grad_bias = grad_OF.sum(0) if ctx.has_bias else None
        shape, dtype = h_RD.shape, h_RD.dtype
        del h_RD  # computed again for this node: let go before its gradient is made
        grad_h = None
        if ctx.needs_input_grad[0]:
            if grad_RF is not None:
                grad_h = grad_RF.mm(weight_FD)
            else:
                grad_h = torch.zeros(shape, dtype=dtype, device=weight_FD.device)
            if grad_OF is not None:
                grad_h[:num_out].addmm_(grad_OF, root_weight_FD)
        return grad_h, grad_weight, grad_root, grad_bias, None


class Handoff:
    """A layer's input handed to the layer that transforms it first, with the caller's
    reference: once ``take``n, the transform's node (which keeps a recomputed input as
    its recipe) holds the only one, so the input goes as soon as it is transformed."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor: torch.Tensor | None = tensor

    def take(self) -> torch.Tensor:
        tensor, self._tensor = self._tensor, None
        if tensor is None:
            raise RuntimeError("a layer's input was handed off twice")
        return tensor


def transform(h_RD, weight_FD, root_weight_FD=None, root_bias_F=None, num_out: int = 0):
    """:class:`Transform`: ``h W^T``, or ``(h W^T, h[:num_out] W_root^T + bias)``."""
    if root_weight_FD is not None and not 0 <= num_out <= h_RD.shape[0]:
        raise ValueError(f"transform: {num_out} output rows of an input of {h_RD.shape[0]}")
    return Transform.apply(h_RD, weight_FD, root_weight_FD, root_bias_F, num_out)
