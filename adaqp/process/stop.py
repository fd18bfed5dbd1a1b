"""The stop signals a worker has received (Ctrl-C, torchrun's SIGTERM), and stopping on them.

``adaqp.train`` installs :func:`request_stop` for SIGINT and SIGTERM: it records the signal
and unwinds as Ctrl-C does (KeyboardInterrupt), so that the run ends "interrupted". A rank
blocked in a collective when it is asked to stop may see the collective fail before its
own KeyboardInterrupt arrives, because a peer that stopped first closed its connections;
:func:`stop_requested` tells that such an error is part of the stop, not a failure of the
run. Partitioning installs the same handler for as long as it runs
(:func:`stopping_on_signals`), so that its scratch files go on either signal, and hands
back a signal that a native library trapped itself (:func:`redelivering_trapped_signals`).
Kept free of heavy imports: ``adaqp.train`` installs the handler before torch loads.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Ctrl-C, and what torchrun, schedulers and ``kill`` send to stop a process."""

_stop_signals: list[str] = []
"""The stop signals this process has received, by name, in order."""


def request_stop(signum: int, frame: object) -> None:
    """Signal handler: records the signal, then raises KeyboardInterrupt naming it."""
    name = signal.Signals(signum).name
    _stop_signals.append(name)
    raise KeyboardInterrupt(name)


def stop_requested() -> str | None:
    """The first stop signal this process received (e.g. "SIGINT"), or None."""
    return _stop_signals[0] if _stop_signals else None


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise KeyboardInterrupt naming the signal
    (:func:`request_stop`), so that ``finally`` blocks and context managers clean up
    before the process ends; the handlers found are put back on the way out (a trainer's
    own, say).

    SIGINT stops also where it was inherited as ignored: a background job of a
    non-interactive shell (a script, CI) starts so, and a Ctrl-C meant for it would be
    lost. Off the main thread, where Python runs no signal handlers, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, request_stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: installed outside Python, which cannot be put back; the default is.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def redelivering_trapped_signals() -> Iterator[None]:
    """Around a native call that traps stop signals with a handler of its own: hands a
    trapped one back to the process's handler when the call ends.

    Such a library (METIS traps SIGTERM while it runs) ends the call at once on the
    signal and jumps out of its handler, which leaves the signal blocked in this thread
    and the call failing with an error that does not name it; the process's own handler
    never hears of it. On the way out, signals blocked since entry are unblocked, and a
    stop signal among them is raised again: under :func:`stopping_on_signals` that is
    KeyboardInterrupt naming it (in place of the call's error); with the default action
    the process ends, as the signal would have ended it.
    """
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        yield
    finally:
        trapped = signal.pthread_sigmask(signal.SIG_BLOCK, ()) - before
        if trapped:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
            for signum in sorted(trapped & set(STOP_SIGNALS)):
                signal.raise_signal(signum)
