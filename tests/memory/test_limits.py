"""The host's memory: cgroup v2 and v1 limits, else MemTotal; the refusal's line."""

from __future__ import annotations

from pathlib import Path

from adaqp.memory.limits import HostLimit, config_in, host_limit, over_limit, train_overrides


def _proc(tmp_path: Path, cgroup: str, mem_total_kb: int = 8 * 2**20) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "meminfo").write_text(f"MemTotal:       {mem_total_kb} kB\nMemFree: 1 kB\n")
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


def test_without_cgroup_or_procfs(tmp_path: Path) -> None:
    assert host_limit(tmp_path / "cg", _proc(tmp_path, "")).bytes == 8 * 2**30
    assert host_limit(tmp_path / "cg", tmp_path / "no-proc") is None


def test_train_flags_give_the_config_and_its_overrides() -> None:
    args = ["--mode", "adaqp", "--epochs", "2", "--set", "model.hidden=128", "--set=a.b=1"]
    assert train_overrides(args) == ["comm.mode=adaqp", "model.hidden=128", "a.b=1"]
    assert config_in(["--config", "c.toml", *args], "d.toml") == "c.toml"
    assert config_in(["--epochs", "2", "x.toml"], "d.toml") == "x.toml"
    assert config_in(args, "d.toml") == "d.toml"


def test_the_refusal_is_one_line_with_the_need_the_limit_and_the_way_out() -> None:
    line = over_limit(
        "host 1", 6 * 2**30, 3 * 2**30, 2, HostLimit(5 * 2**30, "--memory-per-host"), "c.toml", 4
    )
    assert "\n" not in line
    assert line.startswith(
        "host 1 needs 6.0 GiB by the memory estimate (2 workers, the largest 3.00 GiB"
    )
    assert "over its 5.0 GiB (--memory-per-host)" in line and line.endswith(
        "--no-memory-check to run anyway"
    )
