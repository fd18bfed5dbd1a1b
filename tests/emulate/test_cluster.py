"""EmulatedCluster: hosts talk over their links, jobs run, and everything goes away again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adaqp.emulate import ClusterError, EmulatedCluster, LinkSpec, host_links
from adaqp.emulate import cluster as cluster_module
from adaqp.emulate.cgroups import (
    Budget,
    CgroupTree,
    CgroupV1,
    CgroupV2,
    HostGroup,
    host_budgets,
)
from adaqp.process.cores import usable_cores
from tests.emulate.fake_cgroupfs import FakeCgroupV2
from tests.emulate.helpers import (
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


def _fake_cluster(tmp_path, monkeypatch, budgets: list[Budget], version=2) -> EmulatedCluster:
    """A cluster whose hosts' groups go in a fake cgroup hierarchy (v2: the kernel's rules
    enforced; v1: plain folders); a failed host is reported at once."""
    if version == 2:
        tree = CgroupV2(FakeCgroupV2(tmp_path / "cgroup2", monkeypatch).group("session"))
    else:
        dirs = [tmp_path / "v1" / c for c in ("cpu", "cpuacct", "memory")]
        for d in dirs:
            d.mkdir(parents=True)
        tree = CgroupV1(*dirs)
    monkeypatch.setattr(cluster_module, "_GRACE_S", 0.0)
    return EmulatedCluster(len(budgets), budgets=budgets, cgroups=tree, tag="12345")


def _failed_job(cluster: EmulatedCluster, log: Path) -> None:
    """A host job (torchrun) that has failed."""
    job = subprocess.Popen(["sh", "-c", "exit 1"], start_new_session=True)
    cluster._jobs.append((job, open(log, "w")))  # noqa: SIM115 - closed by _stop_jobs


def test_usage_is_read_once_every_process_of_a_host_is_gone(tmp_path, monkeypatch):
    cluster = _fake_cluster(tmp_path, monkeypatch, [Budget(cpus=0.5)])
    workers = []

    def start_host(i, procs_per_host, train_args, log_dir, spec):
        # torchrun fails while its worker, in a session of its own, runs on.
        workers.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        (cluster._groups[i].dirs[0] / "cgroup.procs").write_text(str(workers[-1].pid))
        _failed_job(cluster, log_dir / f"host{i}.log")

    read_with = []
    usage = HostGroup.usage
    monkeypatch.setattr(cluster, "_start_host", start_host)
    monkeypatch.setattr(HostGroup, "usage", lambda g: read_with.append(g.pids()) or usage(g))
    try:
        with pytest.raises(ClusterError, match="host 0 exited with 1"):
            cluster.launch(1, [], tmp_path / "logs", timeout_s=30)
        assert read_with[-1] == set()  # cluster.json's counters: no process left to add to them
        assert workers[0].wait(timeout=10) == -9
    finally:
        for w in workers:
            w.kill()
            w.wait()
    spec = json.loads((tmp_path / "logs" / "cluster.json").read_text())
    assert spec["hosts"][0]["cpu_seconds"] == 0.0


@pytest.mark.parametrize("oom_kills", [0, 1])
@pytest.mark.parametrize("version", [1, 2])
def test_out_of_memory_is_the_kernels_count_not_a_peak_near_the_limit(
    tmp_path, monkeypatch, version, oom_kills
):
    limit = 200 * 2**20
    cluster = _fake_cluster(tmp_path, monkeypatch, [Budget(memory_bytes=limit)], version)
    cluster._make_groups()
    group = cluster._groups[0]
    peak = str(int(0.98 * limit))  # page cache fills any limit: no sign of a kill
    if version == 1:
        memory = group.dirs[2]
        (memory / "memory.max_usage_in_bytes").write_text(peak)
        (memory / "memory.oom_control").write_text(
            f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kills}\n"
        )
        (memory / "memory.failcnt").write_text("4821")  # reached the limit, reclaimed
    else:
        (group.dirs[0] / "memory.peak").write_text(peak)
        (group.dirs[0] / "memory.events").write_text(f"max 4821\noom 0\noom_kill {oom_kills}\n")
    _failed_job(cluster, tmp_path / "host0.log")
    with pytest.raises(ClusterError) as failed:
        cluster._wait(tmp_path, timeout_s=30)
    cluster._stop_jobs()  # reaps the job (the groups stay: tmp_path goes)
    if oom_kills:
        assert str(failed.value) == (
            "host 0 ran out of memory: limit 200 MiB, peak 196 MiB (the kernel killed 1 of its "
            f"processes); raise --memory-per-host; see {tmp_path}/host<i>.log"
        )
    else:
        assert str(failed.value) == f"host 0 exited with 1; see {tmp_path}/host0.log"


def test_messages_count_hosts_in_words():
    with pytest.raises(ValueError, match="2 specs for 1 host$"):
        EmulatedCluster(1, links=host_links(2, "1gbit"))
    with pytest.raises(ValueError, match="has 2 values for 1 host:"):
        host_links(1, "1gbit,2gbit")
