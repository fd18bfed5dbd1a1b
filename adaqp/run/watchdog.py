"""A warning while an epoch stalls, long before the run fails.

A collective that waits on a stopped, hung or far slower peer fails after
``comm.timeout_s`` (600 s by default) with an error naming the rank and the step. Until
then nothing would be printed: :class:`StallWatch` warns, from every rank whose epoch
has run past ``comm.stall_warn_s`` (and past ten times the longest epoch so far, so
that long epochs of a large graph do not warn), and again each time that wait doubles.
The ranks that warn are the waiting ones; the one that does not is the one to look at.
"""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger(__name__)

SLOWEST_FACTOR = 10.0
"""An epoch warns once it has run this many times the longest epoch so far."""


class StallWatch:
    """Times each epoch from :meth:`at` to the next; warns while one runs too long.

    Args:
        rank: named in the warning.
        warn_after_s: the least time an epoch runs before it warns (0: never warns).
        timeout_s: ``comm.timeout_s``, quoted in the warning.
        poll_s: how often the watch looks (default: a tenth of ``warn_after_s``, 1-10 s).
    """

    def __init__(
        self, rank: int, warn_after_s: float, timeout_s: float, poll_s: float | None = None
    ):
        self.rank, self.warn_after_s, self.timeout_s = rank, warn_after_s, timeout_s
        self.poll_s = poll_s if poll_s is not None else min(max(warn_after_s / 10, 1.0), 10.0)
        self.longest_s = 0.0
        self._lock = threading.Lock()
        self._step: str | None = None
        self._since = 0.0
        self._warned = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if warn_after_s > 0:
            self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
            self._thread.start()

    def at(self, step: str) -> None:
        """``step`` starts now (the previous one, if any, has ended)."""
        now = time.monotonic()
        with self._lock:
            if self._step is not None:
                self.longest_s = max(self.longest_s, now - self._since)
            self._step, self._since, self._warned = step, now, 0

    def close(self) -> None:
        """Stops watching (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def threshold_s(self) -> float:
        return max(self.warn_after_s, SLOWEST_FACTOR * self.longest_s)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                if self._step is None:
                    continue
                ran = time.monotonic() - self._since
                if ran < 2**self._warned * self.threshold_s():
                    continue
                self._warned += 1
                step, longest = self._step, self.longest_s
            logger.warning(
                "rank %d: %s has run %.0f s (the longest epoch so far: %.1f s); a peer may "
                "have stopped, hung or slowed down: the run fails after comm.timeout_s = %g s "
                "if it does not answer",
                self.rank,
                step,
                ran,
                longest,
                self.timeout_s,
            )
