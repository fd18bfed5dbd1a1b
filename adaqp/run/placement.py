"""Which output directory a run takes, and whether it may: the one verdict; no torch.

Two callers ask the same questions: the pre-flight check (``adaqp.run.preflight``), before
torch loads and without the lock, and ``RunDir.reserve`` (``adaqp.run.rundir``), under
the lock. ``candidates`` says which directories a run may take, ``verdict`` whether it may
take one of them and from which checkpoint it continues; neither changes anything.

What a directory holds::

    out/
      run.lock        flock held by the run writing here
      status.json     {"status": ..., "job": <the job's identity>, "pid": ..., ...}
      config.json, metrics.jsonl, summary.json (once complete)
      checkpoints/    the run's checkpoints (``checkpoint.dir`` puts them in
                      <checkpoint.dir>/<out's name>/ instead, with an owner.json)

A restarted worker group (torchrun ``--max-restarts``) continues the directory whose
``status.json`` names its own job, and nothing else: where its first attempt never
started a run, it is a new run like any other; where that run had already finished (a
worker failed on its way out), it is left as it is. The job's identity comes from the
rendezvous store, which outlives the worker groups (``adaqp.runtime.job_identity``).

Given no ``--out``, a run passes over a version whose folder was deleted while its
checkpoints under ``checkpoint.dir`` were not (``orphaned``): they are kept, and the
name is not reused until they are removed.
"""

from __future__ import annotations

import enum
import fcntl
import glob
import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaqp.run.ckptdir import checkpoint_owner, complete_epochs, run_checkpoints

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


@dataclass(frozen=True)
class Verdict:
    """What a run that may take a directory does there."""

    resume_from: Path | None = None
    """The checkpoint it continues from; None where it starts fresh (or has nothing to do)."""
    finished: bool = False
    """The job's own run there had finished before this restart: nothing is left to do,
    and nothing there may change."""


def candidates(
    base: Path,
    *,
    named: bool,
    checkpoint_dir: str | Path | None = None,
    overwrite: bool = False,
    resume: bool = False,
    job: str | None = None,
) -> Iterator[tuple[Path, bool]]:
    """The directories a run may take, in order of preference, each with whether it is the
    job's own (the run a restarted group's first attempt started there).

    ``base``: ``--out`` (``named``), or the default directory, whose versions ``-v2``,
    ``-v3``, ... a run given no ``--out`` takes (the first free one; ``resume`` and
    ``overwrite`` act on the newest). ``job``: a restarted group's identity, whose own
    directory comes first and alone; where there is none it is a new run like any other.
    """
    if job:
        own = own_directory(base, named, job)
        if own is not None:
            yield own, True
            return
    if named:
        yield base, False
    elif resume or overwrite:
        yield newest_version(base), False
    else:
        yield from ((path, False) for path in free_versions(base, checkpoint_dir))


def verdict(
    path: Path,
    checkpoints: Path,
    *,
    overwrite: bool = False,
    resume: bool = False,
    own: bool = False,
    locked: bool = False,
) -> Verdict:
    """Whether a run may take ``path``, and what it does there: continue from a checkpoint,
    start fresh (removing what is there, which ``overwrite`` alone allows for a run), or,
    for a restart whose own run there had finished, nothing. Changes nothing.

    ``own``: the directory holds this job's own run (a restart continues it, from its
    newest checkpoint if any, whatever the flags; a finished one is kept as it is: the
    restart followed a failure on the way out). ``locked``: the caller holds the lock,
    so only its own claim can hold it.

    Raises:
        RunDirError: UNWRITABLE, RUNNING, CHECKPOINTS_TAKEN (``checkpoints`` belong to a
            run in another directory), NO_CHECKPOINT (``resume`` without one), FINISHED or
            UNFINISHED (a run there that neither ``resume`` nor ``overwrite`` allows
            replacing).
    """
    if not locked:
        check_writable(path)
        if lock_held(path):
            raise RunDirError(Problem.RUNNING, Problem.RUNNING.describe(path))
    if own and (path / SUMMARY_FILE).exists():
        return Verdict(finished=True)
    refuse_foreign_checkpoints(path, checkpoints)
    if own:
        return Verdict(resume_from=find_checkpoint(checkpoints))
    if resume:
        return Verdict(resume_from=require_checkpoint(path, checkpoints))
    if not overwrite:
        if (path / SUMMARY_FILE).exists():
            raise RunDirError(Problem.FINISHED, Problem.FINISHED.describe(path))
        refuse_unfinished(path, checkpoints)
    return Verdict()


def own_directory(base: Path, named: bool, job: str) -> Path | None:
    """The directory among ``base`` (and, unless ``named``, its versions) whose run was
    started by ``job``, or None."""
    for path in [base] if named else existing_versions(base):
        if (read_status(path) or {}).get(JOB_KEY) == job:
            return path
    return None


