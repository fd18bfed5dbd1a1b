"""The host cost model's inputs: hosts from names, per-host rates from a pair profile."""

from __future__ import annotations

import math

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
