"""``python -m adaqp.cluster``: bad values fail early, signals tear down, a real job trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaqp.emulate import main
from adaqp.emulate.cli import log_dir_for
from tests.emulate.helpers import (
    ENDLESS,
    _groups,
    _namespaces,
    _remove,
    _root_links,
    needs_cgroups,
    needs_root,
)

ROOT = Path(__file__).resolve().parents[2]


def _spawn_cli(args: list[str], tmp_path: Path, sigint_ignored: bool = False):
    """Starts ``python -m adaqp.cluster`` with SIGINT at its default action (as a shell
    gives a foreground job) or ignored (as a non-interactive shell gives a background
    job), whatever this test process itself inherited."""
    cmd = [
        *(sys.executable, "-m", "adaqp.cluster", *args),
        *("--log-dir", str(tmp_path / "logs"), "--", *ENDLESS),
        *("--set", f"partition.dir={tmp_path / 'p'}", "--out", str(tmp_path / "run")),
    ]
    # A handled signal is reset to its default action by exec, an ignored one stays ignored.
    wanted = signal.SIG_IGN if sigint_ignored else signal.default_int_handler
    previous = signal.signal(signal.SIGINT, wanted)
    try:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_and_check(proc: subprocess.Popen, sig: int, bound_s: float) -> str:
    """Sends ``sig``; the process must exit within ``bound_s`` leaving nothing behind."""
    tag = str(proc.pid % 100000)
    proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        _remove(tag)
        pytest.fail(f"still running {bound_s:.0f}s after signal {sig}:\n{out}")
    assert _namespaces(tag) == [], out
    assert _root_links(tag) == [], out
    assert _groups(tag) == [], out  # the hosts' control groups (default CPU budget)
    return out


def _main(argv: list[str]):
    """``main(argv)``, with the signal handlers it installs put back afterwards."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return main(argv)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_cli_rejects_a_wrong_count_before_touching_anything(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _main(["--hosts", "4", "--bandwidth", "300mbit,75mbit", "--", "--epochs", "1"])
    assert exit_info.value.code == 2
    assert "bandwidth has 2 values for 4 hosts" in capsys.readouterr().err


def _no_cgroups(monkeypatch) -> None:
    """As root on a machine without the control groups that host budgets need."""
    from adaqp.emulate import cgroups

    def missing():
        raise cgroups.CgroupError("this machine mounts no cpu and memory control groups")

    monkeypatch.setattr(cgroups, "find_cgroups", missing)
    monkeypatch.setattr("adaqp.emulate.cli.os.geteuid", lambda: 0)


def test_cli_refuses_a_budget_the_machine_cannot_enforce(tmp_path, monkeypatch, caplog):
    _no_cgroups(monkeypatch)
    monkeypatch.chdir(tmp_path)  # where the default log folder would go
    # The memory estimate would refuse 200m first: this test is about the control groups.
    argv = ["--hosts", "2", "--memory-per-host", "200m", "--no-memory-check"]
    code = _main([*argv, "--", "--epochs", "1"])
    assert code == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "cannot enforce the per-host budgets: this machine mounts no cpu and memory control groups"
    ]
    # No empty results/runs/cluster-logs, which would send the next job to -v2.
    assert list(tmp_path.iterdir()) == []


def test_a_refused_job_makes_no_log_folder_and_keeps_the_earlier_logs(tmp_path, monkeypatch):
    _no_cgroups(monkeypatch)
    budget = ["--hosts", "2", "--memory-per-host", "200m", "--no-memory-check"]
    fresh = tmp_path / "fresh"
    assert _main([*budget, "--log-dir", str(fresh), "--", "--epochs", "1"]) == 2
    assert not fresh.exists()
    # --overwrite removes an earlier job's logs only once this job starts.
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "cluster.json").write_text("{}")
    (earlier / "host0.log").write_text("host 0\n")
    overwrite = [*budget, "--log-dir", str(earlier), "--overwrite"]
    assert _main([*overwrite, "--", "--epochs", "1"]) == 2
    assert sorted(p.name for p in earlier.iterdir()) == ["cluster.json", "host0.log"]


