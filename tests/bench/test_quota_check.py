"""``python -m adaqp.bench.quota_check``: the pinned arm's groups pin host i to core i."""

from __future__ import annotations

from pathlib import Path

from adaqp.bench.quota_check import PinnedGroup, PinnedTree, arm_budgets
from adaqp.emulate.cgroups import CFS_PERIOD_US, Budget, CgroupV1


def test_pinned_groups_pin_each_host_to_its_own_core_and_are_removed(tmp_path: Path):
    bases = [tmp_path / c for c in ("cpu", "cpuacct", "memory", "cpuset")]
    for base in bases:
        base.mkdir()
    (bases[3] / "cpuset.mems").write_text("0\n")
    tree = CgroupV1(*bases[:3])
    pinned = PinnedTree(tree.version, tree.bases, cpuset_base=bases[3], cores=[0, 1])
    groups = [pinned.group(f"aq123-h{i}") for i in range(3)]
    assert all(isinstance(g, PinnedGroup) for g in groups)
    assert [g.cpus for g in groups] == ["0", "1", "0"]  # modulo the cores
    group = groups[1]
    group.create(Budget())  # no quota: the core is the budget
    assert (bases[0] / "aq123-h1" / "cpu.cfs_quota_us").read_text() == "-1"
    assert (bases[3] / "aq123-h1" / "cpuset.cpus").read_text() == "1"
    assert (bases[3] / "aq123-h1" / "cpuset.mems").read_text() == "0"
    assert bases[3] / "aq123-h1" / "cgroup.procs" in group.procs_files
    for d in group.made:  # a real group's files vanish with it; plain folders need emptying
        for f in d.iterdir():
            f.unlink()
    assert group.remove(timeout_s=2)
    assert not any((base / "aq123-h1").exists() for base in bases)


def test_period_us_sets_the_quota_arms_period_and_quota(tmp_path: Path):
    """``--period-us 100000`` gives each host of the quota arm one core per 100 ms in the
    group's own files, as the cluster's 10 ms gives one per 10 ms; the cpuset arm has no
    quota."""
    bases = [tmp_path / c for c in ("cpu", "cpuacct", "memory")]
    for base in bases:
        base.mkdir()
    tree = CgroupV1(*bases)
    assert arm_budgets("cpuset", 100_000) == [Budget(), Budget()]
    for i, period in enumerate((100_000, CFS_PERIOD_US)):
        tree.group(f"aq{i}-h0").create(arm_budgets("quota", period)[0])
        cpu = bases[0] / f"aq{i}-h0"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == str(period)
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == str(period)
