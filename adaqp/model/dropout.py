"""Dropout with a counter-based mask keyed by global identity: nn.Dropout's distribution,
the same mask on every rank and in one process on the whole graph.

Each value is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)`` (the scale computed
as nn.Dropout computes it, so kept values are bit for bit nn.Dropout's), else zeroed. A call
takes :class:`~adaqp.quant.draws.RowKeys`: a base key hashed from (seed, epoch, layer, kind of
draw) and one key per row, the global id of the node the row is (an edge's key for attention
weights). Value ``(r, j)`` is kept when its 32-bit draw, a hash of (base key, row key, j), is
at least ``round(p·2**32)`` (:mod:`adaqp.quant.mask`): ``P(keep)`` is within ``2**-33`` of
``1 - p``. The mask depends on nothing else: not on the rank, the rows' local order, the
thread count, the path (compiled kernel for float32 CPU tensors, torch operators elsewhere:
the same bits) or any generator's state, so P workers drop exactly what one process drops,
and nothing needs saving to replay it. Nothing is stored for backward but the keys: the
gradient is scaled by the same mask, drawn again. In evaluation, or with ``p = 0``, the input
is returned as it is.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from adaqp.quant import kernels as quant_kernels
from adaqp.quant.draws import RowKeys
from adaqp.quant.mask import keep_threshold, masked_scale


class _MaskedScale(torch.autograd.Function):
    """``x·mask·scale`` with the mask of (keys, threshold); backward: the same for the gradient."""

    @staticmethod
    def forward(ctx, x, keys: RowKeys, threshold: int, scale: float, kernels, in_place: bool):
        ctx.mask = (keys, threshold, scale, kernels)
        if not in_place:
            return masked_scale(x, keys, threshold, scale, kernels)
        ctx.mark_dirty(x)
        masked_scale(x, keys, threshold, scale, kernels, True)
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return masked_scale(grad, *ctx.mask), None, None, None, None, None


def keep_scale(p: float, dtype: torch.dtype = torch.float32) -> float:
    """``1 / (1 - p)`` in ``dtype``, as nn.Dropout computes its scale (``ones.div_(1 - p)``)."""
    return float(torch.ones((), dtype=dtype).div_(1 - p))


class Dropout(nn.Dropout):
    """nn.Dropout whose mask is a function of the rows' keys (see the module docstring).

    Args:
        p: probability of zeroing a value, in ``[0, 1)``.
        kernels: ``auto``, ``torch`` or ``compiled`` (:mod:`adaqp.quant.kernels`): the mask's
            path, the module's own (two models in one process may differ); ``auto`` takes
            the compiled kernels for float32 CPU tensors.
    """

    def __init__(self, p: float = 0.5, kernels: str = "auto"):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        super().__init__(p)
        self.kernels = quant_kernels.check_kernels(kernels)
        self._threshold = keep_threshold(p)

    def drops(self, x: torch.Tensor) -> bool:
        """Whether a call on ``x`` drops anything (else it returns ``x`` itself)."""
        return self.training and self.p > 0 and x.numel() > 0

    def forward(
        self, x: torch.Tensor, keys: RowKeys | None = None, in_place: bool = False
    ) -> torch.Tensor:
        """``x`` [R, ...] with values dropped; ``keys``: the call's keys, one per row of ``x``
        (needed in training with ``p > 0``); ``in_place``: written into ``x`` (contiguous,
        read by no backward), one ``[R, ...]`` tensor fewer."""
        if not self.drops(x):
            return x
        if keys is None:
            raise ValueError(
                "dropout in training needs its rows' keys (RowKeys: the epoch, layer and "
                "global ids its mask is drawn for); pass the epoch to the model"
            )
        scale = keep_scale(self.p, x.dtype)
        return _MaskedScale.apply(x, keys, self._threshold, scale, self.kernels, in_place)

    def replay(self, x: torch.Tensor, keys: RowKeys, in_place: bool = False) -> torch.Tensor:
        """What a training call with ``keys`` returned for ``x``, drawn again without
        autograd, whatever the module's mode now: how backward recomputes a dropped-out
        input instead of keeping it (``adaqp/model/recompute.py``). ``in_place``: written
        into ``x`` (contiguous), one tensor fewer at a time."""
        scale = keep_scale(self.p, x.dtype)
        return masked_scale(x, keys, self._threshold, scale, self.kernels, in_place)

    def warm_up(self) -> None:
        """Loads the mask kernel now (before timed steps) if this module will use it on CPU."""
        if self.p > 0 and quant_kernels.use_compiled(self.kernels, "cpu"):
            quant_kernels.warm_up()
