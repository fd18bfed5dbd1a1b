"""The host cost model's inputs: hosts from names, per-host rates from a pair profile."""

from __future__ import annotations

import numpy as np
import pytest

from adaqp.assigner import FULL_PRECISION_BITS, LinkModel
from adaqp.hosts import host_model, hosts_from_names


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
