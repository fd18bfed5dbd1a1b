"""Dropout with a counter-based mask: nn.Dropout's distribution at a fraction of its cost.

Each value is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)`` (the scale computed
as nn.Dropout computes it, so kept values are bit for bit nn.Dropout's), else zeroed. On the
compiled path (:mod:`adaqp.quant.kernels`; float32 CPU tensors) a call draws one 64-bit seed
from torch's default generator and value ``i`` (flat index) is kept when its 32-bit draw, a
hash of (seed, i) (:func:`adaqp.quant.compiled.masked_scale_serial`), is at least
``round(p·2**32)``: ``P(keep)`` is within ``2**-33`` of ``1 - p``, exactly uniform draws for a
uniform seed as for the quantizer. Nothing is stored for backward but the seed: the gradient
is scaled by the same mask, drawn again. The torch generator's state (checkpointed with the
run) therefore replays the masks, and the thread count does not change them. Elsewhere (CUDA,
other dtypes, or ``kernels = "torch"``) it is nn.Dropout. In evaluation, or with ``p = 0``,
the input is returned as it is and no random number is drawn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from adaqp.quant import kernels as quant_kernels


class _MaskedScale(torch.autograd.Function):
    """``x·mask·scale`` with the mask of (seed, threshold); backward: the same for the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seed, threshold: int, scale: float) -> torch.Tensor:
        ctx.mask = (seed, threshold, scale)
        return quant_kernels.masked_scale(x.contiguous(), seed, threshold, scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        seed, threshold, scale = ctx.mask
        grad = grad.to(torch.float32).contiguous()
        return quant_kernels.masked_scale(grad, seed, threshold, scale), None, None, None


def keep_scale(p: float) -> float:
    """``1 / (1 - p)`` in float32, as nn.Dropout computes its scale (``ones.div_(1 - p)``)."""
    return float(torch.ones((), dtype=torch.float32).div_(1 - p))


class Dropout(nn.Dropout):
    """nn.Dropout whose mask comes from a compiled counter-based kernel on CPU.

    Args:
        p: probability of zeroing a value, in ``[0, 1)``.
        kernels: ``auto``, ``torch`` or ``compiled`` (:mod:`adaqp.quant.kernels`); None: the
            process default at each call.
    """

    def __init__(self, p: float = 0.5, kernels: str | None = None):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        super().__init__(p)
        self.kernels = kernels if kernels is None else quant_kernels.check_kernels(kernels)
        self._threshold = quant_kernels.keep_threshold(p)
        self._scale = keep_scale(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or x.numel() == 0:
            return x
        if x.dtype == torch.float32 and quant_kernels.use_compiled(self.kernels, x.device):
            seed = quant_kernels.message_seed(None)  # torch's default (CPU) generator
            return _MaskedScale.apply(x, seed, self._threshold, self._scale)
        return F.dropout(x, self.p, True)

    def warm_up(self) -> None:
        """Loads the mask kernel now (before timed steps) if this module will use it on CPU."""
        if self.p > 0 and quant_kernels.use_compiled(self.kernels, "cpu"):
            quant_kernels.warm_up()
