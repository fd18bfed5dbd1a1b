"""The host cost model's inputs: hosts from names, per-host rates from a pair profile."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from adaqp.assign import FULL_PRECISION_BITS, LinkModel
from adaqp.assign.profile import (
    FABRIC_PROBE_BYTES,
    fabric_probe,
    fabric_rate,
    host_model,
    hosts_from_names,
)
from adaqp.emulate.cgroups import Budget
from tests.emulate.helpers import _cgroup_tree, _tag, needs_cgroups


def test_hosts_are_numbered_by_first_appearance():
    assert hosts_from_names(["b", "a", "b", "c"]).tolist() == [0, 1, 0, 2]


def test_host_rates_come_from_the_pairs_that_leave_and_enter_each_host():
    """4 ranks on 2 hosts; host 1 sends at a quarter of the rate and receives at half."""
    hosts = np.array([0, 0, 1, 1])
    beta = np.full((4, 4), 100e6)
    beta[2:, :2] = 25e6  # leaving host 1
    beta[:2, 2:] = 50e6  # entering host 1
    beta[0, 1] = beta[1, 0] = beta[2, 3] = beta[3, 2] = 2e9  # within a host
    alpha = np.full((4, 4), 1e-4)
    alpha[0, 1] = alpha[1, 0] = alpha[2, 3] = alpha[3, 2] = 1e-6  # not the network's
    model = host_model(LinkModel(alpha, beta), hosts, {2: 1e-9}, {2: 2e-9})
    assert model.beta_out_Bps.tolist() == [50e6, 25e6]
    assert model.beta_in_Bps.tolist() == [25e6, 50e6]
    assert model.beta_local_Bps == pytest.approx(2e9)
    assert model.alpha_s == pytest.approx(1e-4)
    assert model.quant_s_per_value[FULL_PRECISION_BITS] == 0.0
    assert model.dequant_s_per_value[2] == 2e-9


def test_one_host_copies_locally_at_the_latency_of_local_copies():
    model = host_model(
        LinkModel(np.full((2, 2), 1e-5), np.full((2, 2), 1e9)), np.array([0, 0]), {}, {}
    )
    assert model.alpha_s == pytest.approx(1e-5) and model.beta_local_Bps == pytest.approx(1e9)


def test_fabric_probe_keeps_every_nic_about_equally_busy():
    """2 hosts x 2 ranks at one rate; then 4 hosts, host 3 at a quarter of the rate."""
    hosts = np.array([0, 0, 1, 1])
    volume = fabric_probe(hosts, np.full(2, 100e6), np.full(2, 100e6))
    assert volume[0, 1] == volume[2, 3] == 0  # within a host: no network
    assert np.diag(volume).sum() == 0
    assert (volume[:2, 2:] == FABRIC_PROBE_BYTES).all()
    hosts, rate = np.arange(4), np.array([100e6, 100e6, 100e6, 25e6])
    volume = fabric_probe(hosts, rate, rate)
    busy = np.maximum(volume.sum(1) / rate, volume.sum(0) / rate)
    assert busy.max() / busy.min() < 1.05  # the slow host does not set the time alone
    assert volume[0, 1] == FABRIC_PROBE_BYTES  # between fast hosts: the whole probe
    assert 0 < volume[3, 0] < FABRIC_PROBE_BYTES // 4


def test_fabric_rate_is_unbounded_unless_the_all_to_all_is_clearly_slower_than_the_nics():
    hosts = np.array([0, 1, 2])
    model = host_model(LinkModel(np.full((3, 3), 1e-3), np.full((3, 3), 100e6)), hosts, {}, {})
    volume = fabric_probe(hosts, model.beta_out_Bps, model.beta_in_Bps)
    total = volume.sum()  # every channel crosses hosts
    nics = 2 * FABRIC_PROBE_BYTES / 100e6  # each host sends (and receives) two probes
    assert fabric_rate(model, volume, model.alpha_s + nics) == math.inf
    assert fabric_rate(model, volume, model.alpha_s + 1.1 * nics) == math.inf  # noise
    assert fabric_rate(model, volume, model.alpha_s + 2 * nics) == pytest.approx(total / (2 * nics))
    # One host: nothing crosses the network.
    one = host_model(
        LinkModel(np.full((2, 2), 1e-5), np.full((2, 2), 1e9)), np.array([0, 0]), {}, {}
    )
    assert fabric_rate(one, np.zeros((2, 2), np.int64), 1.0) == math.inf


_TIME_QUANTIZATION = """
import os, sys
import torch
import torch.distributed as dist
from adaqp.assign.profile import time_quantization
from adaqp.runtime import World

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
world = World(0, 1, 0, 1, torch.device("cpu"), "gloo")
time_quantization((1, 2, 4, 8), 64, world)  # compiled, warm
for procs in sys.argv[2:]:  # into the group once started: its imports ran unthrottled
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
print(float(time_quantization((1, 2, 4, 8), 64, world)[2][0]))
dist.destroy_process_group()
"""


def _cpu_scale(tmp_path, name: str, procs: list) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _TIME_QUANTIZATION, str(tmp_path / name), *map(str, procs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return float(out.stdout.split()[-1])


@needs_cgroups
def test_a_cpu_quota_shows_in_the_sustained_rate(tmp_path):
    """A rank held to a fifth of a core (a host's budget in the emulated cluster) times its
    (de)quantization at about a fifth of the rate, sustained: its CPU scale is about 5 (a
    burst alone, within one quota period, reads about 1). The scale without a quota is
    reported, not compared: on a busy machine it is well above 1 too."""
    tree = _cgroup_tree()
    group = tree.group(f"aq{_tag(8)}-h0")
    try:
        group.create(Budget(cpus=0.2))
        held = _cpu_scale(tmp_path, "held", group.procs_files)
    finally:
        assert group.remove(timeout_s=10)
    assert held >= 2.5, (held, _cpu_scale(tmp_path, "free", []))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 8, 9])
def test_round_robin_meets_every_pair_once_in_rounds_of_disjoint_pairs(world_size):
    """P - 1 rounds of P / 2 pairs (P rounds for odd P): link profiling grows with P."""
    from adaqp.assign.profile import round_robin

    rounds = round_robin(world_size)
    met = [pair for pairs in rounds for pair in pairs]
    everyone = {(a, b) for a in range(world_size) for b in range(a + 1, world_size)}
    assert sorted(met) == sorted(everyone)  # each pair once, lower rank first
    for pairs in rounds:
        ranks = [rank for pair in pairs for rank in pair]
        assert len(ranks) == len(set(ranks))  # disjoint: they run at once
    assert len(rounds) == (0 if world_size == 1 else world_size - 1 + world_size % 2)
