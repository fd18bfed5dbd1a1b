"""When exchanges land, decided by a test: a slow link, or a schedule of landings, or
(without collectives) a transport whose rows say when they were sent.

The first two wrap the collective handles that a ``HaloTransport`` launches (the project's
code runs unchanged): a policy asking whether an exchange has landed gets the test's
answer, and a wait still waits for the real rows (then the exchange has landed for good).
``EpochRows`` is one rank's transport with no peers, for the policies' own tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace

import torch

from adaqp.exchange.nocomm import NoCommTransport
from adaqp.exchange.transport import ExchangeKey, HaloTransport, PendingExchange


class _Work:
    """A collective's handle that has landed when ``landed()`` says so; ``ready_at``
    (perf_counter seconds): a wait lasts at least until then."""

    def __init__(self, work, landed: Callable[[], bool], ready_at: float = 0.0):
        self._work = work
        self._landed = landed
        self._ready_at = ready_at

    def is_completed(self) -> bool:
        return self._landed()

    def wait(self, timeout: timedelta | None = None) -> bool:
        delay = self._ready_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return self._work.wait() if timeout is None else self._work.wait(timeout=timeout)

    def get_future(self):
        return self._work.get_future()


def _wrap_launches(transport: HaloTransport, wrap: Callable[[object, ExchangeKey], object]):
    launch = transport._launch

    def launched(recv, send, in_splits, out_splits, key: ExchangeKey):
        return wrap(launch(recv, send, in_splits, out_splits, key), key)

    transport._launch = launched


def delay_landings(transport: HaloTransport, seconds: float) -> None:
    """Every exchange ``transport`` starts from now on lands ``seconds`` after it starts,
    or later (a slow link); a wait for it blocks until then."""
    if seconds <= 0:
        return

    def wrap(work, key: ExchangeKey) -> _Work:
        ready_at = time.perf_counter() + seconds

        def landed() -> bool:
            return time.perf_counter() >= ready_at and work.is_completed()

        return _Work(work, landed, ready_at)

    _wrap_launches(transport, wrap)


def schedule_landings(trainer, landed: Callable[[ExchangeKey, int, int], bool]) -> None:
    """From now on, the exchange of ``key`` that ``trainer`` starts at epoch ``s`` has
    landed at epoch ``t`` (as its policy sees it) iff ``landed(key, s, t)`` or it has been
    waited for: what a layer reads then depends on the schedule alone, not on timing."""
    epoch = [0]
    begin = trainer.policy.begin_epoch

    def begin_epoch(at: int, counters) -> None:
        epoch[0] = at
        begin(at, counters)

    trainer.policy.begin_epoch = begin_epoch

    def wrap(work, key: ExchangeKey) -> _Work:
        started = epoch[0]
        return _Work(work, lambda: landed(key, started, epoch[0]))

    _wrap_launches(trainer.transport, wrap)


class EpochRows(NoCommTransport):
    """Every row of the exchange started at epoch ``epoch`` is that epoch's number, so that
    what a layer reads is the weighted mean start epoch of the buffers it averaged; the
    exchange started at epoch s has landed at epoch t iff ``landed(s, t)``."""

    class _Work:
        def __init__(self, transport: EpochRows, started: int):
            self._transport, self._started = transport, started

        def is_completed(self) -> bool:
            return self._transport.landed(self._started, self._transport.epoch)

        def wait(self, timeout=None) -> bool:
            return True

        def get_future(self):
            return SimpleNamespace(add_done_callback=lambda callback: None)

    def __init__(self, landed):
        super().__init__(0, [0, 2], [0, 3])
        self.landed = landed
        self.epoch = 0

    def start(self, rows_RD, key, plan=None, ranges=False, *, selected=False) -> PendingExchange:
        _, in_counts = self.counts(key)
        recv = torch.full((sum(in_counts), rows_RD.shape[1]), float(self.epoch))
        work = self._Work(self, self.epoch)
        return PendingExchange(self, key, work, recv, bytes_sent=0, bits_histogram={})
