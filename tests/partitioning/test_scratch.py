"""Scratch beside a partition names its owner, and what a process that has ended left is
removed at the next start, while a running process's, another host's and an unowned
name's stay."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaqp.config import load_config
from adaqp.data import load_dataset
from adaqp.partitioning import scratch
from adaqp.partitioning.build import ensure_partition
from adaqp.partitioning.source import GraphSource


@pytest.fixture(scope="module")
def ended_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], **_OUT)
    pid = int(child.stdout)
    assert not scratch.is_running(pid)
    return pid


@pytest.fixture
def running_pid() -> Iterator[int]:
    """The id of a running process other than this one."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


_OUT = {"capture_output": True, "text": True, "check": True}


def _named(directory: Path, kind: str, pid: int, where: str | None = None, prefix: str = ""):
    """A scratch directory as process ``pid`` in scope ``where`` (default: here) names it."""
    lead = f"{prefix}." if prefix else ""
    path = directory / f".{lead}{kind}-{where or scratch.scope()}-{pid}-0123abcd"
    path.mkdir()
    (path / "features.f32").write_bytes(b"\0" * 64)
    return path


def test_names_carry_this_process_and_parse_back(tmp_path):
    made = scratch.make_owned_dir(tmp_path, scratch.SCRATCH)
    assert made.name.startswith(".adaqp-scratch-") and made.is_dir()
    assert scratch.owner(made.name) == (scratch.scope(), os.getpid())
    staging = scratch.owned_name(scratch.STAGING, prefix="cora-p2")
    assert staging.startswith(".cora-p2.adaqp-tmp-")
    assert scratch.owner(staging) == (scratch.scope(), os.getpid())
    for other in (
        ".adaqp-scratch-k2j4_x9a",
        ".cora.adaqp-tmp-4242-0123abcd",
        "adaqp-scratch-h-1-2-0123abcd",
    ):
        assert scratch.owner(other) is None  # made before names had owners, or not ours


def test_a_lean_source_spills_into_a_directory_this_process_owns(tmp_path):
    source = GraphSource.take(load_dataset("cora"), tmp_path)
    try:
        assert scratch.owner(source.scratch.name) == (scratch.scope(), os.getpid())
        assert scratch.own_leftovers(tmp_path) == [source.scratch]
    finally:
        source.close()
    assert scratch.own_leftovers(tmp_path) == []


def test_after_a_stop_what_this_process_still_owns_is_removed(tmp_path):
    """A signal can land between making a directory (the write check's probe) and handing
    it to the code that removes it: the stop removes what this process owns, only that."""
    mine = tmp_path / scratch.owned_name(scratch.STAGING)
    mine.mkdir()
    (mine / "part-00000.npz").write_bytes(b"x")
    theirs = tmp_path / f".adaqp-tmp-{scratch.scope()}-{os.getpid() + 1}-0123abcd"
    theirs.mkdir()
    assert scratch.remove_own_leftovers(tmp_path) == []
    assert not mine.exists() and theirs.exists()


def test_only_an_ended_process_s_scratch_on_this_host_is_removed(
    tmp_path, ended_pid, running_pid, caplog
):
    ended = [
        _named(tmp_path, scratch.SCRATCH, ended_pid),
        _named(tmp_path, scratch.STAGING, ended_pid, prefix="p"),
    ]
    kept = [
        _named(tmp_path, scratch.SCRATCH, running_pid),
        _named(tmp_path, scratch.SCRATCH, os.getpid()),
        _named(tmp_path, scratch.SCRATCH, ended_pid, where="otherhost-4026531836"),
    ]
    unowned = tmp_path / ".adaqp-scratch-k2j4_x9a"  # an older version's name
    unowned.mkdir()
    a_file = tmp_path / f".adaqp-scratch-{scratch.scope()}-{ended_pid}-0123abcf"
    a_file.write_text("not a directory: never ours")
    with caplog.at_level(logging.INFO, logger=scratch.__name__):
        removed = scratch.remove_stale(tmp_path, tmp_path / "absent")
    assert sorted(removed) == sorted(ended)
    assert not any(path.exists() for path in ended)
    assert all(path.is_dir() for path in [*kept, unowned]) and a_file.is_file()
    assert f"left by process {ended_pid}, which has ended" in caplog.text
    assert f"left {unowned}" in caplog.text and "no owner in its name" in caplog.text


def test_the_next_partitioning_removes_what_a_killed_one_left(tmp_path, ended_pid, running_pid):
    """``ensure_partition`` (the tool's and the trainer's way in) sweeps before it starts,
    beside the partition and inside an existing one; a running process's scratch stays."""
    out = tmp_path / "cora-p2"
    config = load_config(None, ["data.dataset=cora"])
    ensure_partition(config.data, config.partition, 2, out)
    stale = [
        _named(tmp_path, scratch.SCRATCH, ended_pid),
        _named(tmp_path, scratch.STAGING, ended_pid, prefix=out.name),
        _named(out, scratch.STAGING, ended_pid),
    ]
    live = _named(tmp_path, scratch.SCRATCH, running_pid)
    ensure_partition(config.data, config.partition, 2, out)  # reused as it is
    assert not any(path.exists() for path in stale)
    assert live.is_dir()
