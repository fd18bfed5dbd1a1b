"""torchrun's stderr, filtered: its own failure report left out, workers' output kept.

Also the exit code of the whole job, from the codes the ranks wrote and torchrun's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import sys
import threading
from pathlib import Path

# torchrun's own lines: its log records (glog style or logging's default format).
_TORCHRUN_LOG = re.compile(
    r"^(?:[IWEFD]\d{4} [\d:.]+\s+\d+ \S*torch/distributed/(?:elastic/|launcher/|run\.py)"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):torch\.distributed\.(?:elastic|launcher|run)\b)"
)
_REPORT_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)")
# A rank's error that only reports another rank's ("... a peer failed; see its log)").
_CONSEQUENCE = re.compile(r"see its log\)?\s*$")


class OutputFilter:
    """Takes torchrun's stderr line by line; returns the lines to show.

    A traceback is held until its last line, the exception, says whose it is: torchrun's
    ``ChildFailedError`` (then the report table after it), ``SignalException`` and a bare
    ``KeyboardInterrupt`` are dropped, anything else (a worker's) is shown whole.
    ``failures`` holds the report's (rank, exit code) pairs, the root cause first. An
    ``error:`` line is shown once; one that only points at another rank's ("... see its
    log") is held, and ``leftovers`` gives it back at the end where no other rank said
    more. A repeated error's indented lines (the keys of a checkpoint that does not fit,
    say) go with it.
    """

    def __init__(self) -> None:
        self.held: list[str] | None = None
        self.report: int | None = None  # ==== lines seen inside a ChildFailedError report
        self.errors: set[str] = set()
        # Errors that point at another rank's: shown only where no other error was.
        self.consequences: list[str] = []
        self.tracebacks = 0  # workers' tracebacks shown
        self.failures: list[tuple[int, int]] = []
        self._found: dict[str, list[tuple[int, int]]] = {"root": [], "other": []}
        self._section, self._rank = "other", -1
        self._repeat = False  # inside a repeated error's indented lines

    @property
    def idle(self) -> bool:
        return self.held is None and self.report is None

    def feed(self, line: str) -> list[str]:
        text = line.rstrip("\r\n")
        if self._repeat:
            if text.startswith("  "):
                return []
            self._repeat = False
        if self.report is not None:
            return self._in_report(line, text)
        if self.held is not None:
            self.held.append(line)
            if text[:1] in (" ", "\t"):
                return [] if len(self.held) < 1000 else self.flush()
            if text.startswith("torch.distributed.elastic.") and "ChildFailedError" in text:
                self.held, self.report = None, 0
                return []
            if text == "KeyboardInterrupt" or (
                text.startswith("torch.distributed.elastic.") and "SignalException" in text
            ):  # torchrun stopped by the launcher's signal (in a rendezvous, say)
                self.held = None
                return []
            self.tracebacks += 1
            return self.flush()
        if text.startswith("Traceback (most recent call last):"):
            self.held = [line]
            return []
        if _TORCHRUN_LOG.match(text):
            return []
        if text.startswith("error: "):
            if _CONSEQUENCE.search(text):
                if line not in self.consequences:
                    self.consequences.append(line)
                return []
            if text in self.errors:
                self._repeat = True
                return []
            self.errors.add(text)
        return [line]

    def leftovers(self) -> list[str]:
        """At the end: the errors that point at another rank's, if no rank said more."""
        return [] if self.errors else self.consequences

    def _in_report(self, line: str, text: str) -> list[str]:
        if text.startswith("===="):
            self.report += 1
            if self.report == 2:  # the end of the table
                self.report = None
                root, other = self._found["root"], self._found["other"]
                self.failures = root + [pair for pair in other if pair not in root]
            return []
        if self.report == 0:  # not the table after all
            self.report = None
            return self.feed(line)
        if text.startswith(("Failures:", "Root Cause")):
            self._section = "root" if text.startswith("Root") else "other"
        elif found := _REPORT_FIELD.match(text):
            if found[1] == "rank":
                self._rank = int(found[2])
            else:
                self._found[self._section].append((self._rank, int(found[2])))
        return []

    def flush(self) -> list[str]:
        held, self.held = self.held or [], None
        return held


