"""Shaped links: one spec per host from command-line values, and tc on both link ends."""

from __future__ import annotations

import re

import pytest

from adaqp.emulate import ClusterError, EmulatedCluster, LinkSpec, host_links
from tests.emulate.helpers import _namespaces, _qdiscs, _tag, needs_root


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
