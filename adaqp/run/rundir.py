"""The run's output directory: who may write it, and whether what it holds is complete.

Rank 0 claims ``--out`` before any other work and holds it until its process ends::

    out/
      run.lock        flock held by the run writing here (pid, host); the kernel
                      releases it when that process ends, however it ends
      status.json     {"status": "running" | "complete" | "failed" | "interrupted",
                       "error": ..., "pid": ..., "host": ..., "started_at": ...}
      config.json     -+
      metrics.jsonl    +- adaqp.run.metrics.RunWriter's files; summary.json is written
      summary.json    -+  only once the run is complete
      checkpoints/    adaqp.run.checkpoint's files (unless checkpoint.dir puts them elsewhere)

A directory with a ``summary.json`` holds a finished run, one whose lock is held a running
run. No run is removed unless ``overwrite`` says so (it removes only ``PROJECT_FILES`` and
the checkpoints); ``resume`` continues from the newest complete checkpoint; a running run
is never joined. A run given no output directory never meets a refusal: where its default
directory holds a run, it takes the next free ``<dir>-v2``, ``<dir>-v3``, ...
(``new_version``). A failed or interrupted run says so in ``status.json`` and has no
``summary.json``; a new run may start over one that trained nothing. A claim is two steps,
``reserve`` (the lock and every refusal, nothing changed) and ``start`` (old files removed,
"running"), so that the checks between them leave a refused run's directory as it was.

Nothing here is collective: ``adaqp.train`` combines every rank's verdict in one
all-reduce, which is why a problem has a number (``Problem``).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import glob
import itertools
import json
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from adaqp.atomic import write_json
from adaqp.run.ckptdir import DEFAULT_DIR, complete_epochs
from adaqp.stop import stop_requested

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
STATUS_FILE = "status.json"
SUMMARY_FILE = "summary.json"
PROJECT_FILES: tuple[str, ...] = ("config.json", "metrics.jsonl", SUMMARY_FILE, STATUS_FILE)
"""Every file a run writes (besides the lock), and all that starting fresh removes."""
STATUSES = ("running", "complete", "failed", "interrupted")


class Problem(enum.IntEnum):
    """Why a directory cannot take a run; the value travels in the ranks' all-reduce."""

    UNWRITABLE = 1
    FINISHED = 2
    RUNNING = 3
    NO_CHECKPOINT = 4
    UNFINISHED = 5

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
        }[self]


class RunDirError(Exception):
    """The output directory cannot take this run; the message says why and what to do."""

    def __init__(self, problem: Problem, message: str):
        super().__init__(message)
        self.problem = problem


