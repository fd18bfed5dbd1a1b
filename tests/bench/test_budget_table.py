"""``python -m adaqp.bench cluster``'s per-host usage: read from each run's cluster.json,
averaged over seeds, shown in cluster.md."""

from __future__ import annotations

import pytest

from adaqp.bench.cluster import _host_usage
from adaqp.bench.cluster_table import _host_usage_lines


def _cluster(elapsed: float, cpu: list[float], peaks: list[int]) -> dict:
    hosts = [
        {"host": i, "cpus": 0.5, "memory_limit_bytes": None if i else 2**30}
        | {"cpu_seconds": c, "peak_memory_bytes": p}
        for i, (c, p) in enumerate(zip(cpu, peaks, strict=True))
    ]
    return {"elapsed_s": elapsed, "hosts": hosts}


def test_host_usage_means_over_seeds_and_the_highest_peak():
    seeds = [_cluster(10.0, [4.0, 2.0], [300 << 20, 200 << 20])]
    seeds.append(_cluster(20.0, [6.0, 4.0], [400 << 20, 100 << 20]))
    seeds.append({})  # an older run, without the hosts' usage: left out
    usage = _host_usage(seeds)
    assert [u["cpu_seconds"] for u in usage] == [5.0, 3.0]
    assert [u["cpu_share"] for u in usage] == pytest.approx([0.35, 0.2])
    assert [u["peak_memory_bytes"] for u in usage] == [400 << 20, 200 << 20]
    assert [u["memory_limit_bytes"] for u in usage] == [2**30, None]
    assert usage[0]["elapsed_s"] == 15.0
    unmeasured = _cluster(10.0, [None, None], [None, None])
    assert _host_usage([unmeasured, {}]) == []

    lines = _host_usage_lines({"vanilla": {"hosts": usage}, "nocomm": {"hosts": []}})
    assert "Budgets: host 0 0.5 CPU, 1024 MiB; host 1 0.5 CPU, memory unlimited." in lines[1]
    assert lines[3].startswith("| mode | wall s | host 0 CPU s (cores) | host 1 CPU s (cores)")
    assert lines[-1] == "| vanilla | 15.0 | 5.0 (0.35) | 3.0 (0.20) | 400 | 200 |"
    assert _host_usage_lines({"vanilla": {"hosts": []}}) == []
