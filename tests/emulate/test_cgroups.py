"""Host budgets: values from the command line, control groups v2 in a fake folder, and v1
(or whatever this machine has) for real: a quota holds a busy loop, a limit kills a hog."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaqp.emulate.cgroups import (
    CFS_PERIOD_US,
    Budget,
    CgroupError,
    CgroupV2,
    HostGroup,
    Usage,
    find_cgroups,
    host_budgets,
    parse_memory,
)
from tests.emulate.fake_cgroupfs import PID_LIMIT, FakeCgroupV2
from tests.emulate.helpers import _cgroup_tree, _tag, needs_cgroups


def test_budgets_one_value_for_all_or_one_per_host():
    assert host_budgets(3, "0.5", "") == [Budget(0.5, None)] * 3
    mixed = host_budgets(3, "1,0.5,0", "3g,200m,")
    assert mixed == [Budget(1.0, 3 * 2**30), Budget(0.5, 200 * 2**20), Budget(None, None)]
    assert not Budget().limited and Budget(memory_bytes=1).limited
    assert parse_memory("512k") == 2**19
    assert parse_memory("1.5GiB") == 3 * 2**29
    assert parse_memory("4096") == 4096
    assert parse_memory("0") is None


@pytest.mark.parametrize(
    ("cpus", "memory", "message"),
    [
        ("0.5,0.5", "", "cpus-per-host has 2 values for 3 hosts"),
        ("0.5", "1g,1g,1g,1g", "memory-per-host has 4 values for 3 hosts"),
        ("half", "", "cpus-per-host: cannot read 'half'"),
        ("-1", "", "must be a non-negative number"),
        ("0.05", "", "below the least quota"),
        ("1", "lots", "memory-per-host: cannot read 'lots'"),
    ],
)
def test_budgets_reject_a_wrong_count_or_value(cpus, memory, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        host_budgets(3, cpus, memory)


def _fake_v2(root: Path) -> Path:
    """A folder laid out as a cgroup v2 hierarchy whose own group offers cpu and memory."""
    base = root / "session"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (base / "cgroup.subtree_control").write_text("")
    return base


def test_v2_in_a_fake_folder_writes_limits_and_reads_usage(tmp_path):
    base = _fake_v2(tmp_path)
    tree = CgroupV2(base)
    assert (base / "cgroup.subtree_control").read_text() == "+cpu +memory"
    group = tree.group("aq1-h0")
    group.create(Budget(cpus=0.25, memory_bytes=200 * 2**20))
    d = base / "aq1-h0"
    assert (d / "cpu.max").read_text() == f"{CFS_PERIOD_US // 4} {CFS_PERIOD_US}"
    assert (d / "memory.max").read_text() == str(200 * 2**20)
    with pytest.raises(CgroupError, match="exists already"):
        tree.group("aq1-h0").create(Budget())
    unlimited = tree.group("aq1-h1")
    unlimited.create(Budget())
    assert (base / "aq1-h1" / "cpu.max").read_text() == f"max {CFS_PERIOD_US}"
    assert not (base / "aq1-h1" / "memory.max").exists()

    # The wrapper writes the command's own pid into the group before it runs.
    out = subprocess.run(
        group.wrap(["sh", "-c", "echo $$"]), capture_output=True, text=True, check=True
    )
    assert (d / "cgroup.procs").read_text().strip() == out.stdout.strip()

    (d / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    (d / "memory.peak").write_text("123456\n")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
    assert group.usage() == Usage(cpu_seconds=1.5, peak_memory_bytes=123456, oom_kills=2)

    (d / "cgroup.procs").write_text("")
    for f in d.iterdir():  # the kernel's files vanish with the group; a folder's do not
        f.unlink()
    assert group.remove(timeout_s=1)
    assert not d.exists() and group.made == []


def test_v2_without_cpu_and_memory_controllers_is_refused(tmp_path):
    base = tmp_path / "g"
    base.mkdir()
    (base / "cgroup.controllers").write_text("pids io\n")
    with pytest.raises(CgroupError, match="not cpu and memory"):
        CgroupV2(base)


@pytest.mark.skipif(os.geteuid() != 0, reason="find_cgroups refuses without root")
def test_find_cgroups_reads_mounts_and_own_groups(tmp_path):
    mounts, own = tmp_path / "mounts", tmp_path / "cgroup"
    for name in ("cpu", "cpuacct", "memory/session"):
        (tmp_path / name).mkdir(parents=True)
    mounts.write_text(
        f"cgroup {tmp_path}/cpu cgroup rw,relatime,cpu 0 0\n"
        f"cgroup {tmp_path}/cpuacct cgroup rw,cpuacct 0 0\n"
        f"cgroup {tmp_path}/memory cgroup rw,memory 0 0\n"
        f"cgroup2 {tmp_path}/unified cgroup2 rw 0 0\n"
    )
    own.write_text("4:memory:/session\n2:cpuacct:/\n1:cpu:/\n0::/\n")
    tree = find_cgroups(str(mounts), str(own))
    assert tree.version == 1
    assert tree.bases == (tmp_path / "cpu", tmp_path / "cpuacct", tmp_path / "memory/session")

    _fake_v2(tmp_path / "v2")
    mounts.write_text(f"cgroup2 {tmp_path}/v2 cgroup2 rw 0 0\n")
    own.write_text("0::/session\n")
    tree = find_cgroups(str(mounts), str(own))
    assert (tree.version, tree.bases) == (2, (tmp_path / "v2" / "session",))

    mounts.write_text(f"cgroup {tmp_path}/cpu cgroup rw,cpu 0 0\n")
    own.write_text("1:cpu:/\n")
    with pytest.raises(CgroupError, match="no cpu and memory control groups"):
        find_cgroups(str(mounts), str(own))


BUSY = ["timeout", "2", "sh", "-c", "while :; do :; done"]
HOG = [sys.executable, "-c", "b = b'x' * (300 << 20); import time; time.sleep(5)"]


@needs_cgroups
def test_real_groups_hold_a_quota_and_a_memory_limit():
    tree = _cgroup_tree()
    group = tree.group(f"aq{_tag(6)}-h0")
    try:
        group.create(Budget(cpus=0.25, memory_bytes=64 * 2**20))
        if tree.version == 1:
            cpu, memory = group.dirs[0], group.dirs[2]
            assert (cpu / "cpu.cfs_period_us").read_text().strip() == str(CFS_PERIOD_US)
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == str(CFS_PERIOD_US // 4)
            assert int((memory / "memory.limit_in_bytes").read_text()) == 64 * 2**20
        else:
            assert group.dirs[0].joinpath("cpu.max").read_text().split() == ["2500", "10000"]

        started = time.monotonic()
        subprocess.run(group.wrap(BUSY), check=False, timeout=30)
        wall = time.monotonic() - started
        used = group.usage()
        # A busy loop alone would take a whole core: the quota holds it to a quarter.
        assert 0.1 < used.cpu_seconds / wall <= 0.3, (used, wall)
        assert used.oom_kills == 0

        hog = subprocess.run(group.wrap(HOG), check=False, timeout=60, capture_output=True)
        assert hog.returncode == -9, hog  # killed by the kernel for the group's limit
        used = group.usage()
        assert used.oom_kills >= 1
        assert used.peak_memory_bytes >= 0.97 * 64 * 2**20
        assert group.pids() == set()
    finally:
        assert group.remove(timeout_s=10)
    assert not any(d.exists() for d in group.dirs)


@needs_cgroups
def test_remove_kills_what_is_left_inside():
    group = _cgroup_tree().group(f"aq{_tag(7)}-h0")
    try:
        group.create(Budget())
        sleeper = subprocess.Popen(group.wrap(["sleep", "60"]))
        deadline = time.monotonic() + 10
        while sleeper.pid not in group.pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert group.pids() == {sleeper.pid}
    finally:
        assert group.remove(timeout_s=10)
    assert sleeper.wait(timeout=10) == -9
    assert not any(d.exists() for d in group.dirs)


def _sleeper() -> subprocess.Popen:
    """A worker as torchrun starts one: in a session of its own."""
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_kill_ends_every_process_of_a_v2_group_through_cgroup_kill(tmp_path, monkeypatch):
    fake = FakeCgroupV2(tmp_path / "cgroup2", monkeypatch)
    group = CgroupV2(fake.group("session")).group("aq1-h0")
    group.create(Budget())
    workers = [_sleeper(), _sleeper()]
    try:
        for w in workers:
            (group.dirs[0] / "cgroup.procs").write_text(str(w.pid))
        (group.dirs[0] / "cgroup.procs").write_text(str(PID_LIMIT + 1))  # one that never exits
        assert group.kill(timeout_s=10)
        assert [w.wait(timeout=10) for w in workers] == [-9, -9]
        assert sorted(fake.killed) == sorted([w.pid for w in workers] + [PID_LIMIT + 1])
        assert group.pids() == set() and group.remove(timeout_s=1)
    finally:
        for w in workers:
            w.kill()
            w.wait()


def test_kill_without_cgroup_kill_signals_each_process_until_none_is_left(tmp_path, monkeypatch):
    fake = FakeCgroupV2(tmp_path / "cgroup", monkeypatch)
    # v1, and v2 before Linux 5.14: no cgroup.kill; each process listed gets SIGKILL.
    group = HostGroup([fake.group(f"{c}/aq1-h0") for c in ("cpu", "cpuacct", "memory")], 1)
    workers = [_sleeper(), _sleeper()]
    try:
        for w, d in zip(workers, group.dirs[1:], strict=True):
            (d / "cgroup.procs").write_text(str(w.pid))
        assert group.pids() == {w.pid for w in workers}
        assert group.kill(timeout_s=10)
        assert [w.wait(timeout=10) for w in workers] == [-9, -9]
        assert group.pids() == set() and fake.killed == []
    finally:
        for w in workers:
            w.kill()
            w.wait()
