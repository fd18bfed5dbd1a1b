"""Wall time and peak resident memory of a process, stage by stage.

Memory is what users of a full-graph system hit first, so a long step (partitioning a
graph, say) reports both figures per stage, as it reports time. The peak of one stage is
the resident set's high-water mark (``VmHWM``) since the stage began: Linux resets the
mark when ``5`` is written to ``/proc/self/clear_refs``. Where that is not wanted (see
``StageLog.reset_peaks``) or not possible (no procfs, or another system) the mark is the
process's peak so far, which a later stage can only repeat, and each stage says so
(``peak_since_start``).
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

_PROC = Path("/proc/self")


def status_bytes(key: str) -> int | None:
    """A ``/proc/self/status`` figure (``VmRSS``, ``VmHWM``, ``RssAnon``, ...) in bytes; None
    without procfs or where the kernel does not report it."""
    try:
        text = (_PROC / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024  # kB
    return None


def resident_bytes() -> int | None:
    """This process's resident set now, in bytes; None where procfs is absent."""
    return status_bytes("VmRSS")


def peak_resident_bytes() -> int:
    """The resident set's high-water mark (since the last reset, see the module docstring)."""
    peak = status_bytes("VmHWM")
    if peak is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return peak


def reset_peak() -> bool:
    """Starts a new high-water mark at the current resident set; False where the system
    does not allow it (the mark then stays the process's lifetime peak)."""
    try:
        (_PROC / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass
class Stage:
    """One stage's figures (as recorded in a partition's metadata, ``stages``)."""

    name: str
    seconds: float
    peak_memory_bytes: int
    """Peak resident set during the stage."""
    peak_since_start: bool = False
    """The peak could not be reset: it is the process's peak up to the stage's end."""


@dataclass
class StageLog:
    """Times stages and records their peak resident memory; logs one line per stage.

    ``reset_peaks``: start each stage's high-water mark afresh. That also resets what
    ``ru_maxrss`` reports for the process, so only a process whose own peak nobody else
    reads (``python -m partition``) should; otherwise each stage records the process's
    peak so far.
    """

    reset_peaks: bool = False
    stages: list[Stage] = field(default_factory=list)

    _open: tuple[str, float, bool] | None = field(default=None, repr=False)

    def begin(self, name: str) -> None:
        """Starts the stage ``name`` (ending the open one, if any)."""
        self.end()
        fresh = self.reset_peaks and reset_peak()
        self._open = (name, time.perf_counter(), fresh)

    def end(self) -> None:
        """Ends the open stage, if any, and records it."""
        if self._open is None:
            return
        (name, start, fresh), self._open = self._open, None
        seconds = time.perf_counter() - start
        record = Stage(name, seconds, peak_resident_bytes(), not fresh)
        self.stages.append(record)
        logger.info(
            "stage %s: %.1f s, peak resident %.2f GB%s",
            name,
            seconds,
            record.peak_memory_bytes / 1e9,
            " (process peak so far)" if record.peak_since_start else "",
        )

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Measures the ``with`` block as the stage ``name`` (unless ended inside it)."""
        self.begin(name)
        try:
            yield
        finally:
            if self._open is not None and self._open[0] == name:
                self.end()

    @property
    def peak_memory_bytes(self) -> int:
        """The largest stage peak (0 before any stage)."""
        return max((s.peak_memory_bytes for s in self.stages), default=0)

    def as_json(self) -> list[dict]:
        return [asdict(s) for s in self.stages]
