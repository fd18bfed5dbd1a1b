"""The cost models (adaqp.assign.costmodels): fitting a link, the link model, the host
model's validation and its exchange time against a hand computation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from adaqp.assign import (
    Channel,
    HostModel,
    LinkModel,
    evaluate_assignment,
    fit_alpha_beta,
    solve_assignment,
    uniform_assignment,
)


def test_fit_alpha_beta_recovers_parameters():
    rng = np.random.default_rng(8)
    alpha, beta = 25e-6, 3e9
    sizes = np.repeat(2.0 ** np.arange(10, 23), 5)
    times = (alpha + sizes / beta) * (1 + 0.02 * rng.standard_normal(sizes.size))
    fit_a, fit_b = fit_alpha_beta(sizes, times)
    assert fit_a == pytest.approx(alpha, rel=0.1) and fit_b == pytest.approx(beta, rel=0.03)
    # Exact data, including a zero intercept, is recovered exactly.
    fit_a, fit_b = fit_alpha_beta([1e3, 1e6], [1e3 / 1e9, 1e6 / 1e9])
    assert fit_a == pytest.approx(0, abs=1e-15) and fit_b == pytest.approx(1e9)


@pytest.mark.parametrize(
    "sizes, times",
    [([1e3, 1e3, 1e3], [1e-5, 2e-5, 3e-5]), ([1e3, 1e6], [1e-3, 1e-4]), ([1e3], [1e-5, 2e-5]),
     ([1e3, 1e6], [0.0, 1e-3]), ([1e3, np.nan], [1e-5, 1e-4])],
)  # fmt: skip
def test_fit_alpha_beta_rejects_degenerate_data(sizes, times):
    with pytest.raises(ValueError):
        fit_alpha_beta(sizes, times)


def test_link_model():
    lm = LinkModel(np.array([[np.inf, 1e-5], [2e-5, 0.0]]), np.array([[0.0, 1e9], [2e9, 0.0]]))
    assert lm.num_ranks == 2 and lm.time(0, 1, 0) == 0.0
    assert lm.time(1, 0, 4e9) == pytest.approx(2e-5 + 2.0)
    with pytest.raises(ValueError):
        LinkModel(np.array([[0, -1.0], [0, 0]]), np.ones((2, 2)))
    with pytest.raises(ValueError):
        LinkModel(np.zeros((2, 2)), np.array([[1.0, 0.0], [1.0, 1.0]]))


def test_host_evaluate_matches_hand_computation():
    # Ranks 0, 1 on host 0 and rank 2 on host 1; D = 4, so a row is 9 bytes at 2 bits, 10 at
    # 4, 12 at 8 and 16 at 32.
    channels = [
        Channel(0, 2, np.array([1.0, 2.0, 3.0])),  # inter-host, widths 2, 8, 32: 37 bytes
        Channel(1, 0, np.array([4.0, 5.0])),  # within host 0, widths 4, 32: 26 bytes
        Channel(2, 1, np.array([6.0])),  # inter-host, width 2: 9 bytes
    ]
    widths = [np.array([2, 8, 32]), np.array([4, 32]), np.array([2])]
    quant, dequant = {2: 0.01, 4: 0.02, 8: 0.03}, {2: 0.001, 4: 0.002, 8: 0.004}

    def model(beta_in):
        return HostModel([0, 0, 1], 0.5, [100.0, 50.0], beta_in, 100.0, quant, dequant)

    # host 0: out 37 / 100 = 0.37, in 9 / 200; rank 0: quantize 4 * (0.01 + 0.03) + dequantize
    # 4 * 0.002 = 0.168; rank 1: copy 26 / 100 + quantize 4 * 0.02 + dequantize 4 * 0.001 =
    # 0.344. host 1: out 9 / 50 = 0.18, in 37 / 25 = 1.48; rank 2: 4 * 0.01 + 4 * 0.005 = 0.06.
    _, var, t = evaluate_assignment(channels, 4, widths, model([200.0, 25.0]))
    assert t == pytest.approx(0.5 + 1.48 + 0.06)
    f2, f4, f8 = 1 / 9, 1 / 225, 1 / 255**2
    assert var == pytest.approx(1.0 * f2 + 2.0 * f8 + 4.0 * f4 + 6.0 * f2)
    # A fast receive NIC on host 1 leaves host 0, and its copying rank 1, as the bottleneck.
    _, _, t = evaluate_assignment(channels, 4, widths, model([200.0, 1000.0]))
    assert t == pytest.approx(0.5 + 0.37 + 0.344)
    # Nothing to send costs nothing, not even the latency.
    empty = [Channel(0, 2, np.zeros(0))]
    assert evaluate_assignment(empty, 4, [np.zeros(0)], model([1.0, 1.0]))[2] == 0.0
    # The assignment reports the same time.
    res = uniform_assignment(channels, 4, 32, link_model=model([200.0, 25.0]))
    assert res.time_s == pytest.approx(0.5 + 48 / 25)  # 3 rows of 16 bytes into host 1
    # A fabric carries the 37 + 9 bytes between hosts, not the 26 copied within host 0, after
    # the slowest rank's work (rank 1, 0.344 s): at 20 B/s 2.3 + 0.344 s, longer than every
    # host (1.48 + 0.06 s); at 40 B/s 1.15 + 0.344 s, shorter.
    slow_fabric = dataclasses.replace(model([200.0, 25.0]), fabric_Bps=20.0)
    _, _, t = evaluate_assignment(channels, 4, widths, slow_fabric)
    assert t == pytest.approx(0.5 + 46 / 20 + 0.344)
    fast_fabric = dataclasses.replace(model([200.0, 25.0]), fabric_Bps=40.0)
    _, _, t = evaluate_assignment(channels, 4, widths, fast_fabric)
    assert t == pytest.approx(0.5 + 1.48 + 0.06)


def test_host_and_fabric_times_are_each_hosts_busy_seconds_then_the_fabrics():
    """The public figure the solvers price width changes with: per host the busier NIC
    direction plus its slowest rank's work, then the fabric's; ``T`` is alpha plus the
    largest (the example of the hand computation above)."""
    model = HostModel([0, 0, 1], 0.5, [100.0, 50.0], [200.0, 25.0], 100.0, {}, {})
    use = np.zeros(model.num_resources)  # columns: send NICs, receive NICs, ranks, fabric
    use[[0, 1, 2, 3]] = [0.37, 9 / 200, 0.18, 1.48]
    use[[4, 5, 6]] = [0.168, 0.344, 0.06]
    times = model.host_and_fabric_times(use)
    assert times == pytest.approx([0.37 + 0.344, 1.48 + 0.06, 0.0 + 0.344])
    # Batched over leading axes, as the greedy prices every group's choices at once.
    batch = model.host_and_fabric_times(np.stack([use, 2 * use]))
    assert batch.shape == (2, 3) and batch[1] == pytest.approx(2 * times)


def test_host_model_validation():
    ok = dict(
        host_of_rank=[0, 1],
        alpha_s=0.0,
        beta_out_Bps=[1.0, 1.0],
        beta_in_Bps=[1.0, 1.0],
        beta_local_Bps=1.0,
    )
    model = HostModel(**ok, quant_s_per_value={2: 1e-9})
    assert model.num_hosts == 2 and model.num_ranks == 2
    assert model.quant_s_per_value[32] == 0.0 and model.dequant_s_per_value == {32: 0.0}
    assert HostModel(**{**ok, "beta_local_Bps": np.inf}).beta_local_Bps == np.inf
    bad = [
        {"host_of_rank": [0, 2]},
        {"host_of_rank": [0.0, 1.0]},
        {"host_of_rank": []},
        {"alpha_s": -1.0},
        {"beta_out_Bps": [1.0, 0.0]},
        {"beta_in_Bps": [1.0]},
        {"beta_in_Bps": [1.0, np.inf]},
        {"beta_local_Bps": 0.0},
        {"quant_s_per_value": {3: 1e-9}},
        {"dequant_s_per_value": {2: -1.0}},
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            HostModel(**{**ok, **kw})
    for fabric in (0.0, -1.0, np.nan, -np.inf):
        with pytest.raises(ValueError, match="fabric_Bps"):
            HostModel(**ok, fabric_Bps=fabric)
    assert HostModel(**ok).fabric_Bps == HostModel(**ok, fabric_Bps=np.inf).fabric_Bps == np.inf
    assert HostModel(**ok, fabric_Bps=2).fabric_Bps == 2.0
    channels = [Channel(0, 1, np.ones(3))]
    with pytest.raises(ValueError, match="no entry for widths"):
        solve_assignment(channels, 8, model, bits=(2, 4), reference_bits=2)  # no cost for 4 bits
    with pytest.raises(ValueError, match="outside"):
        solve_assignment([Channel(0, 2, np.ones(3))], 8, model, bits=(2,), reference_bits=2)
    with pytest.raises(ValueError, match="HostModel"):
        solve_assignment(
            channels, 8, LinkModel.uniform(2, 1e-5, 1e9), bits=(2, 32), reference_bits=2
        )
    with pytest.raises(TypeError):
        solve_assignment(channels, 8, None, reference_bits=2)


def test_a_ranks_cpu_scale_prices_its_own_quantization():
    """A message costs its sender's and its receiver's CPU at their own rates: rank 0 at
    three times the table's (a host held to a third of a core), rank 1 at it."""
    channels = [Channel(0, 1, np.ones(100))]
    widths = [np.full(100, 2, np.int8)]
    kw = dict(quant_s_per_value=1e-9, dequant_s_per_value=2e-9)
    even = HostModel.uniform([0, 1], 0.0, 1e15, 1e15, **kw)
    slow_sender = HostModel.uniform([0, 1], 0.0, 1e15, 1e15, cpu_scale=[3.0, 1.0], **kw)
    slow_receiver = HostModel.uniform([0, 1], 0.0, 1e15, 1e15, cpu_scale=[1.0, 3.0], **kw)
    values = 100 * 10
    assert even.exchange_time(channels, 10, widths) == pytest.approx(2e-9 * values, rel=1e-3)
    assert slow_sender.exchange_time(channels, 10, widths) == pytest.approx(3e-9 * values, rel=1e-3)
    assert slow_receiver.exchange_time(channels, 10, widths) == pytest.approx(
        6e-9 * values, rel=1e-3
    )
    with pytest.raises(ValueError, match="cpu_scale"):
        HostModel.uniform([0, 1], 0.0, 1e9, 1e9, cpu_scale=[1.0])
    with pytest.raises(ValueError, match="cpu_scale"):
        HostModel.uniform([0, 1], 0.0, 1e9, 1e9, cpu_scale=[1.0, 0.0])


@pytest.mark.parametrize(("scale", "full"), [([1.0, 1.0], False), ([10.0, 1.0], True)])
def test_the_solver_sends_float32_where_a_ranks_cpu_is_short(scale, full):
    """Fast links: quantizing pays while the CPU is plentiful (8 bits: about 62 us against
    float32's 128), not once rank 0, which (de)quantizes every message both ways, runs at a
    tenth of the table's rate (292 us)."""
    channels = [Channel(0, 1, np.ones(200)), Channel(1, 0, np.ones(200))]
    hosts = HostModel.uniform(
        [0, 1],
        1e-5,
        4e8,
        4e8,
        quant_s_per_value=1e-9,
        dequant_s_per_value=1e-9,
        cpu_scale=scale,
    )
    result = solve_assignment(
        channels,
        64,
        hosts,
        bits=(1, 2, 4, 8, 32),
        group_size=10,
        reference_bits=8,
        budget=1.0,
        window_s=0.0,
        method="milp",
        time_limit_s=5.0,
    )
    used = set(np.concatenate(result.bits).tolist())
    assert used == {32} if full else 32 not in used