def versioned(base: Path, version: int) -> Path:
    """``base`` for version 1, else ``base-v<version>``: where a command's later runs go
    when its default output directory is taken."""
    return base if version == 1 else base.with_name(f"{base.name}-v{version}")


def free_versions(base: Path, checkpoint_dir: str | Path | None = None) -> Iterator[Path]:
    """``base``, ``base-v2``, ... in order, less those that hold a run (``holds_run``) and
    those whose checkpoints under ``checkpoint_dir`` (the config's ``checkpoint.dir``)
    would refuse a new run there: left by a deleted run (``orphaned``) or another
    directory's (``refuse_foreign_checkpoints``)."""
    for path in (versioned(base, v) for v in itertools.count(1)):
        checkpoints = run_checkpoints(path, checkpoint_dir)
        taken = holds_run(path, checkpoints) or orphaned(path, checkpoints)
        if not (taken or _owned_elsewhere(path, checkpoints)):
            yield path


def orphaned(path: Path, checkpoints: Path) -> bool:
    """Whether ``checkpoints`` hold a complete checkpoint while ``path``, the folder of
    their run, is gone (deleted with its checkpoints kept under ``checkpoint.dir``). A
    run given no ``--out`` passes over such a version: nothing removes them unasked."""
    return not path.exists() and find_checkpoint(checkpoints) is not None


def orphans(base: Path, taken: Path, checkpoint_dir: str | Path | None) -> list[Path]:
    """The checkpoint folders of the versions of ``base`` before ``taken`` that are
    ``orphaned``: what a run given no ``--out`` passed over besides runs."""
    if not checkpoint_dir:
        return []
    before = (versioned(base, v) for v in range(1, version_of(base, taken)))
    folders = ((path, run_checkpoints(path, checkpoint_dir)) for path in before)
    return [checkpoints for path, checkpoints in folders if orphaned(path, checkpoints)]


def _owned_elsewhere(path: Path, checkpoints: Path) -> bool:
    owner = checkpoint_owner(checkpoints)
    return owner is not None and Path(owner) != path.resolve()


def existing_versions(base: Path) -> list[Path]:
    """``base`` and its versions that exist, in version order."""
    pattern = f"{glob.escape(base.name)}-v*"
    numbers = sorted(v for p in base.parent.glob(pattern) if (v := _version(base, p)) is not None)
    return [p for p in [base, *(versioned(base, v) for v in numbers)] if p.exists()]


def newest_version(base: Path) -> Path:
    """The highest-numbered of ``base``, ``base-v2``, ... that exists (``base`` if none):
    the run that ``--resume`` or ``--overwrite`` without ``--out`` acts on."""
    return (existing_versions(base) or [base])[-1]


def version_of(base: Path, path: Path) -> int:
    """Which version of ``base`` ``path`` is (``versioned``'s inverse)."""
    return 1 if path == base else _version(base, path) or 1


def _version(base: Path, path: Path) -> int | None:
    suffix = path.name[len(base.name) + 2 :]
    return int(suffix) if suffix.isdigit() and int(suffix) >= 2 else None


def holds_run(path: Path, checkpoints: Path | None = None) -> bool:
    """Whether ``path`` holds a run that starting fresh would lose, or a running one:
    a summary, trained epochs or a checkpoint (in ``checkpoints``, by default
    ``<path>/checkpoints``), or a held lock. Changes nothing."""
    checkpoints = checkpoints or run_checkpoints(path, None)
    if not path.is_dir():
        return False
    if (path / SUMMARY_FILE).exists() or find_checkpoint(checkpoints) is not None:
        return True
    return _trained(path) or lock_held(path)


def _trained(path: Path) -> bool:
    """Whether the run in ``path`` recorded a trained epoch (``metrics.jsonl``)."""
    metrics = path / "metrics.jsonl"
    return metrics.exists() and metrics.stat().st_size > 0


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


def refuse_foreign_checkpoints(path: Path, checkpoints: Path) -> None:
    """Raises CHECKPOINTS_TAKEN where ``checkpoints`` (under ``checkpoint.dir``) belong to
    the run in another directory: they are never resumed, replaced or removed from here."""
    if not _owned_elsewhere(path, checkpoints):
        return
    owner = checkpoint_owner(checkpoints)
    raise RunDirError(
        Problem.CHECKPOINTS_TAKEN,
        f"{checkpoints} holds the checkpoints of the run in {owner}, not of {path}; choose "
        f"another checkpoint.dir or --out (or, if that run was moved to {path}, remove "
        f"{checkpoints / 'owner.json'})",
    )


def refuse_unfinished(path: Path, checkpoints: Path) -> None:
    """Raises UNFINISHED if ``path`` holds a run that stopped after training something
    (epochs in ``metrics.jsonl`` or a checkpoint): starting fresh would lose it."""
    checkpoint = find_checkpoint(checkpoints)
    if checkpoint is None and not _trained(path):
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
