"""Where a run goes, and whether it may start or resume there: the one owner; no torch.

A :class:`Placement` is made once per run from its config and the command's flags
(``Placement.of``), and decides alone:

- the output directory: ``--out`` (``metrics.out``) as given, or the default
  (``output_dir``), whose versions ``-v2``, ``-v3``, ... a run given no ``--out`` takes:
  the first free one, or with ``--resume`` or ``--overwrite`` the newest (``candidates``);
- a restarted worker group's directory (torchrun ``--max-restarts``): the one whose
  ``status.json`` names its own job, and nothing else. Where its first attempt never
  started a run it is a new run like any other; where that run had already finished (a
  worker failed on its way out), it is left as it is. The job's identity comes from the
  rendezvous store, which outlives the worker groups (``adaqp.runtime.job_identity``);
- where the run's checkpoints live (``checkpoints``): ``<out>/checkpoints``, or with a
  ``checkpoint.dir`` a folder of their own under it;
- whether the run may take a directory, and from which checkpoint it continues
  (``verdict``): never where another run holds ``run.lock`` (``adaqp.run.rundir`` takes
  the lock, this says what a held one means), over a finished or unfinished run only with
  ``--overwrite`` or ``--resume``, from a checkpoint only where one is complete. A refusal
  is a ``RunDirError`` naming its ``Problem``.

Given no ``--out``, a run passes over a version whose folder was deleted while its
checkpoints under ``checkpoint.dir`` were not: they are kept, and the name is not reused
until they are removed.

The others ask and decide nothing: the pre-flight check (``adaqp.run.preflight``) asks
``plan`` before torch loads and without the lock; rank 0's claim (``RunDir.reserve`` in
``adaqp.run.rundir``) walks ``candidates`` and asks ``verdict`` again under the lock; the
job (``adaqp.run.job``) has the ranks agree on the version rank 0 took, says why the run
went there (``why_elsewhere``) and opens its checkpoints where ``checkpoints`` says. What a
directory holds, and the probes that read it, are ``adaqp.run.runfiles``'.
"""

from __future__ import annotations

import glob
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from adaqp.run.ckptdir import DEFAULT_DIR, checkpoint_owner, find_checkpoint
from adaqp.run.runfiles import (
    JOB_KEY,
    SUMMARY_FILE,
    Problem,
    RunDirError,
    check_writable,
    holds_run,
    lock_held,
    read_status,
    trained,
)

if TYPE_CHECKING:  # only the config's values are read: this module stays stdlib-only
    from adaqp.config import Config


def output_dir(config: Config, world_size: int, name: str | None = None) -> Path:
    """``metrics.out``, or ``results/runs/<name>-<mode>-p<P>``: ``name`` is the config
    file's stem (``<dataset>-<model>`` without one), so two configs never share a folder.
    Later runs of the same command take ``-v2``, ``-v3``, ... (``Placement.candidates``)."""
    if config.metrics.out:
        return Path(config.metrics.out)
    stem = name or f"{config.data.dataset}-{config.model.name}"
    return Path("results") / "runs" / f"{stem}-{config.comm.mode}-p{world_size}"


@dataclass(frozen=True)
class Verdict:
    """What a run that may take a directory does there."""

    resume_from: Path | None = None
    """The checkpoint it continues from; None where it starts fresh (or has nothing to do)."""
    finished: bool = False
    """The job's own run there had finished before this restart: nothing is left to do,
    and nothing there may change."""


