"""Dropout's keyed mask, on the compiled path and on torch operators, the same bits on both.

Value ``(r, j)`` of an ``[R, C]`` tensor is kept when its 32-bit draw, word ``j`` of row
``r`` under the call's :class:`~adaqp.quant.draws.RowKeys` (:mod:`adaqp.quant.draws`), is at
least ``round(p·2**32)``; a kept value is multiplied by the scale, a dropped one by 0 (one
float multiply either way, so both paths give the same floats). The compiled kernel
(:func:`adaqp.quant.compiled.masked_scale_serial`) runs on float32 CPU tensors; elsewhere
(CUDA, other dtypes, ``kernels = "torch"``) :func:`adaqp.quant.draws.keep_mask` computes
the same mask with torch operators.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from adaqp.quant import kernels as quant_kernels
from adaqp.quant.draws import RowKeys, keep_mask


def keep_threshold(p: float) -> int:
    """The 32-bit draw a value needs to be kept by dropout with probability ``p`` of a zero:
    ``round(p·2**32)``, so ``P(keep) = 1 - threshold / 2**32`` is within ``2**-33`` of
    ``1 - p``."""
    return round(p * 2**32)


def masked_scale(
    x_RC: Tensor,
    keys: RowKeys,
    threshold: int,
    scale: float,
    kernels: str | None = None,
    in_place: bool = False,
) -> Tensor:
    """``x·scale`` where value ``(r, j)``'s keyed draw is at least ``threshold``, ``x·0``
    elsewhere: a new tensor, or ``x_RC`` itself, overwritten, with ``in_place`` (a
    contiguous ``x_RC``; each value is read before its own slot is written, so both paths
    give the same bits either way).

    Args:
        x_RC: ``[R, C]`` (or ``[R, ...]``, its values per row taken as the columns).
        keys: the call's keys, one row key per row of ``x``.
        threshold: :func:`keep_threshold` of the dropout probability.
        scale: the kept values' factor, in ``x``'s dtype (``1 / (1 - p)``).
        kernels: ``auto``, ``torch`` or ``compiled`` (None: the process default).
        in_place: write into ``x_RC``.
    """
    if x_RC.shape[0] != len(keys):
        raise ValueError(f"{len(keys)} row keys for {x_RC.shape[0]} rows")
    if in_place and not x_RC.is_contiguous():
        raise ValueError("masked_scale in place needs a contiguous tensor")
    rows = x_RC.reshape(x_RC.shape[0], -1)
    if x_RC.dtype == torch.float32 and quant_kernels.use_compiled(kernels, x_RC.device):
        compiled = quant_kernels.compiled_module()
        rows = rows.contiguous()
        out = rows if in_place else torch.empty_like(rows)
        src, dst = quant_kernels.numpy_view(rows), quant_kernels.numpy_view(out)
        args = (src, dst, keys.base, keys.rows, threshold, np.float32(scale))
        count = quant_kernels.parallel_threads(rows.numel())
        if count == 1:
            compiled.masked_scale_serial(*args)
        else:
            compiled.masked_scale_parallel(*args, 4 * count)
        return out.view(x_RC.shape)
    keep = keep_mask(keys, rows.shape[1], threshold, x_RC.device)
    factor = torch.where(keep, torch.tensor(scale, dtype=x_RC.dtype, device=x_RC.device), 0.0)
    factor = factor.to(x_RC.dtype)
    return (rows.mul_(factor) if in_place else rows * factor).view(x_RC.shape)
