"""Claiming an output directory: refusals, the lock, starting fresh, and status.json."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from adaqp.process import stop
from adaqp.run.ckptdir import MANIFEST
from adaqp.run.metrics import RunWriter
from adaqp.run.placement import Placement, newest_version, version_of, versioned
from adaqp.run.rundir import RunDir
from adaqp.run.runfiles import (
    LOCK_FILE,
    PROJECT_FILES,
    Problem,
    RunDirError,
    check_writable,
    holds_run,
    read_status,
)
from adaqp.run.summary import Summary

ROOT = Path(__file__).resolve().parents[2]


def _finished_run(out: Path) -> None:
    """A directory as a complete run leaves it, plus a file the project did not write."""
    run = RunDir.claim(Placement(out))
    (out / "config.json").write_text('{"old": true}\n')
    (out / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (out / "summary.json").write_text('{"test_acc": 0.8}\n')
    run.end()
    run.close()
    (out / "logs").mkdir()
    (out / "logs" / "host0.log").write_text("kept\n")


def _refused(out: Path, **flags) -> RunDirError:
    with pytest.raises(RunDirError) as info:
        RunDir.claim(Placement(out, **flags))
    return info.value


def test_claim_makes_the_directory_and_marks_it_running(tmp_path):
    out = tmp_path / "a" / "b"
    run = RunDir.claim(Placement(out))
    try:
        status = read_status(out)
        assert status["status"] == "running" and status["pid"] == os.getpid()
        assert (out / LOCK_FILE).exists()
        assert not list(out.glob("*.tmp"))
    finally:
        run.close()


def test_finished_run_is_refused_and_left_untouched(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _finished_run(out)
    before = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    # A later clock: a refused claim that rewrote the lock file's holder line would show.
    monkeypatch.setattr("adaqp.run.rundir._now", lambda: "2099-01-01T00:00:00+00:00")
    error = _refused(out)
    assert error.problem is Problem.FINISHED
    assert "finished run" in str(error) and "--overwrite" in str(error), error
    assert {p.name: p.read_text() for p in out.iterdir() if p.is_file()} == before


def test_overwrite_removes_only_the_run_files(tmp_path):
    out = tmp_path / "run"
    _finished_run(out)
    (out / "summary.json.tmp").write_text("half")
    (out / "notes.txt").write_text("mine\n")
    run = RunDir.claim(Placement(out, overwrite=True))
    try:
        left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        assert left == ["logs/host0.log", "notes.txt", LOCK_FILE, "status.json"]
        assert read_status(out)["status"] == "running"
    finally:
        run.close()


def test_a_running_run_is_refused_even_with_overwrite(tmp_path):
    out = tmp_path / "run"
    first = RunDir.claim(Placement(out))
    try:
        for flags in ({}, {"overwrite": True}):
            error = _refused(out, **flags)
            assert error.problem is Problem.RUNNING
            assert "in use by another run" in str(error) and f"pid {os.getpid()}" in str(error)
        assert read_status(out)["status"] == "running"
    finally:
        first.close()
    RunDir.claim(Placement(out)).close()  # free again once the holder lets go


def test_lock_of_a_killed_process_does_not_block(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from adaqp.run.placement import Placement; "
            "from adaqp.run.rundir import RunDir; RunDir.claim(Placement(sys.argv[1])); "
            "print('held', flush=True); time.sleep(600)",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert _refused(out).problem is Problem.RUNNING
    finally:
        holder.kill()
        holder.wait(timeout=60)
    run = RunDir.claim(Placement(out))  # the kernel dropped the dead holder's lock
    try:
        assert read_status(out)["pid"] == os.getpid()
    finally:
        run.close()


def _fake_checkpoint(root: Path, epoch: int) -> None:
    """A checkpoint as ``find_checkpoint`` sees it: a step directory with a manifest."""
    step = root / f"epoch-{epoch:06d}"
    step.mkdir(parents=True)
    (step / MANIFEST).write_text("{}\n")


def _stopped_run(out: Path, exc: BaseException, epochs: int) -> None:
    run = RunDir.claim(Placement(out, overwrite=True))
    (out / "metrics.jsonl").write_text("".join(f'{{"epoch": {e}}}\n' for e in range(epochs)))
    run.end(exc)
    run.close()


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()], ids=str)
def test_unfinished_run_is_refused_unless_resumed_or_overwritten(tmp_path, exc):
    out = tmp_path / "run"
    _stopped_run(out, exc, epochs=3)
    recorded = read_status(out)
    assert recorded["status"] == ("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
    assert recorded["error"] and not (out / "summary.json").exists()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    error = _refused(out)
    assert error.problem is Problem.UNFINISHED
    assert "unfinished run" in str(error) and "--overwrite" in str(error)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    run = RunDir.claim(Placement(out, overwrite=True))
    try:
        assert not (out / "metrics.jsonl").exists()
    finally:
        run.close()


def test_an_error_after_a_stop_signal_ends_the_run_interrupted(tmp_path, monkeypatch):
    """A rank asked to stop while blocked in a collective may first see the collective
    fail (a peer that stopped earlier closed its connections): the run was interrupted."""
    monkeypatch.setattr(stop, "_stop_signals", [])
    out = tmp_path / "run"
    _stopped_run(out, RuntimeError("connection closed by peer"), epochs=3)
    assert read_status(out)["status"] == "failed"  # no signal: a failure
    with pytest.raises(KeyboardInterrupt):
        stop.request_stop(signal.SIGTERM, None)
    _stopped_run(out, RuntimeError("connection closed by peer"), epochs=3)
    recorded = read_status(out)
    assert recorded["status"] == "interrupted" and recorded["error"] == "interrupted (SIGTERM)"


def test_unfinished_run_with_a_checkpoint_names_resume(tmp_path):
    out = tmp_path / "run"
    _stopped_run(out, KeyboardInterrupt(), epochs=0)  # nothing logged, but a checkpoint
    _fake_checkpoint(out / "checkpoints", 4)
    error = _refused(out)
    assert error.problem is Problem.UNFINISHED and "--resume" in str(error)
    assert "epoch-000004" in str(error)


def test_stopped_run_that_trained_nothing_starts_again_without_a_flag(tmp_path):
    out = tmp_path / "run"
    _stopped_run(out, RuntimeError("bad partition"), epochs=0)
    run = RunDir.claim(Placement(out))  # nothing that took time to make is lost
    try:
        assert read_status(out)["status"] == "running"
    finally:
        run.close()


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("kind", ["finished", "unfinished", "checkpoint", "running"])
def test_new_version_takes_the_next_free_directory_and_leaves_the_run_there(tmp_path, kind):
    """A run given no output directory never replaces one: it takes base-v2, -v3, ..."""
    out = tmp_path / "run"
    holder = None
    if kind == "finished":
        _finished_run(out)
    elif kind == "unfinished":
        _stopped_run(out, KeyboardInterrupt(), epochs=3)
    elif kind == "checkpoint":
        _stopped_run(out, KeyboardInterrupt(), epochs=0)
        _fake_checkpoint(out / "checkpoints", 2)
    else:
        holder = RunDir.claim(Placement(out))
    before = _files(out)
    try:
        assert holds_run(out)
        run = RunDir.claim(Placement(out, named=False))
        try:
            assert run.path == tmp_path / "run-v2" and version_of(out, run.path) == 2
            assert read_status(run.path)["status"] == "running"
        finally:
            run.close()
        third = RunDir.claim(Placement(out, named=False))  # v2 trained nothing: it is reused
        third.close()
        assert third.path == tmp_path / "run-v2"
        assert _files(out) == before
    finally:
        if holder is not None:
            holder.close()


def test_new_version_skips_every_taken_version_and_reuses_an_empty_one(tmp_path):
    base = tmp_path / "run"
    for version in (1, 2, 3):
        _finished_run(versioned(base, version))
    assert versioned(base, 3) == tmp_path / "run-v3" and newest_version(base) == versioned(base, 3)
    run = RunDir.claim(Placement(base, named=False))
    run.close()
    assert run.path == tmp_path / "run-v4"
    assert newest_version(base) == tmp_path / "run-v4"  # the newest run, finished or not
    assert newest_version(tmp_path / "none") == tmp_path / "none"


def test_a_reservation_changes_nothing_until_it_starts(tmp_path):
    """Checks that run between reserving and starting (the partition) leave a refused run's
    directory as it was, even with --overwrite; one made by the reservation goes again."""
    out = tmp_path / "run"
    _finished_run(out)
    before = _files(out)
    reserved = RunDir.reserve(Placement(out, overwrite=True))
    reserved.end(RuntimeError("the partition was refused"))
    reserved.close()
    assert _files(out) == before
    fresh = RunDir.reserve(Placement(tmp_path / "new"))
    fresh.end(RuntimeError("refused"))
    fresh.close()
    assert not (tmp_path / "new").exists()
    started = RunDir.reserve(Placement(out, overwrite=True))
    started.start()
    started.close()
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize("finished", [False, True])
def test_resume_without_a_checkpoint_is_an_error(tmp_path, finished):
    out = tmp_path / "run"
    if finished:
        _finished_run(out)
    before = sorted(p.name for p in out.iterdir()) if finished else None
    error = _refused(out, resume=True)
    assert error.problem is Problem.NO_CHECKPOINT
    assert "no checkpoint to resume from" in str(error)
    if finished:
        assert sorted(p.name for p in out.iterdir()) == before
        assert read_status(out)["status"] == "complete"
    else:
        assert not out.exists()


def test_overwrite_and_resume_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="exclude"):
        RunDir.claim(Placement(tmp_path / "run", overwrite=True, resume=True))


def _unwritable_paths(tmp_path: Path) -> list[Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    paths = [a_file, a_file / "below"]
    if Path("/proc/self").exists():
        paths.append(Path("/proc/adaqp-out"))
    if os.geteuid() != 0:  # root writes through permission bits
        read_only = tmp_path / "read-only"
        read_only.mkdir(mode=0o555)
        paths.append(read_only)
    return paths


def test_unwritable_out_is_refused_naming_the_path(tmp_path):
    for path in _unwritable_paths(tmp_path):
        for check in (lambda out: RunDir.claim(Placement(out)), check_writable):
            with pytest.raises(RunDirError) as info:
                check(path)
            assert info.value.problem is Problem.UNWRITABLE
            assert str(path) in str(info.value) and "choose another --out" in str(info.value)
    assert "a-file exists and is not a directory" in str(_refused(tmp_path / "a-file" / "x"))


def test_check_writable_changes_nothing(tmp_path):
    (tmp_path / "old").mkdir()
    check_writable(tmp_path / "new" / "run")  # probes tmp_path, the nearest parent there is
    check_writable(tmp_path / "old")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["old"]


def test_status_is_replaced_atomically(tmp_path, monkeypatch):
    out = tmp_path / "run"
    run = RunDir.claim(Placement(out))
    try:
        seen = []
        real_replace = Path.replace

        def spy(self, target):
            seen.append(read_status(out)["status"])  # the old status is whole until the rename
            return real_replace(self, target)

        monkeypatch.setattr(Path, "replace", spy)
        run.end()
        assert seen == ["running"] and read_status(out)["status"] == "complete"
        with pytest.raises(ValueError, match="status must be one of"):
            run.set_status("done")
    finally:
        run.close()


def test_every_file_a_run_writes_is_known_to_overwrite(tmp_path):
    """Starting fresh removes PROJECT_FILES: they must cover what RunWriter writes."""
    out = tmp_path / "run"
    run = RunDir.claim(Placement(out))
    writer = RunWriter(out, enabled=True)
    writer.write_config({"a": 1})
    writer.close()
    missing = dataclasses.MISSING
    required = [
        f.name
        for f in dataclasses.fields(Summary)
        if f.default is missing and f.default_factory is missing
    ]
    writer.write_summary(Summary(**dict.fromkeys(required, 0)))
    run.end()
    run.close()
    written = {p.name for p in out.iterdir()} - {LOCK_FILE}
    assert written <= set(PROJECT_FILES), written - set(PROJECT_FILES)
    assert "summary.json" in written and "metrics.jsonl" in written
