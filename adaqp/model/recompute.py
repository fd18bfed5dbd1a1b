"""What a GNN's forward pass keeps for backward, and what backward computes again.

A full-graph step holds every layer's saved tensors from the forward pass until backward
reaches that layer, each ``[I, D]`` for I inner rows: the per-row activation memory decides
whether a part fits a host. Plain autograd would keep, per hidden layer, the LayerNorm's
input, the ReLU's output and, for the layer after, whatever its linear maps save of their
dropped-out input (SAGE's root weight, a transform-first weight): up to four ``[I, D]``
tensors of which backward needs one. Two things cut that to what backward reads:

- :func:`norm_relu` is ``relu(norm(x))`` (``norm`` a LayerNorm or the identity) whose
  backward keeps ``x``, which LayerNorm's own backward reads, and the ReLU's mask as bits
  (one bit a value where plain autograd keeps the float output), so the gradients are bit
  for bit autograd's. Taking the mask from the normalised rows computed again in backward
  would keep nothing more, but a LayerNorm per layer and step costs more time than the
  bits save memory.
- :class:`SavedTensors`: saved-tensor hooks that save a registered tensor as the way to
  compute it again (:meth:`SavedTensors.recomputed`). A hidden layer's input, the dropout
  of the previous layer's ``relu(norm(x))``, is registered with that recipe: ``x`` is held
  anyway by :func:`norm_relu`, the dropout mask is keyed (``adaqp/model/dropout.py``), so
  the recipe gives the same bits, and the linear maps that read the input in backward (for
  their weights' gradients) hold a small token instead of ``[I, D]`` floats. Layer 0's
  input is registered as the dropout of the features, which are held anyway. The last
  layer's input is kept where it aggregates first (backward reads it first, beside its
  own gradient: computed again it would cost the same memory then, and a LayerNorm
  more); where it transforms first it is computed again too, since its transform lets
  it go before making its gradient (``adaqp/model/transform.py``).

What stays per hidden layer is one ``[I, D]`` input of the norm, the ReLU's bits and
whatever the aggregation's dense transform saves: nothing where the layer transforms
first, the aggregated rows (``[I, D_in]``: computing them again would cost a sparse
product) where it widens the rows and aggregates first. The recipes run in backward: a
LayerNorm, a ReLU and a dropout mask per recomputed input, elementwise work beside the
sparse products. No recipe holds a tensor that would not be held anyway, and a token dies
with the backward node that saved it, so nothing lives longer than under plain autograd.

Shapes: R rows, D features.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.autograd.function import once_differentiable

from adaqp.quant.pack import pack, unpack

_CHUNK_VALUES = 1 << 20
"""Values per chunk of the ReLU's mask unpacked in backward (a 1 MB bool chunk at a time)."""

Observer = Callable[[int, torch.Tensor], None]
"""``observe(layer, tensor)``: called with every tensor the forward keeps for backward."""


def _affine(norm: nn.Module):
    """``(weight, bias, normalized_shape, eps)`` of a LayerNorm; shape None for the identity."""
    if isinstance(norm, nn.LayerNorm):
        return norm.weight, norm.bias, tuple(norm.normalized_shape), norm.eps
    if isinstance(norm, nn.Identity):
        return None, None, None, 0.0
    raise TypeError(f"norm_relu takes a LayerNorm or an Identity, not {type(norm).__name__}")


def _relu_of_norm(x_RD, weight, bias, shape, eps) -> torch.Tensor:
    """``relu(norm(x))`` without autograd: the recompute, the forward's bits (the same
    kernels on the same values)."""
    if shape is None:
        return torch.relu(x_RD)
    normed, _, _ = torch.native_layer_norm(x_RD, shape, weight, bias, eps)
    return normed.relu_()


def _pack_mask(mask_RD: torch.Tensor) -> torch.Tensor:
    """uint8 ``[R, ceil(D / 8)]``: bit ``j % 8`` of byte ``j // 8`` is ``mask[r, j]`` (the
    layout of ``adaqp.quant.pack`` at one bit, and of numpy's little-endian packbits)."""
    if mask_RD.device.type == "cpu":  # numpy's packbits: one pass, no wider temporary
        packed = np.packbits(mask_RD.numpy(), axis=-1, bitorder="little")
        return torch.from_numpy(packed)
    return pack(mask_RD.view(torch.uint8), 1)


def _unpack_mask(packed_RB: torch.Tensor, dim: int) -> torch.Tensor:
    """bool ``[R, dim]``: the mask :func:`_pack_mask` packed."""
    if packed_RB.device.type == "cpu":
        bits = np.unpackbits(packed_RB.numpy(), axis=-1, count=dim, bitorder="little")
        return torch.from_numpy(bits).view(torch.bool)
    return unpack(packed_RB, 1, dim) != 0


