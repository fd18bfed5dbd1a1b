"""The learning rate per epoch: a linear warm-up to ``train.lr``, then constant.

Adam's first steps move every weight by about the learning rate whatever its gradient's
size, so a rate that trains well later can throw the first epochs' loss far above chance;
ramping it up over ``train.lr_warmup_epochs`` epochs avoids that. The rate is a function
of the epoch alone, so a resumed run and every rank step with the same rate.
"""

from __future__ import annotations

from adaqp.config.sections import TrainConfig
from adaqp.run.adam import Adam


def learning_rate(train: TrainConfig, epoch: int | None) -> float:
    """``train.lr`` x min(1, epoch / lr_warmup_epochs), epochs numbered from 1; ``train.lr``
    without a warm-up or an epoch (a step outside the training loop)."""
    if epoch is None or train.lr_warmup_epochs == 0:
        return train.lr
    return train.lr * min(1.0, epoch / train.lr_warmup_epochs)


def set_learning_rate(optimizer: Adam, train: TrainConfig, epoch: int | None) -> None:
    """Sets every parameter group's rate for the step of ``epoch``."""
    lr = learning_rate(train, epoch)
    for group in optimizer.param_groups:
        group["lr"] = lr
