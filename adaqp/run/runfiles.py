"""What a run's output directory holds, and the probes that read it without changing it.

The layout, drawn once::

    out/
      run.lock        flock held by the run writing here (pid, host); the kernel
                      releases it when that process ends, however it ends
      status.json     {"status": "running" | "complete" | "failed" | "interrupted",
                       "job": ..., "error": ..., "pid": ..., "host": ..., "started_at": ...}
      config.json     -+
      metrics.jsonl    +- adaqp.run.metrics.RunWriter's files; summary.json is written
      summary.json    -+  only once the run is complete
      checkpoints/    adaqp.run.checkpoint's files (``checkpoint.dir`` puts them in
                      <checkpoint.dir>/<out's name>/ instead, with an owner.json)

A directory with a ``summary.json`` holds a finished run, one whose lock is held a running
run. Which directory a run takes, and whether it may, is :mod:`adaqp.run.placement`'s
decision; :mod:`adaqp.run.rundir` holds the lock and writes ``status.json``. Both name
their refusals with a :class:`Problem`, a number that travels in the ranks' all-reduce.
No torch.
"""

from __future__ import annotations

import enum
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from adaqp.run.ckptdir import DEFAULT_DIR, find_checkpoint

LOCK_FILE = "run.lock"
STATUS_FILE = "status.json"
SUMMARY_FILE = "summary.json"
PROJECT_FILES: tuple[str, ...] = ("config.json", "metrics.jsonl", SUMMARY_FILE, STATUS_FILE)
"""Every file a run writes (besides the lock), and all that starting fresh removes."""
JOB_KEY = "job"
"""The field of ``status.json`` that names the job that started the run there."""


class Problem(enum.IntEnum):
    """Why a directory cannot take a run; the value travels in the ranks' all-reduce."""

    UNWRITABLE = 1
    FINISHED = 2
    RUNNING = 3
    NO_CHECKPOINT = 4
    UNFINISHED = 5
    CHECKPOINTS_TAKEN = 6

    def describe(self, out_dir: Path) -> str:
        """A one-line account for ranks that only learn the number."""
        return {
            Problem.UNWRITABLE: f"cannot write the run's output to {out_dir}",
            Problem.FINISHED: f"{out_dir} holds a finished run ({SUMMARY_FILE}); pass "
            "--overwrite to start fresh there, --resume to continue it, or choose another --out",
            Problem.RUNNING: f"{out_dir} is in use by another run",
            Problem.NO_CHECKPOINT: f"--resume: there is no checkpoint to resume from in {out_dir}",
            Problem.UNFINISHED: f"{out_dir} holds an unfinished run "
            "(pass --resume or --overwrite, or choose another --out)",
            Problem.CHECKPOINTS_TAKEN: f"the checkpoint folder of {out_dir} belongs to "
            "another run (choose another checkpoint.dir or --out)",
        }[self]


class RunDirError(Exception):
    """The output directory cannot take this run; the message says why and what to do."""

    def __init__(self, problem: Problem, message: str):
        super().__init__(message)
        self.problem = problem


def holds_run(path: Path, checkpoints: Path | None = None) -> bool:
    """Whether ``path`` holds a run that starting fresh would lose, or a running one:
    a summary, trained epochs or a checkpoint (in ``checkpoints``, by default
    ``<path>/checkpoints``), or a held lock. Changes nothing."""
    checkpoints = checkpoints or path / DEFAULT_DIR
    if not path.is_dir():
        return False
    if (path / SUMMARY_FILE).exists() or find_checkpoint(checkpoints) is not None:
        return True
    return trained(path) or lock_held(path)


def trained(path: Path) -> bool:
    """Whether the run in ``path`` recorded a trained epoch (``metrics.jsonl``)."""
    metrics = path / "metrics.jsonl"
    return metrics.exists() and metrics.stat().st_size > 0


def read_status(out_dir: str | Path) -> dict[str, Any] | None:
    """The contents of ``status.json``; None if it is missing or unreadable."""
    try:
        status = json.loads((Path(out_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def lock_held(path: Path) -> bool:
    """Whether a run holds ``path``'s lock now. A shared probe: two probes never see each
    other, only a run's exclusive lock."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases the probe's own lock
    return False


def check_writable(out_dir: str | Path) -> None:
    """Checks, changing nothing, that ``out_dir`` could be made (if missing) and written.

    Creates and removes a probe file in ``out_dir`` or, if it is missing, in its nearest
    existing parent: the ranks that only check must not leave directories behind.

    Raises:
        RunDirError(UNWRITABLE): with the reason (not a directory, permission, ...).
    """
    path = Path(out_dir)
    existing = next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())
    if not existing.is_dir():
        raise unwritable(path, f"{existing} exists and is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise unwritable(path, f"cannot create files in {existing}", exc) from exc


def unwritable(path: Path, what: str, exc: OSError | None = None) -> RunDirError:
    """RunDirError(UNWRITABLE) saying what could not be done in ``path``, and why."""
    reason = f" ({exc.strerror or exc})" if exc is not None else ""
    return RunDirError(
        Problem.UNWRITABLE,
        f"cannot write the run's output to {path}: {what}{reason}; choose another --out",
    )
