"""cgroup v2 on a systemd host: the cluster's own group holds processes, which the kernel
forbids in a group whose children use controllers. Against a fake hierarchy that enforces
that rule (EBUSY, as the kernel answers), the group's processes move into a leaf, the
host groups get their budgets beside it, and the group is given back as it was."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from adaqp.emulate.cgroup_leaf import LEAF
from adaqp.emulate.cgroups import CFS_PERIOD_US, Budget, CgroupV2, find_cgroups
from tests.emulate.fake_cgroupfs import PID_LIMIT, FakeCgroupV2

SHELL = PID_LIMIT + 1  # the user's shell, beside the cluster in its session scope


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCgroupV2:
    return FakeCgroupV2(tmp_path / "cgroup2", monkeypatch)


def test_the_fake_refuses_what_the_kernel_refuses(fake):
    """The rule the cluster used to break: without it the tests below could not fail."""
    scope = fake.group("user.slice/session-1.scope", [os.getpid(), SHELL])
    with pytest.raises(OSError) as busy:
        (scope / "cgroup.subtree_control").write_text("+cpu +memory")
    assert busy.value.errno == errno.EBUSY
    (scope / "h0").mkdir()
    with pytest.raises(OSError) as missing:  # no controller enabled above it: no cpu.max
        (scope / "h0" / "cpu.max").write_text("max 10000")
    assert missing.value.errno == errno.ENOENT
    with pytest.raises(OSError) as holds:
        scope.rmdir()
    assert holds.value.errno == errno.EBUSY
    ended = subprocess.Popen(["true"])
    ended.wait()
    with pytest.raises(OSError) as gone:  # no such process (any more)
        (scope / "cgroup.procs").write_text(str(ended.pid))
    assert gone.value.errno == errno.ESRCH


def test_a_group_holding_this_process_moves_it_into_a_leaf_and_budgets_hold(fake):
    scope = fake.group("user.slice/session-1.scope", [os.getpid(), SHELL])
    tree = CgroupV2(scope)
    assert tree.bases == (scope,)
    assert sorted(fake.procs(scope / LEAF)) == sorted([os.getpid(), SHELL])
    assert fake.procs(scope) == []
    assert (scope / "cgroup.subtree_control").read_text().split() == ["cpu", "memory"]

    # The host groups, beside the leaf, take their limits.
    hosts = [tree.group(f"aq1-h{i}") for i in range(2)]
    hosts[0].create(Budget(cpus=0.5, memory_bytes=200 * 2**20))
    hosts[1].create(Budget(cpus=0.25))
    assert (scope / "aq1-h0" / "cpu.max").read_text() == f"{CFS_PERIOD_US // 2} {CFS_PERIOD_US}"
    assert (scope / "aq1-h0" / "memory.max").read_text() == str(200 * 2**20)
    assert (scope / "aq1-h0" / "memory.swap.max").read_text() == "0"
    assert (scope / "aq1-h1" / "cpu.max").read_text() == f"{CFS_PERIOD_US // 4} {CFS_PERIOD_US}"

    # Given back once the host groups are gone, and only then.
    with tree:
        assert all(h.remove(timeout_s=5) for h in hosts)
    assert sorted(fake.procs(scope)) == sorted([os.getpid(), SHELL])
    assert not (scope / LEAF).exists()
    assert (scope / "cgroup.subtree_control").read_text() == ""
    tree.release()  # idempotent
    assert sorted(fake.procs(scope)) == sorted([os.getpid(), SHELL])


def test_release_leaves_another_clusters_hosts_their_budgets(fake):
    scope = fake.group("session.scope", [os.getpid()])
    tree = CgroupV2(scope)
    other = fake.group("session.scope/aq2-h0", [SHELL])  # another cluster, started meanwhile
    tree.release()
    assert (other / "cpu.max").exists()  # its controllers stay
    assert fake.procs(scope / LEAF) == [os.getpid()]
    (scope / LEAF / "cgroup.procs").write_text(str(SHELL))  # that cluster ends
    other.rmdir()
    tree.release()
    assert sorted(fake.procs(scope)) == sorted([os.getpid(), SHELL])
    assert not (scope / LEAF).exists()


def test_a_group_without_processes_or_the_root_moves_nothing(fake):
    tree = CgroupV2(fake.root)
    assert tree.leaf is None
    assert (fake.root / "cgroup.subtree_control").read_text().split() == ["cpu", "memory"]
    empty = fake.group("empty")
    assert CgroupV2(empty).leaf is None and not (empty / LEAF).exists()


def test_find_cgroups_from_inside_a_leaf_takes_its_parent(fake, tmp_path, monkeypatch):
    monkeypatch.setattr("adaqp.emulate.cgroups.os.geteuid", lambda: 0)
    scope = fake.group("session.scope", [os.getpid(), SHELL])
    mounts, own = tmp_path / "mounts", tmp_path / "cgroup"
    mounts.write_text(f"cgroup2 {fake.root} cgroup2 rw 0 0\n")
    own.write_text("0::/session.scope\n")
    with find_cgroups(str(mounts), str(own)) as tree:
        assert tree.bases == (scope,) and tree.leaf is not None
        own.write_text(f"0::/session.scope/{LEAF}\n")  # this process, moved; or one it starts
        again = find_cgroups(str(mounts), str(own))
        assert again.bases == (scope,) and again.leaf is None  # the first one gives it back
    assert sorted(fake.procs(scope)) == sorted([os.getpid(), SHELL])
