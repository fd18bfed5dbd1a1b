"""The emulated cluster: hosts and shaped links come up, and always go away again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaqp.cluster import ClusterError, EmulatedCluster, LinkSpec, _ip

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
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


def _namespaces(tag: str) -> list[str]:
    out = _ip("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"aq{tag}-")]


def test_hosts_talk_over_shaped_links_and_everything_is_removed():
    cluster = EmulatedCluster(2, LinkSpec(bandwidth="200mbit"), tag="90001")
    with cluster:
        assert sorted(_namespaces("90001")) == ["aq90001-h0", "aq90001-h1", "aq90001-sw"]
        qdisc = _ip("tc", "qdisc", "show", "dev", "eth0", ns=cluster.host_ns(0)).stdout
        assert "tbf" in qdisc and "200Mbit" in qdisc
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                cluster.host_ns(0),
                sys.executable,
                "-c",
                LISTEN.format(addr=cluster.address(0)),
            ]
        )
        try:
            reply = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    cluster.host_ns(1),
                    sys.executable,
                    "-c",
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
    assert _namespaces("90001") == []


def test_failed_job_tears_down(tmp_path):
    cluster = EmulatedCluster(2, LinkSpec(bandwidth="1gbit"), tag="90002")
    with pytest.raises(ClusterError, match="exited with"), cluster:
        cluster.launch(1, ["--set", "model.bogus=1"], tmp_path / "logs", timeout_s=120)
    assert _namespaces("90002") == []
    assert "model.bogus" in (tmp_path / "logs" / "host0.log").read_text()


def test_timeout_stops_the_job_and_tears_down(tmp_path):
    cluster = EmulatedCluster(2, LinkSpec(bandwidth="1gbit"), tag="90003")
    with pytest.raises(ClusterError, match="ran past"), cluster:
        cluster.launch(
            1,
            [
                "--epochs",
                "100000",
                "--set",
                f"partition.dir={tmp_path / 'p'}",
                "--out",
                str(tmp_path / "run"),
            ],
            tmp_path / "logs",
            timeout_s=3,
        )
    assert _namespaces("90003") == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_tears_down(sig, tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "adaqp.cluster",
            "--hosts",
            "2",
            "--timeout",
            "120",
            "--log-dir",
            str(tmp_path / "logs"),
            "--",
            "--epochs",
            "100000",
            "--set",
            f"partition.dir={tmp_path / 'p'}",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    tag = str(proc.pid % 100000)
    deadline = time.monotonic() + 60
    while len(_namespaces(tag)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_namespaces(tag)) == 3, "the cluster never came up"
    time.sleep(1.0)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "torn down" in out
    assert _namespaces(tag) == []


@pytest.mark.slow
def test_two_host_training_run(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaqp.cluster",
            "--hosts",
            "2",
            "--bandwidth",
            "500mbit",
            "--timeout",
            "240",
            "--log-dir",
            str(tmp_path / "logs"),
            "--",
            "--config",
            "configs/cora-gcn.toml",
            "--epochs",
            "3",
            "--set",
            f"partition.dir={tmp_path / 'p'}",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr + (tmp_path / "logs" / "host0.log").read_text()
    assert (tmp_path / "run" / "summary.json").exists()
