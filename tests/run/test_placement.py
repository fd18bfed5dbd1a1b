"""Where a run goes (adaqp.run.placement): the next free version where the default folder
holds a run, restarts keep to their own job's run, and the runs that share a
``checkpoint.dir`` each keep their own checkpoints."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from adaqp.config import load_config
from adaqp.run.ckptdir import MANIFEST, OWNER_FILE
from adaqp.run.placement import Placement
from adaqp.run.rundir import RunDir
from adaqp.run.runfiles import JOB_KEY, Problem, RunDirError, read_status

CORA = Path(__file__).resolve().parents[2] / "configs" / "cora-gcn.toml"


def _fake_checkpoint(root: Path, epoch: int) -> None:
    step = root / f"epoch-{epoch:06d}"
    step.mkdir(parents=True)
    (step / MANIFEST).write_text("{}\n")


def _run(
    base: Path,
    job: str,
    *,
    finish: bool,
    checkpoint_dir: Path | None = None,
    checkpoint: bool = True,
) -> Path:
    """A run of ``job`` in the first free version of ``base``, with a checkpoint at epoch
    2 (unless not ``checkpoint``), finished (a summary) or failed; returns its directory."""
    run = RunDir.claim(Placement(base, named=False, checkpoint_dir=checkpoint_dir), job=job)
    if checkpoint:
        _fake_checkpoint(run._checkpoints, 2)
    (run.path / "metrics.jsonl").write_text('{"epoch": 1}\n{"epoch": 2}\n')
    if finish:
        (run.path / "summary.json").write_text("{}\n")
    run.end(None if finish else RuntimeError("a peer died"))
    run.close()
    return run.path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_job_is_recorded_where_its_run_starts(tmp_path):
    path = _run(tmp_path / "run", "job-a", finish=True)
    assert read_status(path)[JOB_KEY] == "job-a"


@pytest.mark.parametrize("finish", [True, False], ids=["finished", "failed"])
def test_a_restart_whose_first_attempt_never_started_is_a_new_run(tmp_path, finish):
    """The first attempt gave its directory up before starting: the restart finds no run
    of its job, takes the first free version and changes no other run."""
    base = tmp_path / "run"
    older = [_run(base, f"other-{i}", finish=finish) for i in range(2)]
    before = {p: _files(p) for p in older}
    first = RunDir.reserve(Placement(base, named=False), job="mine")
    assert first.path == tmp_path / "run-v3"
    first.close()  # failed before start: the directory it made goes again
    assert not first.path.exists()
    restart = RunDir.reserve(Placement(base, named=False, restarted=True), job="mine")
    try:
        assert restart.path == tmp_path / "run-v3" and restart.resume_from is None
        restart.start()
    finally:
        restart.close()
    assert {p: _files(p) for p in older} == before
    assert read_status(restart.path)[JOB_KEY] == "mine"


def test_a_restart_continues_its_own_run_and_no_other(tmp_path):
    base = tmp_path / "run"
    older = _run(base, "other", finish=False)  # the newest run, with a checkpoint, is not ours
    own = _run(base, "mine", finish=False)
    newer = _run(base, "another", finish=False)
    before = {p: _files(p) for p in (older, newer)}
    restart = RunDir.reserve(Placement(base, named=False, restarted=True), job="mine")
    try:
        assert restart.path == own
        assert restart.resume_from == own / "checkpoints" / "epoch-000002"
        restart.start()
    finally:
        restart.close()
    assert {p: _files(p) for p in (older, newer)} == before


def test_a_restart_with_overwrite_keeps_its_own_progress(tmp_path):
    """The first attempt's --overwrite cleared the old run; its restart must not clear
    what the first attempt trained since."""
    out = tmp_path / "run"
    run = RunDir.claim(Placement(out, overwrite=True), job="mine")
    _fake_checkpoint(out / "checkpoints", 4)
    run.end(RuntimeError("a peer died"))
    run.close()
    restart = RunDir.reserve(Placement(out, overwrite=True, restarted=True), job="mine")
    try:
        assert restart.resume_from == out / "checkpoints" / "epoch-000004"
    finally:
        restart.close()


@pytest.mark.parametrize("checkpoint", [True, False], ids=["checkpoint", "no-checkpoint"])
def test_a_restart_after_its_run_finished_keeps_it_untouched(tmp_path, checkpoint, caplog):
    """A worker failed on its way out of a finished run, and torchrun restarted the group:
    the restart finds its own run finished and changes nothing there, whatever the flags
    (it used to continue from the checkpoint, or start fresh and remove the summary)."""
    base = tmp_path / "run"
    own = _run(base, "mine", finish=True, checkpoint=checkpoint)
    before = _files(own)
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with caplog.at_level(logging.INFO, logger="adaqp.run.rundir"):
            restart = RunDir.reserve(
                Placement(base, named=False, restarted=True, **flags), job="mine"
            )
        try:
            restart.start()
            restart.end()
        finally:
            restart.close()
        assert _files(own) == before, flags
        assert restart.path == own and restart.finished and restart.resume_from is None
        assert f"this job's run in {own} had already finished" in caplog.text
    assert read_status(own)["status"] == "complete"


def test_a_restart_never_continues_a_named_directory_of_another_job(tmp_path):
    out = tmp_path / "run"
    _run(out, "other", finish=False)
    with pytest.raises(RunDirError) as info:
        RunDir.reserve(Placement(out, restarted=True), job="mine")
    assert info.value.problem is Problem.UNFINISHED


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_without_out_a_taken_default_gives_the_next_version(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(CORA, [])

    def plan(**flags) -> Path:
        return Placement.of(config, 4, "cora-gcn", **flags).plan()

    base = Path("results/runs/cora-gcn-vanilla-p4")  # the config's stem, its mode, P
    assert Placement.of(config, 4, "cora-gcn").base == base
    assert plan() == base  # free
    assert _run(base, "first", finish=True, checkpoint=False) == base
    assert plan() == Path("results/runs/cora-gcn-vanilla-p4-v2")
    assert _run(base, "second", finish=True, checkpoint=False).name == "cora-gcn-vanilla-p4-v2"
    before = _tree(tmp_path)
    assert plan().name == "cora-gcn-vanilla-p4-v3"
    # --resume and --overwrite without --out: the newest run of the command.
    with pytest.raises(RunDirError, match="no checkpoint to resume from"):
        plan(resume=True)
    step = Path("results/runs/cora-gcn-vanilla-p4-v2/checkpoints/epoch-000002")
    step.mkdir(parents=True)
    (step / MANIFEST).write_text("{}\n")
    assert plan(resume=True).name == plan(overwrite=True).name == "cora-gcn-vanilla-p4-v2"
    assert _tree(tmp_path) == sorted([*before, *map(str, (step.parent, step, step / MANIFEST))])


def _plan(config, **flags) -> Path:
    """Where a run of ``config`` on 2 workers will go (the pre-flight's question)."""
    return Placement.of(config, 2, **flags).plan()


def _config(tmp_path: Path, **keys: str):
    overrides = [f"checkpoint.dir={tmp_path / 'ckpt'}", *(f"{k}={v}" for k, v in keys.items())]
    return load_config(None, overrides)


def test_repeat_runs_sharing_a_checkpoint_dir_each_keep_their_own(tmp_path, monkeypatch):
    """With ``checkpoint.dir`` and no --out, a repeat run goes to -v2 (no refusal about a
    run that is not there) and keeps its checkpoints apart; --overwrite of the newest
    removes only the newest's."""
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path)
    first = _plan(config)
    run = RunDir.claim(Placement(first, named=False, checkpoint_dir=config.checkpoint.dir))
    assert (
        run._checkpoints
        == tmp_path / "ckpt" / first.name
        == Placement.of(config, 2).checkpoints(first)
    )
    _fake_checkpoint(run._checkpoints, 3)
    (first / "summary.json").write_text("{}\n")
    run.end()
    run.close()
    kept = _files(tmp_path / "ckpt" / first.name)

    second = _plan(config)
    assert second == first.with_name(f"{first.name}-v2")
    run = RunDir.claim(Placement(first, named=False, checkpoint_dir=config.checkpoint.dir))
    assert run.path == second and run._checkpoints == tmp_path / "ckpt" / second.name
    _fake_checkpoint(run._checkpoints, 1)
    run.end(RuntimeError("stopped"))
    run.close()

    assert _plan(config, overwrite=True) == second
    again = RunDir.claim(
        Placement(first, named=False, overwrite=True, checkpoint_dir=config.checkpoint.dir)
    )
    again.close()
    assert again.path == second and not list((tmp_path / "ckpt" / second.name).glob("epoch-*"))
    assert _files(tmp_path / "ckpt" / first.name) == kept


