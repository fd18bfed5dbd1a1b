"""The emulated cluster: hosts and shaped links come up, and always go away again."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaqp.bench.emulate import ClusterError, EmulatedCluster, LinkSpec, _ip, host_links, main

ROOT = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the emulated cluster needs root and iproute2 (ip, tc); not available here",
)

LISTEN = (
    "import socket,sys; s=socket.socket(); s.bind(('{addr}', 7000)); s.listen(); "
    "c,_=s.accept(); c.sendall(b'ok'); c.close()"
)
CONNECT = (
    "import socket,time\n"
    "for _ in range(50):\n"
    "    try:\n"
    "        c=socket.create_connection(('{addr}', 7000), timeout=2); break\n"
    "    except OSError: time.sleep(0.1)\n"
    "print(c.recv(2).decode())"
)
# A job that would run for hours: only a signal or the timeout ends it.
ENDLESS = ["--epochs", "100000"]


def _tag(n: int) -> str:
    """A tag of this test process's own, so that concurrent test runs never share names."""
    return str(10000 + (os.getpid() % 8999) * 10 + n)


def _namespaces(tag: str) -> list[str]:
    out = _ip("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"aq{tag}-")]


def _root_links(tag: str) -> list[str]:
    """Links named after the cluster in the machine's own namespace (there must be none)."""
    out = _ip("ip", "-o", "link", "show", check=False).stdout
    return re.findall(rf"^\d+: (aq{tag}\w*)", out, flags=re.MULTILINE)


def _remove(tag: str) -> None:
    """Clean up after a failed test, so that one failure does not leak into the machine."""
    for ns in _namespaces(tag):
        for pid in _ip("ip", "netns", "pids", ns, check=False).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        _ip("ip", "netns", "del", ns, check=False)


def _qdiscs(ns: str, dev: str) -> str:
    return _ip("tc", "qdisc", "show", "dev", dev, ns=ns).stdout


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
    return out


def test_host_links_one_value_for_all_or_one_per_host():
    same = host_links(3, "200mbit", "0.1ms")
    assert same == [LinkSpec("200mbit", "0.1ms", "")] * 3
    mixed = host_links(4, "300mbit,300mbit,300mbit,75mbit", "1ms, 1ms, 2ms, 50us", "0.1%")
    assert [s.bandwidth for s in mixed] == ["300mbit"] * 3 + ["75mbit"]
    assert [s.bits_per_s for s in mixed] == [3e8] * 3 + [7.5e7]
    assert [s.latency_s for s in mixed] == pytest.approx([1e-3, 1e-3, 2e-3, 5e-5])
    assert [s.loss_fraction for s in mixed] == pytest.approx([1e-3] * 4)
    assert LinkSpec("10MBps").bits_per_s == 8e7  # tc's bps means bytes per second
    assert LinkSpec("").bits_per_s is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bandwidth": "300mbit,75mbit"}, "bandwidth has 2 values for 4 hosts"),
        ({"bandwidth": "1gbit,1gbit,1gbit,1gbit,1gbit"}, "bandwidth has 5 values for 4 hosts"),
        ({"latency": "1ms,2ms,3ms"}, "latency has 3 values for 4 hosts"),
        ({"bandwidth": "100"}, "bandwidth: cannot read '100'"),
        ({"bandwidth": "1gbit,fast,1gbit,1gbit"}, "bandwidth: cannot read 'fast'"),
        ({"latency": "5"}, "latency: cannot read '5'"),
        ({"loss": "150%"}, "loss: '150%' must lie between"),
    ],
)
def test_host_links_rejects_a_wrong_count_or_value(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        host_links(4, **kwargs)


def test_cluster_holds_one_spec_per_host_and_describes_itself():
    uniform = EmulatedCluster(3, LinkSpec("200mbit"), tag="12345")
    assert uniform.links == [LinkSpec("200mbit")] * 3
    assert uniform.link == LinkSpec("200mbit")
    with pytest.raises(ValueError, match="2 specs for 3 hosts"):
        EmulatedCluster(3, links=host_links(2, "1gbit"))
    mixed = EmulatedCluster(2, links=host_links(2, "300mbit,75mbit", "1ms,"), tag="12345")
    spec = mixed.describe(procs_per_host=2)
    assert (spec["num_hosts"], spec["procs_per_host"], spec["world_size"]) == (2, 2, 4)
    assert [h["bandwidth_bits_per_s"] for h in spec["hosts"]] == [3e8, 7.5e7]
    assert [h["latency_s"] for h in spec["hosts"]] == [1e-3, 0.0]
    assert [h["address"] for h in spec["hosts"]] == ["10.213.95.1", "10.213.95.2"]
    assert spec["rendezvous"] == "10.213.95.1:29400"
    json.dumps(spec)  # plain data


def test_cli_rejects_a_wrong_count_before_touching_anything(capsys):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["--hosts", "4", "--bandwidth", "300mbit,75mbit", "--", "--epochs", "1"])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert exit_info.value.code == 2
    assert "bandwidth has 2 values for 4 hosts" in capsys.readouterr().err


