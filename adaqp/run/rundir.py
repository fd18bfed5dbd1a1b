"""The claim on a run's output directory: its lock, ``status.json``, and starting fresh.

Rank 0 claims the directory its :class:`~adaqp.run.placement.Placement` picks before any
other work, and holds it until its process ends; which directory that is, and whether the
run may take it, the placement decides (``candidates``, ``verdict``), asked here again
under the lock. What a directory holds is drawn in ``adaqp.run.runfiles``.

A claim is two steps, ``reserve`` (the lock and that verdict, nothing changed) and
``start`` (old files removed where the run starts fresh, "running", the job's identity
recorded), so that the checks between them leave a refused run's directory as it was.
Starting fresh removes only ``PROJECT_FILES`` and the run's own checkpoints; a running run
is never joined. A failed or interrupted run says so in ``status.json`` and has no
``summary.json``. A run whose rank 0 was killed (by the kernel's out-of-memory killer,
say) cannot say so: the launcher records it once the workers have ended
(``record_lost_end``).

Nothing here is collective: ``adaqp.run.job`` combines every rank's verdict in one
all-reduce, which is why a problem has a number (``Problem``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaqp.cli.handoff import STATUS_DIR_ENV
from adaqp.process.atomic import write_json
from adaqp.process.stop import stop_requested
from adaqp.run.ckptdir import claim_checkpoints
from adaqp.run.runfiles import (
    JOB_KEY,
    LOCK_FILE,
    PROJECT_FILES,
    STATUS_FILE,
    SUMMARY_FILE,
    Problem,
    RunDirError,
    lock_held,
    read_status,
    unwritable,
)

if TYPE_CHECKING:
    from adaqp.run.placement import Placement

logger = logging.getLogger(__name__)

STATUSES = ("running", "complete", "failed", "interrupted")
RUN_DIR_FILE = "run-dir"
"""In the launcher's folder (``ADAQP_STATUS_DIR``): the directory rank 0 started its run in,
for the launcher to record the end of a run whose rank 0 could not (``record_lost_end``)."""


class RunDir:
    """A claimed output directory: holds its lock and writes ``status.json``.

    Make one with ``RunDir.claim`` (or ``reserve``, then ``start``); the lock lasts until
    ``close`` or the process ends.
    """

    def __init__(self, path: Path, lock_fd: int, checkpoints: Path, shared: bool = False):
        self.path = path
        self.resume_from: Path | None = None
        """The checkpoint this run continues from (``resume``); None when starting fresh."""
        self.job: str | None = None
        """The job that claims the directory, recorded in ``status.json`` by ``start``."""
        self.own = False
        """A restarted worker group's claim of its own job's run (``reserve``)."""
        self.finished = False
        """The job's own run here had finished before this restart: ``start`` changes
        nothing, and the job has nothing left to do."""
        self._lock_fd: int | None = lock_fd
        self._started_at = _now()
        self._started = False
        self._created = False  # this claim made the directory (removed if never started)
        self._replaces_finished = False  # a finished run is here (``start`` removes it)
        self._checkpoints = checkpoints  # where the run's placement keeps them
        self._shared_checkpoints = shared  # under checkpoint.dir: marked with their owner

    @classmethod
    def claim(cls, placement: Placement, job: str | None = None) -> RunDir:
        """``reserve``, then ``start``: ready to write."""
        run = cls.reserve(placement, job)
        try:
            run.start()
        except BaseException:
            run.close()
            raise
        return run

    @classmethod
    def reserve(cls, placement: Placement, job: str | None = None) -> RunDir:
        """Locks the directory ``placement`` picks for this process, changing none of its
        files (``start`` does).

        The first of ``placement.candidates`` whose ``verdict``, asked again under the
        lock, lets the run in; a version another run took between the look and the lock
        is passed over (``placement.passes_over``). ``job``: the job's identity, which
        ``start`` records and by which a restarted group finds its own run.

        Raises:
            RunDirError: the verdict's refusal (``Placement.verdict``), or RUNNING where
                another process holds the lock, whatever the flags. Nothing is changed.
        """
        for path, own in placement.candidates(job):
            try:
                run = cls._reserve(placement, path, own)
            except RunDirError as exc:
                if not placement.passes_over(exc, own):
                    raise
                continue
            run.job, run.own = job, own
            if run.finished:
                logger.info(
                    "restarted: this job's run in %s had already finished (%s); it is kept "
                    "as it is and nothing is trained",
                    path,
                    SUMMARY_FILE,
                )
            elif own:
                logger.info("restarted: continuing this job's run in %s", path)
            return run
        raise AssertionError("unreachable")

    @classmethod
    def _reserve(cls, placement: Placement, path: Path, own: bool) -> RunDir:
        if not path.exists():  # a refusal must not leave a directory behind
            placement.verdict(path, own=own)
        created = not path.exists()
        _make_dir(path)
        try:
            fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise unwritable(path, f"cannot create files in {path}", exc) from exc
        shared = placement.checkpoint_dir is not None
        run = cls(path, fd, placement.checkpoints(path), shared)
        run._created = created
        try:
            _lock(fd, path)
            decided = placement.verdict(path, own=own, locked=True)
            run.resume_from, run.finished = decided.resume_from, decided.finished
            run._replaces_finished = (path / SUMMARY_FILE).exists()
        except BaseException:
            run.close()
            raise
        return run

    def start(self) -> None:
        """Starts the run in the reserved directory: unless resuming, removes the files of
        the run that was there (its own checkpoints included), then marks it "running",
        naming the job (a restart of it finds its directory by that), and tells the
        launcher where it is. A restart whose own run had finished changes nothing."""
        if self.finished:
            return
        if self.resume_from is None:
            from adaqp.run.checkpoint import remove_all as remove_checkpoints  # loads torch

            try:
                self._clear(self._replaces_finished)
                remove_checkpoints(self._checkpoints)
            except OSError as exc:
                raise unwritable(self.path, "cannot remove the old run's files", exc) from exc
        if self._shared_checkpoints:
            try:
                claim_checkpoints(self._checkpoints, self.path)
            except OSError as exc:
                raise unwritable(self._checkpoints, "cannot mark the checkpoints", exc) from exc
        assert self._lock_fd is not None
        _record_holder(self._lock_fd)
        self._started = True
        self.set_status("running")
        _tell_launcher(self.path)

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
        if self.job is not None:
            payload[JOB_KEY] = self.job
        if error is not None:
            payload["error"] = error
        try:
            write_json(self.path / STATUS_FILE, payload)
        except OSError as exc:
            raise unwritable(self.path, f"cannot write {STATUS_FILE}", exc) from exc

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


def record_lost_end(
    status_dir: Path, status: str, reason: str, replaces: tuple[str, ...] = ("running",)
) -> Path | None:
    """For the launcher, once every worker has ended: records how the run ended whose rank
    0 could not say so itself (killed, say by the out-of-memory killer).

    The run is the one named in ``status_dir``'s ``RUN_DIR_FILE``. Its ``status.json`` is
    changed only where it still says one of ``replaces`` and no process holds the run's
    lock: it then says ``status`` with ``reason`` as its ``error``, keeps every other
    field (rank 0's pid and host among them) and adds ``"recorded_by": "launcher"``.
    Returns the run's directory where it changed it, else None; a file it cannot read
    or write is no error.
    """
    try:
        path = Path((status_dir / RUN_DIR_FILE).read_text().strip())
    except OSError:
        return None  # no run started (or rank 0 is on another host)
    previous = read_status(path)
    if previous is None or previous.get("status") not in replaces or lock_held(path):
        return None
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    payload = {**previous, "status": status, "error": reason, "updated_at": _now()}
    payload["recorded_by"] = "launcher"
    try:
        write_json(path / STATUS_FILE, payload)
    except OSError as exc:
        logger.warning("could not record the run's end in %s: %s", path / STATUS_FILE, exc)
        return None
    return path


def _tell_launcher(path: Path) -> None:
    """Names the run's directory to the launcher, where one started this worker."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir:
        with contextlib.suppress(OSError):
            (Path(status_dir) / RUN_DIR_FILE).write_text(f"{path.resolve()}\n")


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
        raise unwritable(path, f"{blocker} exists and is not a directory") from exc
    except OSError as exc:
        raise unwritable(path, "cannot create the directory", exc) from exc


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
