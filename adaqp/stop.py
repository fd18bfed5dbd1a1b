"""The stop signals a worker has received (Ctrl-C, torchrun's SIGTERM).

``adaqp.train`` installs :func:`request_stop` for SIGINT and SIGTERM: it records the signal
and unwinds as Ctrl-C does (KeyboardInterrupt), so that the run ends "interrupted". A rank
blocked in a collective when it is asked to stop may see the collective fail before its
own KeyboardInterrupt arrives, because a peer that stopped first closed its connections;
:func:`stop_requested` tells that such an error is part of the stop, not a failure of the
run. Kept free of heavy imports: ``adaqp.train`` installs the handler before torch loads.
"""

from __future__ import annotations

import signal

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