def test_checkpoints_left_by_a_deleted_run_do_not_refuse_a_run_without_out(tmp_path, monkeypatch):
    """The folder of a run was deleted, its checkpoints under ``checkpoint.dir`` were not:
    a run given no --out takes the next version (it used to be refused as unfinished),
    and the checkpoints stay as they were."""
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path)
    first = _plan(config)
    _run(first, "old", finish=True, checkpoint_dir=tmp_path / "ckpt")
    shutil.rmtree(first)
    left = tmp_path / "ckpt" / first.name
    kept = _files(left)
    second = first.with_name(f"{first.name}-v2")
    assert _plan(config) == second
    run = RunDir.claim(Placement(first, named=False, checkpoint_dir=config.checkpoint.dir))
    (second / "summary.json").write_text("{}\n")
    run.end()
    run.close()
    assert run.path == second and _files(left) == kept
    assert Placement.of(config, 2).orphans(second) == [left]
    said = Placement.of(config, 2).why_elsewhere(second)  # rank 0's line about it
    assert f"checkpoints of deleted runs are left in {left}: they are kept" in said
    assert said.endswith(f"this run goes to {second}") and "holds another run" not in said
    # Another directory's checkpoints where a version's would go are passed over too.
    foreign = tmp_path / "elsewhere" / f"{first.name}-v3"
    RunDir.claim(Placement(foreign, checkpoint_dir=config.checkpoint.dir)).close()
    assert _plan(config) == first.with_name(f"{first.name}-v4")