class _ReLUOfNorm(torch.autograd.Function):
    """``relu(normed)`` for ``normed = norm(x)`` that keeps its mask as bits, a thirty-second
    of the float output plain autograd keeps. Kept apart from the norm's node so that the
    engine frees the incoming gradient before the norm's backward allocates its own, as it
    does for plain autograd's two nodes."""

    @staticmethod
    def forward(ctx, normed_RD, in_place: bool):
        # ReLU's backward (threshold_backward) zeroes the gradient where its output is <= 0,
        # i.e. where normed <= 0 (a NaN keeps it).
        ctx.save_for_backward(_pack_mask(normed_RD.le(0).logical_not_()))
        if not in_place:
            return torch.relu(normed_RD)
        ctx.mark_dirty(normed_RD)
        return normed_RD.relu_()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_RD: torch.Tensor):
        (packed,) = ctx.saved_tensors
        grad_normed = torch.empty_like(grad_RD, memory_format=torch.contiguous_format)
        zero = grad_RD.new_zeros(())
        dim = grad_RD.shape[1]
        # Unpacked a chunk of rows at a time: no [R, D] bool beside the two gradients.
        step = max(1, _CHUNK_VALUES // max(1, dim))
        for start in range(0, grad_RD.shape[0], step):
            rows = slice(start, start + step)
            kept = _unpack_mask(packed[rows], dim)
            torch.where(kept, grad_RD[rows], zero, out=grad_normed[rows])
        return grad_normed, None


def norm_relu(x_RD: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``relu(norm(x_RD))`` (``norm``: a LayerNorm or an Identity) whose backward keeps
    ``x_RD`` where a LayerNorm reads it (with its per-row mean and inverse deviation) and the
    ReLU's mask as bits; gradients bit for bit autograd's."""
    weight, bias, shape, eps = _affine(norm)
    if not torch.is_grad_enabled():
        return _relu_of_norm(x_RD, weight, bias, shape, eps)
    if shape is None:
        return _ReLUOfNorm.apply(x_RD, False)
    # In place: LayerNorm's backward reads its input, not its output.
    return _ReLUOfNorm.apply(nn.functional.layer_norm(x_RD, shape, weight, bias, eps), True)


def norm_relu_again(x_RD: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """What :func:`norm_relu` returned for ``x_RD``, computed again without autograd (a new
    tensor)."""
    with torch.no_grad():
        return _relu_of_norm(x_RD.detach(), *_affine(norm))


@dataclass(frozen=True)
class _Token:
    """A saved tensor kept as its recipe and its view's geometry."""

    recipe: Callable[[], torch.Tensor]
    base_shape: tuple[int, ...]
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


def _storage_key(tensor: torch.Tensor) -> int | None:
    if tensor.layout != torch.strided or tensor.numel() == 0:
        return None
    return tensor.untyped_storage().data_ptr()


def _unpack(packed) -> torch.Tensor:
    # A plain function, not a method: the hooks' owner would otherwise live as long as the
    # last saved tensor, and with it every recipe it ever held.
    if not isinstance(packed, _Token):
        return packed
    with torch.no_grad():
        base = packed.recipe()
    if tuple(base.shape) != packed.base_shape or not base.is_contiguous():
        raise RuntimeError(
            f"a recomputed tensor came back {tuple(base.shape)}, saved as "
            f"{packed.base_shape} (contiguous): its recipe is not the forward's"
        )
    return base.as_strided(packed.size, packed.stride, packed.offset)


class SavedTensors:
    """Saved-tensor hooks for one forward pass (:meth:`hooks`): a tensor registered with
    :meth:`recomputed` is saved as its recipe, any other as itself.

    Args:
        observe: called with ``(layer, tensor)`` for every tensor kept as itself
            (measurement and tests); ``layer`` is this object's ``layer`` at the time.
    """

    def __init__(self, observe: Observer | None = None):
        self.layer = 0
        self._observe = observe
        self._recipes: dict[int, tuple[Callable[[], torch.Tensor], tuple[int, ...], Any]] = {}

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    @contextmanager
    def recomputed(
        self, tensor: torch.Tensor, recipe: Callable[[], torch.Tensor] | None
    ) -> Iterator[None]:
        """Inside, autograd saves ``tensor`` (contiguous), or any view of it, as ``recipe``:
        a function that returns the same values again from tensors held anyway (None:
        saved as itself)."""
        key = _storage_key(tensor)
        if recipe is None or key is None or not tensor.is_contiguous():
            del tensor  # neither held here while the layer runs
            yield
            return
        # Not held here: the layer may let it go inside (``adaqp/model/transform.py``), and
        # a tensor made later at its address is then not it.
        self._recipes[key] = (recipe, tuple(tensor.shape), weakref.ref(tensor))
        del tensor
        try:
            yield
        finally:
            del self._recipes[key]

    def _pack(self, tensor: torch.Tensor):
        key = _storage_key(tensor)
        found = self._recipes.get(key) if key is not None else None
        if found is not None and found[2]() is None:  # gone: another tensor at its address
            found = None
        if found is None:
            if self._observe is not None:
                self._observe(self.layer, tensor)
            return tensor.detach()  # not the tensor itself: its grad_fn may hold this node
        recipe, base_shape, _ = found
        return _Token(recipe, base_shape, tensor.size(), tensor.stride(), tensor.storage_offset())
