"""Tests for adaqp.model.dropout: nn.Dropout's distribution from a counter-based mask.

Keep rate and scaling (statistically, and bit for bit against nn.Dropout's kept values), the
gradient through the same mask, reproducibility from torch's generator state, independence
from the thread count, and the cases that return the input untouched or fall back to torch.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from adaqp.config import ModelConfig
from adaqp.model.dropout import Dropout, keep_scale
from adaqp.model.gnn import GNN
from adaqp.quant import kernels as K

compiled = pytest.mark.skipif(not K.compiled_available(), reason="numba is not importable")


@compiled
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_scale(p: float):
    torch.manual_seed(int(p * 10))
    x = torch.rand(300, 700) + 0.5  # no zeros: a zero output means dropped
    y = Dropout(p, "compiled")(x)
    kept = y != 0
    n = x.numel()
    rate = kept.double().mean().item()
    assert abs(rate - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / n)
    # Kept values are x / (1 - p), bit for bit nn.Dropout's (same float32 scale, one multiply).
    reference = F.dropout(x, p, True)
    scale = keep_scale(p)
    assert torch.equal(y[kept], x[kept] * scale)
    assert torch.equal(reference[reference != 0], x[reference != 0] * scale)
    assert (y[~kept] == 0).all()
    # No stripes: the keep rate of every column block and row block is 1 - p within noise.
    for blocks in (kept.view(300, 7, 100).double().mean((0, 2)), kept.double().mean(1)):
        count = n / blocks.numel()
        assert ((blocks - (1 - p)).abs() <= 5 * math.sqrt(p * (1 - p) / count)).all()
    # Its expectation is x: the mean of y / x over all values is 1 within noise.
    ratio = (y / x).double().mean().item()
    assert abs(ratio - 1) <= 5 * scale * math.sqrt(p * (1 - p) / n)


@compiled
def test_gradient_goes_through_the_same_mask():
    torch.manual_seed(3)
    x = (torch.rand(64, 50) + 0.5).requires_grad_()
    dropout = Dropout(0.4, "compiled")
    y = dropout(x)
    grad = torch.randn(64, 50)
    y.backward(grad)
    scale = keep_scale(0.4)
    assert torch.equal(x.grad, torch.where(y != 0, grad * scale, grad * 0.0))
    # A second call draws a new mask.
    assert not torch.equal(dropout(x) != 0, y != 0)


@compiled
def test_masks_replay_from_the_generator_state_and_ignore_threads():
    x = torch.rand(200, 200) + 0.5  # 40000 values: the prange kernel when threads > 1
    dropout = Dropout(0.5, "compiled")
    torch.manual_seed(11)
    state = torch.get_rng_state()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = dropout(x)
        torch.set_rng_state(state)
        torch.set_num_threads(2)
        again = dropout(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first, again)
    # One 64-bit draw per call from the default generator.
    torch.set_rng_state(state)
    K.message_seed(None)
    after = torch.get_rng_state()
    torch.set_rng_state(state)
    dropout(x)
    assert torch.equal(torch.get_rng_state(), after)


def test_identity_in_evaluation_and_at_zero_without_drawing():
    x = torch.randn(10, 10)
    state = torch.get_rng_state()
    assert Dropout(0.0)(x) is x
    evaluation = Dropout(0.5)
    evaluation.eval()
    assert evaluation(x) is x
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)


def test_torch_path_and_other_dtypes_are_nn_dropout():
    x = torch.ones(100, 100, dtype=torch.float64)
    torch.manual_seed(5)
    y = Dropout(0.5)(x)
    torch.manual_seed(5)
    assert torch.equal(y, F.dropout(x, 0.5, True))
    x = torch.ones(100, 100)
    torch.manual_seed(5)
    y = Dropout(0.5, "torch")(x)
    torch.manual_seed(5)
    assert torch.equal(y, F.dropout(x, 0.5, True))


def test_the_model_uses_it():
    model = GNN(ModelConfig(dropout=0.3), 5, 2, kernels="torch")
    assert isinstance(model.dropout, Dropout) and model.dropout.p == 0.3
    assert model.dropout.kernels == "torch"