@dataclass(frozen=True)
class Placement:
    """Where one run goes: the directory asked for, and what to do with a run found there."""

    base: Path
    """``--out``, or (not ``named``) the default directory whose versions the run may take."""
    named: bool = True
    """The directory was given (``--out``): the run takes it, or is refused."""
    checkpoint_dir: Path | None = None
    """The config's ``checkpoint.dir``; None keeps each run's checkpoints in its directory."""
    overwrite: bool = False
    """``--overwrite``: start fresh over a run there (its files and own checkpoints go)."""
    resume: bool = False
    """``--resume``: continue the run there from its newest checkpoint."""
    restarted: bool = False
    """A worker group that torchrun restarted: it continues its job's own run, if any."""

    def __post_init__(self) -> None:
        if self.overwrite and self.resume:
            raise ValueError("overwrite and resume exclude each other")
        # Strings (a config's values) become paths; an empty checkpoint.dir is none.
        object.__setattr__(self, "base", Path(self.base))
        shared = Path(self.checkpoint_dir) if self.checkpoint_dir else None
        object.__setattr__(self, "checkpoint_dir", shared)

    @classmethod
    def of(
        cls,
        config: Config,
        world_size: int,
        name: str | None = None,
        *,
        overwrite: bool = False,
        resume: bool = False,
        restarted: bool = False,
    ) -> Placement:
        """The placement of a run of ``config`` on ``world_size`` workers; ``name``: the
        config file's stem (``output_dir``)."""
        return cls(
            output_dir(config, world_size, name),
            named=bool(config.metrics.out),
            checkpoint_dir=config.checkpoint.dir or None,
            overwrite=overwrite,
            resume=resume,
            restarted=restarted,
        )

    def checkpoints(self, out: Path) -> Path:
        """Where the run in ``out`` keeps its checkpoints: ``<out>/checkpoints``, or with a
        ``checkpoint.dir`` ``<checkpoint.dir>/<out's name>``, so that the runs that share
        one (``-v2``, ``-v3``, ... of one command) each keep their own."""
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir / Path(out).name
        return Path(out) / DEFAULT_DIR

    def candidates(self, job: str | None = None) -> Iterator[tuple[Path, bool]]:
        """The directories the run may take, in order of preference, each with whether it
        is the job's own (the run a restarted group's first attempt started there).

        Named, ``base`` alone; else the first free version of ``base`` (``resume`` and
        ``overwrite``: the newest). A restarted group's own directory (``job``: its
        identity) comes first and alone; where there is none it is a new run like any
        other. Changes nothing."""
        if self.restarted and job:
            own = self._own_directory(job)
            if own is not None:
                yield own, True
                return
        if self.named:
            yield self.base, False
        elif self.resume or self.overwrite:
            yield newest_version(self.base), False
        else:
            yield from ((path, False) for path in self._free_versions())

    def verdict(self, path: Path, *, own: bool = False, locked: bool = False) -> Verdict:
        """Whether the run may take ``path``, and what it does there: continue from a
        checkpoint, start fresh (removing what is there, which ``overwrite`` alone allows
        for a run), or, for a restart whose own run there had finished, nothing. Changes
        nothing.

        ``own``: the directory holds this job's own run (a restart continues it, from its
        newest checkpoint if any, whatever the flags; a finished one is kept as it is: the
        restart followed a failure on the way out). ``locked``: the caller holds the lock,
        so only its own claim can hold it.

        Raises:
            RunDirError: UNWRITABLE, RUNNING, CHECKPOINTS_TAKEN (the checkpoints' folder
                belongs to a run in another directory), NO_CHECKPOINT (``resume`` without
                one), FINISHED or UNFINISHED (a run there that neither ``resume`` nor
                ``overwrite`` allows replacing).
        """
        checkpoints = self.checkpoints(path)
        if not locked:
            check_writable(path)
            if lock_held(path):
                raise RunDirError(Problem.RUNNING, Problem.RUNNING.describe(path))
        if own and (path / SUMMARY_FILE).exists():
            return Verdict(finished=True)
        _refuse_foreign_checkpoints(path, checkpoints)
        if own:
            return Verdict(resume_from=find_checkpoint(checkpoints))
        if self.resume:
            return Verdict(resume_from=_require_checkpoint(path, checkpoints))
        if not self.overwrite:
            if (path / SUMMARY_FILE).exists():
                raise RunDirError(Problem.FINISHED, Problem.FINISHED.describe(path))
            _refuse_unfinished(path, checkpoints)
        return Verdict()

    def passes_over(self, error: RunDirError, own: bool) -> bool:
        """Whether a claim refused by ``error`` tries the next candidate: a version taken
        between the look and the lock (another run starting), for a run given no ``--out``."""
        return not self.named and not own and error.problem == Problem.RUNNING

    def plan(self) -> Path:
        """The directory the run will most likely take (a run starting alongside may take
        it first), checked without the lock; raises ``RunDirError``. Changes nothing.

        A restarted group continues the directory its job's first attempt started, which
        only the job's identity tells (it lives in the rendezvous store, known once torch
        is up): the claim decides it, and this returns ``base``."""
        if self.restarted:
            return self.base
        out, _ = next(self.candidates())
        self.verdict(out)
        return out

    def version_of(self, path: Path) -> int:
        """Which version of ``base`` ``path`` is: the number rank 0 shares with the others."""
        return version_of(self.base, path)

    def versioned(self, version: int) -> Path:
        """``base``'s ``version``: the directory every rank learns rank 0 took."""
        return versioned(self.base, version)

    def why_elsewhere(self, taken: Path, own: bool = False) -> str | None:
        """Why the run went to ``taken`` rather than ``base``, or None where there is
        nothing to say: it went where asked, or elsewhere as a restart continuing its own
        run (``own``) or ``--resume``, which say where they continue."""
        if taken == self.base or own or self.resume:
            return None
        if self.overwrite:
            return f"--overwrite: starting fresh in {taken}, the newest run of {self.base}"
        left = self.orphans(taken)
        if left:
            folders = ", ".join(str(p) for p in left)
            return (
                f"checkpoints of deleted runs are left in {folders}: they are kept, and their "
                f"runs' names are not reused until those folders are removed; this run goes "
                f"to {taken}"
            )
        return f"{self.base} holds another run: this one goes to {taken}"

    def orphans(self, taken: Path) -> list[Path]:
        """The checkpoint folders of the versions of ``base`` before ``taken`` whose own
        folders are gone (``_orphaned``): what a run given no ``--out`` passed over
        besides runs."""
        if self.checkpoint_dir is None:
            return []
        before = (versioned(self.base, v) for v in range(1, version_of(self.base, taken)))
        folders = ((path, self.checkpoints(path)) for path in before)
        return [checkpoints for path, checkpoints in folders if _orphaned(path, checkpoints)]

    def _own_directory(self, job: str) -> Path | None:
        """The directory among ``base`` (and, unless named, its versions) whose run was
        started by ``job``, or None."""
        for path in [self.base] if self.named else existing_versions(self.base):
            if (read_status(path) or {}).get(JOB_KEY) == job:
                return path
        return None

    def _free_versions(self) -> Iterator[Path]:
        """``base``, ``base-v2``, ... in order, less those that hold a run (``holds_run``)
        and those whose checkpoints would refuse a new run there: left by a deleted run
        (``_orphaned``) or another directory's (``_refuse_foreign_checkpoints``)."""
        for path in (versioned(self.base, v) for v in itertools.count(1)):
            checkpoints = self.checkpoints(path)
            taken = holds_run(path, checkpoints) or _orphaned(path, checkpoints)
            if not (taken or _owned_elsewhere(path, checkpoints)):
                yield path