@needs_root
@pytest.mark.parametrize(
    ("sig", "sigint_ignored"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["ctrl-c", "sigterm", "ctrl-c-inherited-ignored"],
)
def test_interrupt_tears_down(sig, sigint_ignored, tmp_path):
    # ctrl-c-inherited-ignored: started from a script in the background, the process
    # inherits SIGINT ignored; a SIGINT sent to it must still stop the run (it used to be
    # dropped, and the run went on until its timeout).
    proc = _spawn_cli(["--hosts", "2", "--timeout", "120"], tmp_path, sigint_ignored)
    tag = str(proc.pid % 100000)
    deadline = time.monotonic() + 60
    while len(_namespaces(tag)) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    try:
        assert len(_namespaces(tag)) == 3, "the cluster never came up"
        time.sleep(1.0)
        out = _stop_and_check(proc, sig, bound_s=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _remove(tag)
    assert proc.returncode == 130, out
    assert "torn down" in out


@needs_root
@pytest.mark.parametrize(
    ("sig", "moment"),
    [
        pytest.param(signal.SIGINT, 0.2, id="ctrl-c-0.2s"),
        pytest.param(signal.SIGINT, 0.5, id="ctrl-c-0.5s"),
        pytest.param(signal.SIGINT, 1.0, id="ctrl-c-1s"),
        pytest.param(signal.SIGINT, 2.0, id="ctrl-c-2s"),
        pytest.param(signal.SIGINT, "second namespace", id="ctrl-c-building"),
        pytest.param(signal.SIGTERM, 0.5, id="sigterm-0.5s"),
        pytest.param(signal.SIGTERM, "second namespace", id="sigterm-building"),
    ],
)
def test_interrupt_while_hosts_come_up(sig, moment, tmp_path):
    # Before main() installs its handlers the default action ends the process (there is
    # nothing to remove yet); from then on the run must stop with 130 and tear down.
    proc = _spawn_cli(["--hosts", "3", "--timeout", "120"], tmp_path)
    tag = str(proc.pid % 100000)
    try:
        if moment == "second namespace":  # mid-way through building the hosts
            deadline = time.monotonic() + 60
            while len(_namespaces(tag)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            time.sleep(moment)
        out = _stop_and_check(proc, sig, bound_s=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _remove(tag)
    assert proc.returncode in (130, -sig), out
    if proc.returncode == 130:
        assert "torn down" in out


def _run_cli(cluster_args: list[str], train_args: list[str], logs: Path, timeout: float):
    """``python -m adaqp.cluster CLUSTER_ARGS --log-dir LOGS -- TRAIN_ARGS`` to its end."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "adaqp.cluster", *cluster_args),
            *("--log-dir", str(logs), "--", *train_args),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@needs_root
@pytest.mark.slow
def test_two_hosts_with_two_workers_each_train(tmp_path):
    proc = _run_cli(
        ["--hosts", "2", "--procs-per-host", "2", "--bandwidth", "500mbit,200mbit"]
        + ["--timeout", "240"],
        ["--config", "configs/cora-gcn.toml", "--epochs", "3", "--mode", "vanilla"]
        + ["--set", f"partition.dir={tmp_path / 'p'}", "--out", str(tmp_path / "run")],
        tmp_path / "logs",
        timeout=300,
    )
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("host*.log")))
    assert proc.returncode == 0, proc.stderr + logs
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 4
    # Rank 0's result line is shown, not only left in host0.log.
    assert f"P=4: test acc {summary['test_acc_at_best_val']:.4f}" in proc.stdout, proc.stdout
    spec = json.loads((tmp_path / "logs" / "cluster.json").read_text())
    assert (spec["world_size"], [h["procs"] for h in spec["hosts"]]) == (4, [2, 2])
    assert [h["bandwidth"] for h in spec["hosts"]] == ["500mbit", "200mbit"]


@needs_root
def test_a_failing_job_shows_the_workers_error(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "host2.log").write_text("error: from an earlier, larger run\n")
    proc = _run_cli(
        ["--hosts", "2", "--timeout", "120"],
        ["--config", "configs/cora-gcn.toml", "--mode", "warp"],
        tmp_path / "logs",
        timeout=180,
    )
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    # Both hosts' workers refused the flag: one line, and none from another run's log.
    assert errors == [
        "error: --mode (comm.mode): must be one of vanilla, adaqp-q, adaqp-p, adaqp, "
        "adaqp-s, onebit, nocomm, not 'warp'"
    ], proc.stderr


@needs_root
@needs_cgroups
@pytest.mark.slow
def test_cpu_budget_holds_and_running_out_of_memory_fails_clearly(tmp_path):
    train = ["--config", "configs/cora-gcn.toml", "--mode", "vanilla"]
    train += ["--set", f"partition.dir={tmp_path / 'p'}", "--out", str(tmp_path / "run")]
    train += ["--set", "checkpoint.every=1"]
    proc = _run_cli(
        ["--hosts", "2", "--cpus-per-host", "0.25", "--timeout", "240"],
        [*train, "--epochs", "2"],
        tmp_path / "logs",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    spec = json.loads((tmp_path / "logs" / "cluster.json").read_text())
    assert spec["elapsed_s"] > 0
    for host in spec["hosts"]:
        assert (host["cpus"], host["memory_limit_bytes"], host["oom_kills"]) == (0.25, None, 0)
        # Two hosts alone could take a core each; the quota holds each to a quarter.
        assert 0.05 < host["cpu_seconds"] / spec["elapsed_s"] <= 0.29, spec
        assert host["peak_memory_bytes"] > 50 * 2**20
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints, "the first run wrote no checkpoints"

    # The same run continued with too little memory on host 1 (past the estimate, which
    # would refuse it before it starts): the job stops at once, one line names the host,
    # its limit and its peak, the checkpoints stay.
    started = time.monotonic()
    proc = _run_cli(
        ["--hosts", "2", "--memory-per-host", "0,200m", "--no-memory-check", "--timeout", "240"],
        [*train, "--epochs", "4", "--resume"],
        tmp_path / "logs2",
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - started < 120  # no waiting for a collective's timeout
    lines = [line for line in proc.stderr.splitlines() if "memory" in line]
    assert len(lines) == 1, proc.stderr
    assert "host 1 ran out of memory: limit 200 MiB, peak 20" in lines[0], lines
    spec = json.loads((tmp_path / "logs2" / "cluster.json").read_text())
    assert [h["memory_limit_bytes"] for h in spec["hosts"]] == [None, 200 * 2**20]
    assert spec["hosts"][1]["oom_kills"] >= 1
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == checkpoints


def test_each_job_gets_a_fresh_log_folder_and_an_earlier_jobs_is_never_replaced(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    first = log_dir_for(None)
    assert first == Path("results/runs/cluster-logs") and first.is_dir()
    for i in range(4):  # a job on 4 hosts
        (first / f"host{i}.log").write_text(f"host {i}\n")
    (first / "cluster.json").write_text("{}")
    assert log_dir_for(None) == Path("results/runs/cluster-logs-v2")
    assert log_dir_for(None) == Path("results/runs/cluster-logs-v3")
    assert sorted(p.name for p in first.iterdir()) == [
        "cluster.json",
        *(f"host{i}.log" for i in range(4)),
    ]

    # A named folder: refused while it holds a job's logs, unless --overwrite.
    with pytest.raises(ValueError, match="holds an earlier job's logs .*--overwrite"):
        log_dir_for(first)
    (first / "notes.txt").write_text("mine\n")
    assert log_dir_for(first, overwrite=True) == first
    assert sorted(p.name for p in first.iterdir()) == ["notes.txt"]  # no host2/3.log left
    assert log_dir_for(tmp_path / "new") == tmp_path / "new"
    assert log_dir_for(first) == first  # holds no cluster.json any more
    # --overwrite without --log-dir: the newest default folder, as runs' --overwrite.
    assert log_dir_for(None, overwrite=True) == Path("results/runs/cluster-logs-v3")


def test_cli_refuses_a_log_dir_that_holds_a_job_before_building_anything(
    tmp_path, monkeypatch, caplog
):
    from adaqp.emulate import cli

    def untouched(*args, **kwargs):
        raise AssertionError("the cluster was built")

    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli, "enforce", untouched)
    monkeypatch.setattr(cli, "EmulatedCluster", untouched)
    (tmp_path / "cluster.json").write_text("{}")
    code = _main(["--hosts", "2", "--log-dir", str(tmp_path), "--", "--epochs", "1"])
    assert code == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        f"--log-dir {tmp_path} holds an earlier job's logs (cluster.json): name another "
        "folder, leave --log-dir out for a fresh one, or add --overwrite"
    ]
