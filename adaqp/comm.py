"""Halo exchange transport: one uneven ``all_to_all_single`` per layer and direction.

``start`` launches the exchange asynchronously and returns a handle; ``wait`` on the
handle blocks until the rows land. Forward sends inner rows to the peers that hold them
as halo; backward returns the halo rows' gradients to their owners. Every wait is
bounded by ``timeout_s`` and fails with the rank and the step in the message.

Shapes: I inner rows, H halo rows, S rows sent, D features.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


class ExchangeError(RuntimeError):
    """A halo exchange failed or timed out; names the rank and the step."""


@dataclass
class ExchangeStats:
    """Counters for one epoch (reset by the trainer)."""

    bytes_sent: int = 0
    """Payload plus metadata bytes this rank sent."""
    exchange_s: float = 0.0
    """Wall time from each start to the end of its wait."""
    wait_s: float = 0.0
    """Time blocked in wait (exchange time not hidden behind compute)."""
    calls: int = 0
    bytes_by_tag: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.bytes_sent, self.exchange_s, self.wait_s, self.calls = 0, 0.0, 0.0, 0
        self.bytes_by_tag = {}


class PendingExchange:
    """Handle of an exchange in flight; ``wait()`` returns the received rows."""

    def __init__(self, exchanger: HaloExchanger, work, recv: torch.Tensor, tag: str, start: float):
        self._exchanger = exchanger
        self._work = work
        self._recv = recv
        self._tag = tag
        self._start = start

    def wait(self) -> torch.Tensor:
        ex = self._exchanger
        began = time.perf_counter()
        if self._work is not None:
            try:
                self._work.wait(timeout=timedelta(seconds=ex.timeout_s))
            except Exception as exc:  # gloo/nccl raise RuntimeError subclasses
                raise ExchangeError(
                    f"rank {ex.rank}: halo exchange {self._tag} at {ex.step} failed or timed "
                    f"out after {ex.timeout_s:.0f}s (is a peer dead?): {exc}"
                ) from exc
        end = time.perf_counter()
        ex.stats.wait_s += end - began
        ex.stats.exchange_s += end - self._start
        return self._recv


class HaloExchanger:
    """Moves halo rows between the ranks of ``group`` according to a partition's lists.

    Args:
        rank: this worker's rank (for messages).
        send_idx: int64 [S] local inner ids to send, peer by peer in rank order.
        send_counts: rows sent to each peer, length P.
        recv_counts: halo rows received from each peer, length P.
        timeout_s: bound on every wait.
        group: process group (default: the world).
    """

    def __init__(
        self,
        rank: int,
        send_idx: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        timeout_s: float = 600.0,
        group: dist.ProcessGroup | None = None,
    ):
        self.rank = rank
        self.send_idx = send_idx
        self.send_counts = list(send_counts)
        self.recv_counts = list(recv_counts)
        self.num_halo = sum(self.recv_counts)
        self.timeout_s = timeout_s
        self.group = group
        self.stats = ExchangeStats()
        self.step = "set-up"
        """Where training is (e.g. "epoch 3"); set by the trainer, quoted in errors."""

    def _launch(self, send: torch.Tensor, recv: torch.Tensor, out_splits, in_splits, tag):
        start = time.perf_counter()
        try:
            work = dist.all_to_all_single(
                recv, send, out_splits, in_splits, group=self.group, async_op=True
            )
        except Exception as exc:
            raise ExchangeError(
                f"rank {self.rank}: could not start halo exchange {tag} at {self.step}: {exc}"
            ) from exc
        nbytes = send.numel() * send.element_size()
        self.stats.bytes_sent += nbytes
        self.stats.calls += 1
        self.stats.bytes_by_tag[tag] = self.stats.bytes_by_tag.get(tag, 0) + nbytes
        return PendingExchange(self, work, recv, tag, start)

    def start(self, h_ID: torch.Tensor, tag: str = "forward") -> PendingExchange:
        """Sends this rank's rows to the peers; ``wait()`` gives the halo rows [H, D]."""
        send = h_ID.index_select(0, self.send_idx)
        recv = h_ID.new_empty((self.num_halo, h_ID.shape[1]))
        return self._launch(send, recv, self.recv_counts, self.send_counts, tag)

    def start_grad(self, grad_HD: torch.Tensor, tag: str = "backward") -> PendingExchange:
        """Returns halo gradients to their owners; ``wait()`` gives [S, D] gradient rows
        aligned with ``send_idx`` (to be summed into the inner rows)."""
        recv = grad_HD.new_empty((len(self.send_idx), grad_HD.shape[1]))
        return self._launch(grad_HD.contiguous(), recv, self.send_counts, self.recv_counts, tag)