def versioned(base: Path, version: int) -> Path:
    """``base`` for version 1, else ``base-v<version>``: where a command's later runs go
    when its default output directory is taken."""
    return base if version == 1 else base.with_name(f"{base.name}-v{version}")


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


def _orphaned(path: Path, checkpoints: Path) -> bool:
    """Whether ``checkpoints`` hold a complete checkpoint while ``path``, the folder of
    their run, is gone (deleted with its checkpoints kept under ``checkpoint.dir``). A
    run given no ``--out`` passes over such a version: nothing removes them unasked."""
    return not path.exists() and find_checkpoint(checkpoints) is not None


def _owned_elsewhere(path: Path, checkpoints: Path) -> bool:
    owner = checkpoint_owner(checkpoints)
    return owner is not None and Path(owner) != path.resolve()


def _require_checkpoint(out_dir: Path, checkpoints: Path) -> Path:
    """``find_checkpoint``, or RunDirError(NO_CHECKPOINT) when there is none."""
    checkpoint = find_checkpoint(checkpoints)
    if checkpoint is None:
        raise RunDirError(Problem.NO_CHECKPOINT, Problem.NO_CHECKPOINT.describe(out_dir))
    return checkpoint


def _refuse_foreign_checkpoints(path: Path, checkpoints: Path) -> None:
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


def _refuse_unfinished(path: Path, checkpoints: Path) -> None:
    """Raises UNFINISHED if ``path`` holds a run that stopped after training something
    (epochs in ``metrics.jsonl`` or a checkpoint): starting fresh would lose it."""
    checkpoint = find_checkpoint(checkpoints)
    if checkpoint is None and not trained(path):
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