def exit_code(codes: dict[int, int], torchrun_code: int, interrupted: bool) -> int:
    """The launcher's exit code from the ranks' codes and torchrun's.

    A rank stopped by torchrun because another failed says 130 (interrupted); that is not
    the job's outcome unless no rank failed otherwise.
    """
    found = set(codes.values())
    if interrupted:
        return 130
    if 2 in found:
        return 2
    if found - {0, 130}:
        return 1
    if 130 in found:
        return 130
    return 1 if torchrun_code else 0


def read_codes(status_dir: Path) -> dict[int, int]:
    """The exit code each rank wrote to ``status_dir``."""
    codes = {}
    for path in status_dir.glob("rank-*.code"):
        try:
            codes[int(path.stem.partition("-")[2])] = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
    return codes


def describe(code: int) -> str:
    """``exit code 2``, ``signal SIGKILL`` (torchrun's negative codes)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Stream(threading.Thread):
    """Copies torchrun's stderr (a pipe, or a terminal of its own) through an OutputFilter."""

    def __init__(self, fd: int, filter_: OutputFilter):
        super().__init__(daemon=True)
        self.fd, self.filter = fd, filter_
        self.out = getattr(sys.stderr, "buffer", None)
        self.mid_line = False  # the last text shown did not end its line (a progress bar)

    def write(self, chunks: list[str]) -> None:
        try:
            for chunk in chunks:
                self.mid_line = not chunk.endswith("\n")
                if self.out is not None:
                    self.out.write(chunk.encode("utf-8", "surrogateescape"))
                else:
                    sys.stderr.write(chunk)
            (self.out or sys.stderr).flush()
        except (OSError, ValueError):
            pass  # our own stderr went away; keep draining the child's

    def run(self) -> None:
        pending = ""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # a terminal's end once every writer has closed it
                data = b""
            if not data:
                break
            pending += data.decode("utf-8", "surrogateescape")
            while "\n" in pending:
                line, _, pending = pending.partition("\n")
                self.write(self.filter.feed(line + "\n"))
            # A progress bar redraws its line with \r and ends it only when it closes: shown
            # at once; what follows on that line is judged as a line of its own.
            if "\r" in pending and self.filter.idle:
                self.write([pending])
                pending = ""
        self.write(self.filter.feed(pending) if pending else [])
        self.write(self.filter.flush())


def stderr_pipe() -> tuple[int, int]:
    """(read end, write end) for torchrun's stderr: a terminal of its own where ours is one
    (the workers keep their progress bar), else a pipe."""
    try:
        if not sys.stderr.isatty():
            raise OSError
        import pty
        import termios

        master, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST  # no \n -> \r\n
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        copy_size(master)
        return master, slave
    except (OSError, ImportError, AttributeError, ValueError):
        return os.pipe()


DEFAULT_SIZE = (24, 80)
"""(rows, columns) given to the workers' terminal where ours reports none."""


def copy_size(fd: int) -> None:
    """Gives the terminal ``fd`` our stderr's size (again after a resize: the workers' bar
    follows it). Where ours reports zero rows or columns (a terminal whose size was never
    set, as ``script`` makes without a terminal of its own) it gets DEFAULT_SIZE's instead:
    the workers' bar, sized to their terminal, would not be drawn at all."""
    import fcntl
    import termios

    try:
        size = fcntl.ioctl(sys.stderr.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
        rows, columns = struct.unpack("HHHH", size)[:2]
    except (OSError, AttributeError, ValueError):
        rows = columns = 0
    rows, columns = rows or DEFAULT_SIZE[0], columns or DEFAULT_SIZE[1]
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
