"""EmulatedCluster: hosts talk over their links, jobs run, and everything goes away again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from adaqp.bench.emulate import ClusterError, EmulatedCluster, LinkSpec, host_links
from adaqp.bench.emulate.cgroups import Budget, CgroupTree, host_budgets
from adaqp.cores import usable_cores
from tests.bench.emulate.helpers import (
    ENDLESS,
    _cgroup_tree,
    _groups,
    _namespaces,
    _qdiscs,
    _root_links,
    _tag,
    needs_cgroups,
    needs_root,
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


def test_workers_threads_follow_the_host_cpu_budget(tmp_path):
    fake = CgroupTree(2, (tmp_path,))
    budgets = [Budget(0.25), Budget(2.5), Budget(None, 2**30)]
    cluster = EmulatedCluster(3, budgets=budgets, cgroups=fake, tag="12345")
    assert [cluster.threads(i, 1) for i in range(3)] == [1, 3, max(1, usable_cores() // 3)]
    assert [cluster.threads(i, 2) for i in range(3)] == [1, 2, max(1, usable_cores() // 6)]
    spec = cluster.describe()
    assert [h["cpus"] for h in spec["hosts"]] == [0.25, 2.5, None]
    assert [h["memory_limit_bytes"] for h in spec["hosts"]] == [None, None, 2**30]
    assert spec["elapsed_s"] is None and spec["hosts"][0]["cpu_seconds"] is None
    with pytest.raises(ValueError, match="budgets need control groups"):
        EmulatedCluster(3, budgets=budgets)
    with pytest.raises(ValueError, match="2 for 3 hosts"):
        EmulatedCluster(3, budgets=budgets[:2], cgroups=fake)


@needs_root
@needs_cgroups
def test_timeout_with_budgets_records_usage_and_removes_the_groups(tmp_path):
    tag = _tag(8)
    cluster = EmulatedCluster(
        2, budgets=host_budgets(2, "0.5", "2g"), cgroups=_cgroup_tree(), tag=tag
    )
    with pytest.raises(ClusterError, match="ran past"), cluster:
        cluster.launch(
            1,
            [*ENDLESS, "--set", f"partition.dir={tmp_path / 'p'}", "--out", str(tmp_path / "r")],
            tmp_path / "logs",
            timeout_s=4,
        )
    assert (_namespaces(tag), _groups(tag)) == ([], [])
    spec = json.loads((tmp_path / "logs" / "cluster.json").read_text())
    assert 4 <= spec["elapsed_s"] < 10
    for host in spec["hosts"]:
        assert (host["cpus"], host["memory_limit_bytes"]) == (0.5, 2 * 2**30)
        assert 0 < host["cpu_seconds"] <= 0.55 * spec["elapsed_s"]
        assert host["peak_memory_bytes"] > 0 and host["oom_kills"] == 0
