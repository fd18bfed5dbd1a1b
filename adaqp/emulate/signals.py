"""Signals during a run of the emulated cluster: stop it, but never mid-way through teardown.

``SignalGuard`` turns SIGINT and SIGTERM into the run's end (the handler installed before,
or KeyboardInterrupt), except while a held step or a held function (the cluster's
teardown) runs: then the signal is kept and delivered once that step is done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any


class SignalGuard:
    """While installed (main thread only: Python runs signal handlers there), SIGINT and
    SIGTERM stop the run, except during steps that must not be cut in half.

    A signal runs the handler installed before (Python's Ctrl-C handler raises
    KeyboardInterrupt), or raises KeyboardInterrupt where that handler was the default
    action or "ignore": a background job of a non-interactive shell inherits SIGINT
    ignored, and a Ctrl-C sent to it would otherwise be lost while the hosts stay up.
    A signal that arrives inside ``hold()`` or while a function in ``held_code`` is on
    the interrupted stack is kept and delivered when the hold ends or the guard is
    uninstalled. The stack test also covers the instant between entering a teardown
    function and its first statement, which no flag set by that statement can.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, held_code: tuple[CodeType, ...]) -> None:
        self._held_code = held_code
        self._previous: dict[int, Any] = {}
        self._depth = 0
        self._pending: int | None = None

    def install(self) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        """Restores the previous handlers, then delivers a kept signal to them."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._deliver(previous)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._deliver(self._previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._depth or self._in_held_code(frame):
            self._pending = signum  # no logging here: the interrupted code may hold its lock
            return
        self._pending = None
        _dispatch(self._previous, signum, frame)

    def _in_held_code(self, frame: FrameType | None) -> bool:
        while frame is not None:
            if frame.f_code in self._held_code:
                return True
            frame = frame.f_back
        return False

    def _deliver(self, handlers: dict[int, Any]) -> None:
        if self._pending is not None:
            signum, self._pending = self._pending, None
            _dispatch(handlers, signum, None)


def _dispatch(handlers: dict[int, Any], signum: int, frame: FrameType | None) -> None:
    handler: Callable | Any = handlers.get(signum)
    if callable(handler):
        handler(signum, frame)
    else:
        raise KeyboardInterrupt(f"signal {signum}")