def find_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``checkpoint_dir`` (``adaqp.run.checkpoint``), or
    None. Complete means it has a manifest; its shards are verified when loaded."""
    epochs = complete_epochs(checkpoint_dir)
    return checkpoint_dir / f"epoch-{epochs[-1]:06d}" if epochs else None


def require_checkpoint(out_dir: Path, checkpoint_dir: Path) -> Path:
    """``find_checkpoint``, or RunDirError(NO_CHECKPOINT) when there is none."""
    checkpoint = find_checkpoint(checkpoint_dir)
    if checkpoint is None:
        raise RunDirError(Problem.NO_CHECKPOINT, Problem.NO_CHECKPOINT.describe(out_dir))
    return checkpoint


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
        raise _unwritable(path, f"{existing} exists and is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise _unwritable(path, f"cannot create files in {existing}", exc) from exc


class RunDir:
    """A claimed output directory: holds its lock and writes ``status.json``.

    Make one with ``RunDir.claim``; the lock lasts until ``close`` or the process ends.
    """

    def __init__(self, path: Path, lock_fd: int, resume_from: Path | None = None):
        self.path = path
        self.resume_from = resume_from
        """The checkpoint this run continues from (``resume``); None when starting fresh."""
        self._lock_fd: int | None = lock_fd
        self._started_at = _now()
        self._started = False
        self._created = False  # this claim made the directory (removed if never started)
        self._finished = False
        self._checkpoints = path / DEFAULT_DIR

    @classmethod
    def claim(cls, out_dir: str | Path, **flags) -> RunDir:
        """``reserve`` (with its keyword flags), then ``start``: ready to write."""
        run = cls.reserve(out_dir, **flags)
        try:
            run.start()
        except BaseException:
            run.close()
            raise
        return run

    @classmethod
    def reserve(
        cls,
        out_dir: str | Path,
        *,
        overwrite: bool = False,
        resume: bool | str = False,
        checkpoint_dir: str | Path | None = None,
        new_version: bool = False,
    ) -> RunDir:
        """Locks ``out_dir`` for this process, changing none of its files (``start`` does).

        ``resume`` keeps the run there and continues it; ``overwrite`` lets ``start``
        remove it (its files and checkpoints); ``resume = "auto"`` (a worker restarted by
        torchrun) resumes if there is a checkpoint and starts fresh otherwise.
        ``new_version`` (a run given no output directory): where ``out_dir`` holds a run,
        the first of ``out_dir-v2``, ``out_dir-v3``, ... that holds none is taken instead,
        so that no run is ever replaced unasked. ``checkpoint_dir`` defaults to
        ``<directory>/checkpoints``.

        Raises:
            RunDirError: UNWRITABLE, RUNNING (another process holds the lock, whatever
                the flags), FINISHED (a summary is there and neither ``overwrite`` nor
                ``resume``), UNFINISHED (an interrupted or failed run that trained some
                epochs or left a checkpoint, without ``resume`` or ``overwrite``) or
                NO_CHECKPOINT (``resume`` without a checkpoint). Nothing is changed.
        """
        if overwrite and resume:
            raise ValueError("overwrite and resume exclude each other")
        base = Path(out_dir)
        explicit = Path(checkpoint_dir) if checkpoint_dir else None
        for path in free_versions(base) if new_version else [base]:
            checkpoints = explicit or path / DEFAULT_DIR
            try:
                return cls._reserve(path, checkpoints, overwrite, resume)
            except RunDirError as exc:
                # Taken between the look and the lock (another run starting): next one.
                if not (new_version and exc.problem == Problem.RUNNING):
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _reserve(cls, path: Path, checkpoints: Path, overwrite: bool, resume: bool | str) -> RunDir:
        restarted = resume == "auto"
        if restarted:
            resume = find_checkpoint(checkpoints) is not None
        if resume and not path.is_dir():
            require_checkpoint(path, checkpoints)  # nothing to resume; leave no dir behind
        created = not path.exists()
        _make_dir(path)
        try:
            fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _unwritable(path, f"cannot create files in {path}", exc) from exc
        run = cls(path, fd)
        run._created = created
        try:
            _lock(fd, path)
            finished = (path / SUMMARY_FILE).exists()
            run.resume_from = require_checkpoint(path, checkpoints) if resume else None
            if finished and not (overwrite or resume):
                raise RunDirError(Problem.FINISHED, Problem.FINISHED.describe(path))
            if not (finished or overwrite or resume or restarted):
                refuse_unfinished(path, checkpoints)
            run._checkpoints = checkpoints
            run._finished = finished
        except BaseException:
            run.close()
            raise
        return run

    def start(self) -> None:
        """Starts the run in the reserved directory: unless resuming, removes the files of
        the run that was there (its checkpoints included), then marks it "running"."""
        if self.resume_from is None:
            from adaqp.run.checkpoint import remove_all as remove_checkpoints  # loads torch

            try:
                self._clear(self._finished)
                remove_checkpoints(self._checkpoints)
            except OSError as exc:
                raise _unwritable(self.path, "cannot remove the old run's files", exc) from exc
        assert self._lock_fd is not None
        _record_holder(self._lock_fd)
        self._started = True
        self.set_status("running")

    def set_status(self, status: str, error: str | None = None) -> None:
        """Replaces ``status.json`` atomically (never half-written)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        payload: dict[str, Any] = {
            "status": status,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": self._started_at,
            "updated_at": _now(),
        }
        if error is not None:
            payload["error"] = error
        try:
            write_json(self.path / STATUS_FILE, payload)
        except OSError as exc:
            raise _unwritable(self.path, f"cannot write {STATUS_FILE}", exc) from exc

    def end(self, exc: BaseException | None = None) -> None:
        """Marks the run "complete" (no ``exc``), "interrupted" (Ctrl-C, or any error once a
        stop signal has arrived: see ``stop_requested``) or "failed".

        Called on the way out of a failure, so it never raises over ``exc``. A run that
        never started (refused, or failed before ``start``) leaves the directory as it was.
        """
        if not self._started:
            return
        if exc is None:
            self.set_status("complete")
            return
        interrupted = isinstance(exc, KeyboardInterrupt)
        if interrupted or stop_requested():
            name = (str(exc) if interrupted else "") or stop_requested() or "SIGINT"
            status, message = "interrupted", f"interrupted ({name})"
        else:
            status, message = "failed", str(exc) or type(exc).__name__
        try:
            self.set_status(status, error=message)
        except RunDirError as write_error:
            logger.warning("could not record the run's end: %s", write_error)

    def close(self) -> None:
        """Releases the lock (it is also released when the process ends). A directory this
        claim made and never started is removed again, if nothing else was put there."""
        if self._lock_fd is None:
            return
        if self._created and not self._started:
            with contextlib.suppress(OSError):
                (self.path / LOCK_FILE).unlink()
                self.path.rmdir()
        os.close(self._lock_fd)
        self._lock_fd = None

    def _clear(self, finished: bool) -> None:
        previous = read_status(self.path)
        if finished:
            logger.info("starting fresh: removing the finished run's files in %s", self.path)
        elif previous is not None and previous.get("status") == "running":
            logger.warning(
                "the run that last wrote %s (pid %s) ended without recording it; starting fresh",
                self.path,
                previous.get("pid", "?"),
            )
        for name in PROJECT_FILES:
            for stale in (self.path / name, self.path / f"{name}.tmp"):
                stale.unlink(missing_ok=True)


