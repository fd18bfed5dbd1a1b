"""solve_assignment on degenerate inputs, its order and determinism, the fixed schemes
(uniform, random), and the width before anything is traced (adaqp.assign.solve)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaqp.assign import (
    Channel,
    HostModel,
    LinkModel,
    first_width,
    random_assignment,
    solve_assignment,
    uniform_assignment,
)
from adaqp.quant.pack import packed_row_bytes
from tests.assign.helpers import _random_instance, _same_bits


def test_no_channels_and_single_peer():
    res = solve_assignment([], 16, LinkModel.uniform(1, 1e-5, 1e9), reference_bits=2)
    assert res.bits == () and res.exposed_s == 0 and res.variance == 0 and res.time_s == 0
    assert math.isnan(res.avg_bits) and res.bytes_per_channel.shape == (0,)


def test_empty_channel_costs_nothing():
    alpha = np.array([[0, 1e-5, 10.0], [1e-5, 0, 1e-5], [1e-5, 1e-5, 0]])
    lm = LinkModel(alpha, np.full((3, 3), 1e8))
    rng = np.random.default_rng(1)
    busy = Channel(0, 1, rng.gamma(0.7, 1.0, 12))
    # A window between the 4- and 8-bit exchanges: some groups widen, not all.
    window = 0.5 * sum(lm.time(0, 1, 12 * (packed_row_bytes(16, b) + 8)) for b in (4, 8))
    kw = dict(group_size=3, reference_bits=2, window_s=window)
    for method in ("milp", "greedy", "brute"):
        res = solve_assignment([busy, Channel(0, 2, np.zeros(0))], 16, lm, method=method, **kw)
        alone = solve_assignment([busy], 16, lm, method=method, **kw)
        assert res.bits[1].shape == (0,) and res.bytes_per_channel[1] == 0
        # The empty channel's 10 s latency must count neither in T nor in the time scale.
        assert res.time_s == pytest.approx(lm.time(0, 1, res.bytes_per_channel[0]))
        assert np.array_equal(res.bits[0], alone.bits[0]) and res.variance == alone.variance
        assert len(np.unique(res.bits[0])) > 1


@pytest.mark.parametrize("method", ["milp", "greedy", "brute"])
def test_window_and_budget_extremes(method):
    rng = np.random.default_rng(3)
    channels, lm, dim = _random_instance(rng, 2, 6)
    kw = dict(method=method, reference_bits=2)
    # A window that hides even 8 bits: nothing is exposed, so the least variance.
    hidden = solve_assignment(channels, dim, lm, window_s=1.0, **kw)
    assert all(np.all(b == 8) for b in hidden.bits) and hidden.exposed_s == 0
    # A budget below what 8 bits give everywhere: the least variance too.
    tight = solve_assignment(channels, dim, lm, budget=1e-9, **kw)
    assert all(np.all(b == 8) for b in tight.bits)


def test_single_width_and_width_independent_bytes():
    rng = np.random.default_rng(4)
    channels, lm, _ = _random_instance(rng, 3, 50)
    res = solve_assignment(channels, 64, lm, bits=(4,), reference_bits=4)
    assert all(np.all(b == 4) for b in res.bits) and res.status == "trivial"
    # dim=1: one code byte at any width, so time cannot change and only variance matters.
    res = solve_assignment(channels, 1, lm, reference_bits=2, group_size=7, method="milp")
    assert all(np.all(b == 8) for b in res.bits)


@pytest.mark.parametrize("method", ["milp", "greedy", "brute"])
def test_zero_and_equal_weights(method):
    rng = np.random.default_rng(5)
    lm = LinkModel(rng.uniform(1e-6, 1e-5, (3, 3)), rng.uniform(1e7, 1e8, (3, 3)))
    # Zero weight: variance is irrelevant, so every message goes at the cheapest width.
    zero = [Channel(0, 1, np.zeros(40)), Channel(1, 2, np.zeros(10))]
    res = solve_assignment(zero, 32, lm, group_size=5, reference_bits=2, method=method)
    assert all(np.all(b == 2) for b in res.bits)
    # Equal weights: the shorter channel fills up to the longer one's time, which leaves
    # groups tied; every method gives the wider bits to the earlier messages.
    equal = [Channel(0, 1, np.ones(12)), Channel(2, 0, np.ones(10))]
    kw = dict(group_size=2, reference_bits=2, method=method)
    res = solve_assignment(equal, 32, LinkModel.uniform(3, 1e-6, 1e7), **kw)
    assert any(len(np.unique(b)) > 1 for b in res.bits)  # a real tie-break, not all equal
    for b in res.bits:
        assert np.all(np.diff(b.astype(int)) <= 0)
    assert res.bits[0].tolist() == [2] * 12 and res.bits[1].tolist() == [4] * 4 + [2] * 6


def test_heaviest_messages_get_widest_bits():
    rng = np.random.default_rng(6)
    lm = LinkModel.uniform(3, 2e-5, 2e8)
    channels = [
        Channel(p, q, rng.permutation(rng.lognormal(0, 2, 300)))
        for p, q in [(0, 1), (1, 2), (2, 0)]
    ]
    window = uniform_assignment(channels, 64, 4, link_model=lm).time_s
    res = solve_assignment(
        channels, 64, lm, group_size=25, reference_bits=2, window_s=window, method="milp"
    )
    for ch, b in zip(channels, res.bits, strict=True):
        by_weight = b[np.argsort(-ch.weights, kind="stable")]
        assert np.all(np.diff(by_weight.astype(int)) <= 0)
        assert b[np.argmax(ch.weights)] == 8 and b.min() < 8
        assert b.dtype == np.int8 and b.shape == ch.weights.shape


@pytest.mark.parametrize("method", ["milp", "greedy"])
def test_deterministic(method):
    results = []
    for _ in range(2):  # fresh, equal inputs each time, as on two different ranks
        channels, lm, dim = _random_instance(np.random.default_rng(11), 6, 400)
        kw = dict(method=method, group_size=10, reference_bits=2, window_s=2e-4)
        results.append(solve_assignment(channels, dim, lm, **kw))
    assert _same_bits(*results) and results[0].variance == results[1].variance


def test_uniform_and_random_schemes():
    rng = np.random.default_rng(9)
    channels, lm, dim = _random_instance(rng, 3, 400)
    window = uniform_assignment(channels, dim, 4, link_model=lm).time_s
    top = uniform_assignment(channels, dim, 8, link_model=lm, window_s=window)
    bottom = uniform_assignment(channels, dim, 2, link_model=lm, window_s=window)
    assert top.exposed_s == pytest.approx(top.time_s - window) and bottom.exposed_s == 0
    assert top.avg_bits == 8 and top.method == "uniform"
    expected = [c.num_messages * (packed_row_bytes(dim, 8) + 8) for c in channels]
    assert top.bytes_per_channel.tolist() == expected
    assert math.isnan(uniform_assignment(channels, dim, 4).time_s)
    a = random_assignment(channels, dim, (2, 4, 8), seed=1, link_model=lm)
    b = random_assignment(channels, dim, (2, 4, 8), seed=1, link_model=lm)
    c = random_assignment(channels, dim, (2, 4, 8), seed=2, link_model=lm)
    assert _same_bits(a, b) and not _same_bits(a, c)
    assert all(set(np.unique(x)) <= {2, 4, 8} for x in a.bits)
    assert 4.0 < a.avg_bits < 5.33
    # The solver's reported cost, worked out here from the widths it chose: each row
    # carries its packed values and its float32 minimum and step; the slowest link sets
    # the time; a message's variance is its weight over (2^b - 1)^2.
    res = solve_assignment(channels, dim, lm, reference_bits=2, window_s=window, method="milp")
    seconds = [
        lm.alpha_s[c.src, c.dst]
        + sum(packed_row_bytes(dim, int(b)) + 8 for b in bits) / lm.beta_Bps[c.src, c.dst]
        for c, bits in zip(channels, res.bits, strict=True)
    ]
    variance = sum(
        float(np.sum(c.weights / (2.0 ** bits.astype(float) - 1) ** 2))
        for c, bits in zip(channels, res.bits, strict=True)
    )
    assert res.time_s == pytest.approx(max(seconds))
    assert res.exposed_s == pytest.approx(max(0.0, max(seconds) - window))
    assert res.variance == pytest.approx(variance)
    # Hidden like the 2-bit plan, with less variance than the 4-bit one.
    assert res.exposed_s == 0 and res.variance <= uniform_assignment(channels, dim, 4).variance


@pytest.mark.parametrize(
    ("nic_Bps", "expected"),
    [(2e9, 32), (37.5e6, 8)],  # loopback-like: quantizing costs more than it saves; 300 Mbit/s
)
def test_first_width_is_full_precision_only_where_the_host_model_finds_it_no_slower(
    nic_Bps, expected
):
    """Before any trace, the host model chooses between initial_bits and float32 by time
    alone (float32 also has no variance); 4 hosts, 1000 rows of 64 values per pair."""
    model = HostModel.uniform(
        [0, 1, 2, 3], 1e-4, nic_Bps, 2e9, quant_s_per_value=15e-9, dequant_s_per_value=5e-9
    )
    counts = np.full((4, 4), 1000) - np.diag([1000] * 4)
    width, times = first_width(model, counts, 64, 8)
    assert width == expected
    # Each host sends 3 x 1000 rows: 768 KB at 32 bits; at 8 bits a quarter of that plus
    # the rows' min/max (8 bytes each), and 3000 x 64 values quantized and dequantized.
    sent = {32: 3000 * 64 * 4, 8: 3000 * (64 + 8)}
    assert times[32] == pytest.approx(1e-4 + sent[32] / nic_Bps)
    assert times[8] == pytest.approx(1e-4 + sent[8] / nic_Bps + 3000 * 64 * 20e-9)
    assert first_width(model, counts, 64, 32) == (32, {32: times[32]})