def test_checkpoints_of_another_directory_are_never_taken(tmp_path):
    """Two --out folders of one name share ``<checkpoint.dir>/<name>``: the second run is
    refused before it changes anything, even with --overwrite or --resume."""
    ckpt = tmp_path / "ckpt"
    first = RunDir.claim(Placement(tmp_path / "a" / "run", checkpoint_dir=ckpt))
    _fake_checkpoint(ckpt / "run", 5)
    first.end()
    first.close()
    assert (ckpt / "run" / OWNER_FILE).is_file()
    kept = _files(ckpt)
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(RunDirError) as info:
            RunDir.claim(Placement(tmp_path / "b" / "run", checkpoint_dir=ckpt, **flags))
        assert info.value.problem is Problem.CHECKPOINTS_TAKEN
        assert str(tmp_path / "a" / "run") in str(info.value)
        config = _config(tmp_path, **{"metrics.out": str(tmp_path / "b" / "run")})
        with pytest.raises(RunDirError, match="holds the checkpoints of the run in"):
            _plan(config, **flags)
    assert _files(ckpt) == kept and not (tmp_path / "b").exists()
    resumed = RunDir.claim(Placement(tmp_path / "a" / "run", checkpoint_dir=ckpt, resume=True))
    resumed.close()
    assert resumed.resume_from == ckpt / "run" / "epoch-000005"