def versioned(base: Path, version: int) -> Path:
    """``base`` for version 1, else ``base-v<version>``: where a command's later runs go
    when its default output directory is taken."""
    return base if version == 1 else base.with_name(f"{base.name}-v{version}")


def free_versions(base: Path) -> Iterator[Path]:
    """``base``, ``base-v2``, ... in order, less those that hold a run (``holds_run``)."""
    return (path for v in itertools.count(1) if not holds_run(path := versioned(base, v)))


def newest_version(base: Path) -> Path:
    """The highest-numbered of ``base``, ``base-v2``, ... that exists (``base`` if none):
    the run that ``--resume`` or ``--overwrite`` without ``--out`` acts on."""
    pattern = f"{glob.escape(base.name)}-v*"
    versions = [v for p in base.parent.glob(pattern) if (v := _version(base, p)) is not None]
    return versioned(base, max(versions)) if versions else base


def version_of(base: Path, path: Path) -> int:
    """Which version of ``base`` ``path`` is (``versioned``'s inverse)."""
    return 1 if path == base else _version(base, path) or 1


def _version(base: Path, path: Path) -> int | None:
    suffix = path.name[len(base.name) + 2 :]
    return int(suffix) if suffix.isdigit() and int(suffix) >= 2 else None


def holds_run(path: Path, checkpoints: Path | None = None) -> bool:
    """Whether ``path`` holds a run that starting fresh would lose, or a running one:
    a summary, trained epochs or a checkpoint, or a held lock. Changes nothing."""
    checkpoints = checkpoints or path / DEFAULT_DIR
    if not path.is_dir():
        return False
    if (path / SUMMARY_FILE).exists() or find_checkpoint(checkpoints) is not None:
        return True
    metrics = path / "metrics.jsonl"
    return (metrics.exists() and metrics.stat().st_size > 0) or lock_held(path)


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


def refuse_unfinished(path: Path, checkpoints: Path) -> None:
    """Raises UNFINISHED if ``path`` holds a run that stopped after training something
    (epochs in ``metrics.jsonl`` or a checkpoint): starting fresh would lose it."""
    checkpoint = find_checkpoint(checkpoints)
    metrics = path / "metrics.jsonl"
    trained = metrics.exists() and metrics.stat().st_size > 0
    if checkpoint is None and not trained:
        return  # nothing that took time to make: the run can start again
    status = (read_status(path) or {}).get("status", "unknown")
    kept = (
        f"its newest checkpoint is {checkpoint}: pass --resume to continue from it, "
        if checkpoint is not None
        else "it has no checkpoint: "
    )
    raise RunDirError(
        Problem.UNFINISHED,
        f"{path} holds an unfinished run (status: {status}); {kept}--overwrite to start "
        "fresh there (deleting it), or choose another --out",
    )


def read_status(out_dir: str | Path) -> dict[str, Any] | None:
    """The contents of ``status.json``; None if it is missing or unreadable."""
    try:
        return json.loads((Path(out_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None


def _lock(fd: int, path: Path) -> None:
    """Takes the exclusive lock without waiting (``_record_holder`` then says who)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        raise RunDirError(
            Problem.RUNNING,
            f"{path} is in use by another run ({holder or 'holder unknown'}); two runs "
            "cannot share an output directory, even with --overwrite: wait for it to end "
            "or choose another --out",
        ) from None


def _record_holder(fd: int) -> None:
    """Writes who holds the lock into the lock file, for a run that finds it taken."""
    holder = f"pid {os.getpid()} on {socket.gethostname()}, since {_now()}"
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode() + b"\n", 0)


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        in_the_way = (p for p in (*reversed(path.parents), path) if not p.is_dir())
        blocker = next((p for p in in_the_way if p.exists() or p.is_symlink()), path)
        raise _unwritable(path, f"{blocker} exists and is not a directory") from exc
    except OSError as exc:
        raise _unwritable(path, "cannot create the directory", exc) from exc


def _unwritable(path: Path, what: str, exc: OSError | None = None) -> RunDirError:
    reason = f" ({exc.strerror or exc})" if exc is not None else ""
    return RunDirError(
        Problem.UNWRITABLE,
        f"cannot write the run's output to {path}: {what}{reason}; choose another --out",
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