@needs_root
def test_hosts_talk_over_shaped_links_and_everything_is_removed():
    tag = _tag(1)
    cluster = EmulatedCluster(2, LinkSpec(bandwidth="200mbit"), tag=tag)
    with cluster:
        assert sorted(_namespaces(tag)) == [f"aq{tag}-h0", f"aq{tag}-h1", f"aq{tag}-sw"]
        assert _root_links(tag) == []  # both ends of every pair live in the namespaces
        qdisc = _qdiscs(cluster.host_ns(0), "eth0")
        assert "tbf" in qdisc and "200Mbit" in qdisc
        server = subprocess.Popen(
            [
                *("ip", "netns", "exec", cluster.host_ns(0), sys.executable, "-c"),
                LISTEN.format(addr=cluster.address(0)),
            ]
        )
        try:
            reply = subprocess.run(
                [
                    *("ip", "netns", "exec", cluster.host_ns(1), sys.executable, "-c"),
                    CONNECT.format(addr=cluster.address(0)),
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            assert reply.stdout.strip() == "ok"
        finally:
            server.kill()
            server.wait()
    assert _namespaces(tag) == []


@needs_root
def test_each_host_gets_its_own_rate_in_both_directions():
    tag = _tag(2)
    rates = ["300Mbit", "300Mbit", "75Mbit"]
    cluster = EmulatedCluster(3, links=host_links(3, "300mbit,300mbit,75mbit"), tag=tag)
    with cluster:
        for i, rate in enumerate(rates):
            for ns, dev in ((cluster.host_ns(i), "eth0"), (cluster.switch, f"aq{tag}s{i}")):
                qdisc = _qdiscs(ns, dev)
                assert re.search(rf"tbf .*rate {rate}\b", qdisc), (i, ns, qdisc)
                others = set(rates) - {rate}
                assert not any(f"rate {r}" in qdisc for r in others), (i, ns, qdisc)
    assert _namespaces(tag) == []


@needs_root
def test_per_host_latency_or_a_clear_error_without_netem():
    tag = _tag(3)
    cluster = EmulatedCluster(2, links=host_links(2, "1gbit", "2ms,7ms"), tag=tag)
    try:
        with cluster:
            for i, delay in enumerate(["2ms", "7ms"]):
                for ns, dev in ((cluster.host_ns(i), "eth0"), (cluster.switch, f"aq{tag}s{i}")):
                    qdisc = _qdiscs(ns, dev)
                    assert f"delay {delay}" in qdisc and "rate 1Gbit" in qdisc, qdisc
    except ClusterError as exc:
        assert "netem" in str(exc)
        assert _namespaces(tag) == [], "a failed start must tear down what it built"
        pytest.skip("this kernel has no netem qdisc; the clear error and teardown held")
    assert _namespaces(tag) == []


@needs_root
def test_failed_job_tears_down_and_describes_the_cluster(tmp_path):
    tag = _tag(4)
    cluster = EmulatedCluster(2, links=host_links(2, "1gbit,100mbit"), tag=tag)
    with pytest.raises(ClusterError, match="exited with"), cluster:
        cluster.launch(1, ["--set", "model.bogus=1"], tmp_path / "logs", timeout_s=120)
    assert _namespaces(tag) == []
    logs = [(tmp_path / "logs" / f"host{i}.log").read_text() for i in range(2)]
    assert any("model.bogus" in log for log in logs), logs
    spec = json.loads((tmp_path / "logs" / "cluster.json").read_text())
    assert [h["bandwidth"] for h in spec["hosts"]] == ["1gbit", "100mbit"]


@needs_root
def test_timeout_stops_the_job_and_tears_down(tmp_path):
    tag = _tag(5)
    cluster = EmulatedCluster(2, LinkSpec(bandwidth="1gbit"), tag=tag)
    with pytest.raises(ClusterError, match="ran past"), cluster:
        cluster.launch(
            1,
            [*ENDLESS, "--set", f"partition.dir={tmp_path / 'p'}", "--out", str(tmp_path / "r")],
            tmp_path / "logs",
            timeout_s=3,
        )
    assert _namespaces(tag) == []


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


@needs_root
@pytest.mark.slow
def test_two_hosts_with_two_workers_each_train(tmp_path):
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "adaqp.cluster", "--hosts", "2", "--procs-per-host", "2"),
            *("--bandwidth", "500mbit,200mbit", "--timeout", "240"),
            *("--log-dir", str(tmp_path / "logs"), "--"),
            *("--config", "configs/cora-gcn.toml", "--epochs", "3", "--mode", "vanilla"),
            *("--set", f"partition.dir={tmp_path / 'p'}", "--out", str(tmp_path / "run")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("host*.log")))
    assert proc.returncode == 0, proc.stderr + logs
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 4
    spec = json.loads((tmp_path / "logs" / "cluster.json").read_text())
    assert (spec["world_size"], [h["procs"] for h in spec["hosts"]]) == (4, [2, 2])
    assert [h["bandwidth"] for h in spec["hosts"]] == ["500mbit", "200mbit"]
