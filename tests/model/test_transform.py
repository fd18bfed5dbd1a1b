"""A layer's transform run first (adaqp/model/transform.py): autograd's products and
gradients, the root term over the output rows alone, and an input handed off once."""

from __future__ import annotations

import pytest
import torch

from adaqp.model.first import transforms_first
from adaqp.model.recompute import SavedTensors
from adaqp.model.transform import Handoff, transform

R, O, D, F = 30, 20, 8, 5


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(R, D, generator=gen, requires_grad=True)
    weight = torch.randn(F, D, generator=gen, requires_grad=True)
    root = torch.randn(F, D, generator=gen, requires_grad=True)
    bias = torch.randn(F, generator=gen, requires_grad=True)
    return h, weight, root, bias


def _grads(outputs, inputs, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    loss = sum((out * torch.randn(out.shape, generator=gen)).sum() for out in outputs)
    return torch.autograd.grad(loss, inputs, retain_graph=True)


@pytest.mark.parametrize("with_root", [False, True])
def test_products_and_gradients_are_autograds(with_root):
    h, weight, root, bias = _inputs()
    if with_root:
        ours = transform(h, weight, root, bias, O)
        plain = (h @ weight.t(), h[:O] @ root.t() + bias)
        inputs = (h, weight, root, bias)
    else:
        ours = (transform(h, weight),)
        plain = (h @ weight.t(),)
        inputs = (h, weight)
    for a, b in zip(ours, plain, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(_grads(ours, inputs), _grads(plain, inputs), strict=True):
        torch.testing.assert_close(a, b)
    # And the comparison can fail: other output gradients give other input gradients.
    assert not torch.allclose(_grads(ours, inputs)[0], _grads(plain, inputs, seed=2)[0])


def test_the_root_term_reads_only_the_output_rows():
    h, weight, root, bias = _inputs()
    _, root_sum = transform(h, weight, root, bias, O)
    (grad_h,) = torch.autograd.grad(root_sum.sum(), h)
    assert root_sum.shape == (O, F)
    assert grad_h[O:].abs().sum() == 0 and grad_h[:O].abs().sum() > 0


def test_a_recomputed_input_is_computed_again_once_in_backward():
    h, weight, root, bias = _inputs()
    source = h.detach().clone()
    made = []

    def recipe():
        made.append(1)
        return source.clone()

    saved = SavedTensors()
    x = source.clone().requires_grad_(True)
    with saved.hooks(), saved.recomputed(x, recipe):
        outputs = transform(Handoff(x).take(), weight, root, bias, O)
    grads = _grads(outputs, (x, weight, root, bias))
    plain = _grads(transform(h, weight, root, bias, O), (h, weight, root, bias))
    assert made == [1]
    for a, b in zip(grads, plain, strict=True):
        torch.testing.assert_close(a, b)


def test_an_input_is_handed_off_once():
    handoff = Handoff(torch.zeros(2))
    handoff.take()
    with pytest.raises(RuntimeError, match="handed off twice"):
        handoff.take()


def test_more_output_rows_than_input_rows_are_refused():
    h, weight, root, bias = _inputs()
    with pytest.raises(ValueError, match="output rows"):
        transform(h, weight, root, bias, R + 1)


def test_a_layer_transforms_first_where_it_narrows_or_keeps_its_width_on_as_many_rows():
    assert transforms_first(8, 4, num_in=100, num_out=10)  # narrows: always
    assert transforms_first(8, 8, num_in=105, num_out=100)  # as wide, about as many rows
    assert not transforms_first(8, 8, num_in=200, num_out=100)  # twice the dense work
    assert not transforms_first(4, 8, num_in=100, num_out=100)  # widens
