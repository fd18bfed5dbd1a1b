"""The error a failed training epoch raises, naming the rank, the epoch and, where the
failure was in communication, the peers that did not report it (stopped, hung or lost)."""

from __future__ import annotations

import torch.distributed as dist

from adaqp.exchange.transport import ExchangeError
from adaqp.run.gradsync import GradientSyncError
from adaqp.runtime import World, unresponsive_peers


class TrainingError(RuntimeError):
    """A training step failed (often a dead or stuck peer); names the rank and epoch."""


def epoch_failure(world: World, epoch: int, exc: RuntimeError) -> TrainingError:
    """The error of a failed epoch; names the peers that did not see the failure."""
    message = f"rank {world.rank}: training step failed at epoch {epoch}: {exc}"
    if world.world_size > 1 and _is_communication_failure(exc):
        peers = unresponsive_peers(world, f"epoch {epoch}")
        if peers:
            message += (
                f"\n  rank(s) {', '.join(map(str, peers))} did not report the failure: "
                "stopped, hung or lost (check their hosts and logs)"
            )
    return TrainingError(message)


def _is_communication_failure(exc: RuntimeError) -> bool:
    """Whether a failed step failed in communication (an exchange, the gradient
    all-reduce, or any collective: the backend's own errors name it)."""
    if isinstance(exc, ExchangeError | GradientSyncError | dist.DistError):
        return True
    text = str(exc).lower()
    return "gloo" in text or "nccl" in text
