"""The learning-rate warm-up (``train.lr_warmup_epochs``, adaqp/run/schedule.py)."""

from __future__ import annotations

import pytest
import torch

from adaqp.config import ConfigError, load_config
from adaqp.run.adam import Adam
from adaqp.run.schedule import learning_rate, set_learning_rate


def _train(*overrides: str):
    return load_config(None, ["train.lr=0.02", *overrides]).train


def test_rises_linearly_then_holds():
    train = _train("train.lr_warmup_epochs=4")
    rates = [learning_rate(train, epoch) for epoch in range(1, 8)]
    assert rates == pytest.approx([0.005, 0.01, 0.015, 0.02, 0.02, 0.02, 0.02])


def test_no_warmup_and_no_epoch_give_the_rate():
    assert learning_rate(_train(), 1) == 0.02
    assert learning_rate(_train("train.lr_warmup_epochs=10"), None) == 0.02


def test_adam_steps_at_the_scheduled_rate():
    # Adam's first step moves every weight by its rate (bias-corrected m / sqrt(v) = +-1):
    # the step taken at epoch 1 of 4 is a quarter of the one without a warm-up.
    moved = {}
    for warmup in (0, 4):
        weight = torch.nn.Parameter(torch.ones(3))
        optimizer = Adam([weight], lr=0.02)
        weight.grad = torch.tensor([1.0, -2.0, 0.5])
        set_learning_rate(optimizer, _train(f"train.lr_warmup_epochs={warmup}"), 1)
        optimizer.step()
        moved[warmup] = (1 - weight.detach()).abs()
    torch.testing.assert_close(moved[0], torch.full((3,), 0.02), rtol=1e-4, atol=0)
    torch.testing.assert_close(moved[4], moved[0] / 4, rtol=1e-4, atol=0)


def test_negative_warmup_names_the_key():
    with pytest.raises(ConfigError, match=r"train\.lr_warmup_epochs"):
        _train("train.lr_warmup_epochs=-1")
