"""The host's memory: the smallest of MemTotal and every cgroup v2 and v1 limit above this
process; the share of it a run may take; the refusal's line."""

from __future__ import annotations

from pathlib import Path

from adaqp.memory.limits import (
    USABLE_FRACTION,
    HostLimit,
    config_in,
    host_limit,
    over_limit,
    train_overrides,
)


def _proc(
    tmp_path: Path, cgroup: str, mem_total_kb: int = 8 * 2**20, mountinfo: str | None = None
) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "meminfo").write_text(f"MemTotal:       {mem_total_kb} kB\nMemFree: 1 kB\n")
    if mountinfo is not None:
        (proc / "self" / "mountinfo").write_text(mountinfo)
    return proc


def test_cgroup_v2_takes_the_smallest_limit_on_the_way_up(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    leaf = root / "system.slice" / "job.scope"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text("max\n")  # systemd's scope: no limit of its own
    (root / "system.slice" / "memory.max").write_text(f"{3 * 2**30}\n")
    limit = host_limit(root, _proc(tmp_path, "0::/system.slice/job.scope\n"))
    assert limit.bytes == 3 * 2**30 and "system.slice" in limit.source


def test_cgroup_v1_limit_and_its_unlimited_value(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    group = root / "memory" / "jobs" / "a"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(f"{5 * 2**30}\n")
    proc = _proc(tmp_path, "4:memory:/jobs/a\n0::/\n")
    assert host_limit(root, proc).bytes == 5 * 2**30
    (group / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "none"
    fallback = host_limit(root, proc)
    assert fallback.bytes == 8 * 2**30 and "MemTotal" in fallback.source


def test_cgroup_v2_limit_above_the_machines_memory_gives_memtotal(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    (root / "big").mkdir(parents=True)
    (root / "big" / "memory.max").write_text(f"{64 * 2**30}\n")  # 64 GiB on an 8 GiB machine
    limit = host_limit(root, _proc(tmp_path, "0::/big\n"))
    assert limit.bytes == 8 * 2**30 and "MemTotal" in limit.source


def test_cgroup_v1_parent_limit_binds_an_unlimited_child(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    child = root / "memory" / "jobs" / "a"
    child.mkdir(parents=True)
    (child / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "none"
    (root / "memory" / "jobs" / "memory.limit_in_bytes").write_text(f"{3 * 2**30}\n")
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    limit = host_limit(root, _proc(tmp_path, "4:memory:/jobs/a\n0::/\n"))
    assert limit.bytes == 3 * 2**30 and limit.source.endswith("jobs/memory.limit_in_bytes)")


def test_cgroup_v2_ancestor_below_the_leaf_in_a_mounted_subtree(tmp_path: Path) -> None:
    # A container's mount shows its own group (/kubepods/pod1) at the mount point, while
    # /proc/self/cgroup names the full path: the groups are found through mountinfo.
    point = tmp_path / "sys fs cgroup"  # a space: mountinfo writes it as \040
    leaf = point / "ctr" / "app"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text(f"{5 * 2**30}\n")
    (point / "ctr" / "memory.max").write_text(f"{2 * 2**30}\n")
    (point / "memory.max").write_text(f"{6 * 2**30}\n")
    escaped = str(point).replace(" ", "\\040")
    mountinfo = (
        "22 1 0:20 / /proc rw,nosuid - proc proc rw\n"
        f"31 23 0:28 /kubepods/pod1 {escaped} rw,nosuid shared:9 - cgroup2 cgroup2 rw\n"
    )
    proc = _proc(tmp_path, "0::/kubepods/pod1/ctr/app\n", mountinfo=mountinfo)
    limit = host_limit(point, proc)
    assert limit.bytes == 2 * 2**30 and limit.source == f"the cgroup limit ({point}/ctr/memory.max)"
    (point / "ctr" / "memory.max").write_text("max\n")
    assert host_limit(point, proc).bytes == 5 * 2**30  # now the leaf's own is the smallest


def test_without_cgroup_or_procfs(tmp_path: Path) -> None:
    assert host_limit(tmp_path / "cg", _proc(tmp_path, "")).bytes == 8 * 2**30
    assert host_limit(tmp_path / "cg", tmp_path / "no-proc") is None


def test_train_flags_give_the_config_and_its_overrides() -> None:
    args = ["--mode", "adaqp", "--epochs", "2", "--set", "model.hidden=128", "--set=a.b=1"]
    assert train_overrides(args) == ["comm.mode=adaqp", "model.hidden=128", "a.b=1"]
    assert config_in(["--config", "c.toml", *args], "d.toml") == "c.toml"
    assert config_in(["--epochs", "2", "x.toml"], "d.toml") == "x.toml"
    assert config_in(args, "d.toml") == "d.toml"


def test_a_run_may_take_only_the_usable_share_of_a_limit() -> None:
    limit = HostLimit(10 * 2**30, "a test limit")
    assert 0.5 < USABLE_FRACTION < 1
    assert limit.usable_bytes == int(USABLE_FRACTION * 10 * 2**30)
    assert not limit.refuses(limit.usable_bytes)
    assert limit.refuses(limit.usable_bytes + 1) and limit.refuses(limit.bytes)


def test_the_refusal_is_one_line_with_the_need_the_limit_and_the_way_out() -> None:
    limit = HostLimit(5 * 2**30, "--memory-per-host")
    line = over_limit("host 1", 6 * 2**30, 3 * 2**30, 2, limit, "c.toml", 4)
    assert "\n" not in line
    assert line.startswith(
        "host 1 needs 6.00 GiB by the memory estimate (2 workers, the largest 3.00 GiB"
    )
    share = f"{limit.usable_bytes / 2**30:.2f} GiB a run may take: {USABLE_FRACTION:.0%} of"
    assert f"over the {share} its 5.0 GiB (--memory-per-host)" in line
    assert line.endswith("--no-memory-check to run anyway")
