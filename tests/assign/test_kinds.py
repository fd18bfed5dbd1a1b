"""Which cost model a run plans with (adaqp.assign.kinds): the kinds by name, the model
objects' solvers, and merging the channels that share a link."""

from __future__ import annotations

import numpy as np
import pytest

from adaqp.assign import (
    Channel,
    HostModel,
    LinkModel,
    cost_model_kind,
    kind_of,
    solve_assignment,
    solve_exchange,
)
from adaqp.assign.kinds import HOST_SOLVERS, LINK_SOLVERS, _merge, _split
from adaqp.config import QuantConfig


@pytest.mark.parametrize("shared", [False, True])
def test_merge_and_split_round_trip(shared):
    rng = np.random.default_rng(0)
    channels = [
        Channel(s, d, rng.random(int(rng.integers(0, 6))))
        for s in range(3)
        for d in range(3)
        if s != d
    ]
    links = LinkModel(rng.random((3, 3)) * 1e-4, 1e8 + rng.random((3, 3)) * 1e9)
    merged, model, members = _merge(channels, links, shared)
    assert len(merged) == (1 if shared else 3)
    assert sum(c.num_messages for c in merged) == sum(c.num_messages for c in channels)
    fake = tuple(np.arange(c.num_messages, dtype=np.int64) + 100 * i for i, c in enumerate(merged))
    split = _split(fake, members, channels)
    for bits, c in zip(split, channels, strict=True):
        assert len(bits) == c.num_messages
    # Each merged channel's widths come back, in order, to its member channels.
    for i, group in enumerate(members):
        back = np.concatenate([split[channels.index(c)] for c in group])
        np.testing.assert_array_equal(back, fake[i])
    assert model.num_ranks == 3


@pytest.mark.parametrize("full_precision", ["auto", "never", "profile"])
@pytest.mark.parametrize("scheme", ["adaptive", "uniform", "random"])
@pytest.mark.parametrize("name", ["shared", "sender", "link", "host"])
def test_the_kind_answers_for_the_scheme_and_the_cost_model(scheme, name, full_precision):
    """Only "profile" lets a stopwatch choose float32: the default ("auto") profiles
    nothing under the uniform scheme and keeps float32 out of the solver's widths."""
    config = QuantConfig(scheme=scheme, cost_model=name, full_precision=full_precision)
    kind = cost_model_kind(config)
    host, profile = name == "host", full_precision == "profile"
    if scheme == "uniform" and host and profile:
        # Profiled only to send float32 where it is predicted no slower; nothing solved.
        assert kind.name == "host" and not kind.plans_by_pair and kind.profiles_links
        assert kind.profiles_hosts and kind.offers_full_precision
        return
    if scheme != "adaptive":  # otherwise uniform and random widths are not priced
        assert kind.name == "none" and not kind.plans_by_pair and not kind.profiles_links
        assert not (kind.profiles_hosts or kind.has_fabric_rate or kind.offers_full_precision)
        return
    assert kind.name == name and kind.plans_by_pair and kind.profiles_links
    assert kind.profiles_hosts == kind.has_fabric_rate == host
    assert kind.offers_full_precision == (host and profile)
    assert kind.merge == {"shared": "shared", "sender": "sender"}.get(name)
    assert kind.solvers is (HOST_SOLVERS if host else LINK_SOLVERS)


def test_kind_of_matches_a_model_object_to_its_solvers():
    assert kind_of(LinkModel.uniform(2, 1e-5, 1e9)).solvers is LINK_SOLVERS
    assert kind_of(HostModel.uniform([0, 1], 1e-5, 1e9, 1e9)).solvers is HOST_SOLVERS
    with pytest.raises(TypeError):
        kind_of(None)


@pytest.mark.parametrize("name", ["shared", "sender", "link", "host"])
def test_solve_exchange_solves_what_the_kind_prices(name):
    """Each kind solves as the planner did before it asked the kind: host with full
    precision among the widths under quant.full_precision = "profile", link as the
    channels are, shared and sender merged."""
    rng = np.random.default_rng(31)
    channels = [
        Channel(s, d, rng.gamma(0.7, 1.0, int(rng.integers(1, 60))))
        for s in range(3)
        for d in range(3)
        if s != d
    ]
    links = LinkModel(rng.uniform(1e-5, 1e-4, (3, 3)), rng.uniform(1e7, 1e8, (3, 3)))
    hosts = HostModel.uniform([0, 0, 1], 1e-5, 5e7, 1e9, quant_s_per_value=1e-9)
    kind = cost_model_kind(
        QuantConfig(scheme="adaptive", cost_model=name, full_precision="profile")
    )
    kw = dict(group_size=10, reference_bits=2, window_s=1e-4, method="milp", time_limit_s=5.0)
    result, widths = solve_exchange(kind, channels, 16, links, hosts, bits=(2, 4, 8), **kw)
    if name == "host":
        expected = solve_assignment(channels, 16, hosts, bits=(2, 4, 8, 32), **kw)
        bits = expected.bits
    elif name == "link":
        expected = solve_assignment(channels, 16, links, bits=(2, 4, 8), **kw)
        bits = expected.bits
    else:
        merged, model, members = _merge(channels, links, shared=name == "shared")
        expected = solve_assignment(merged, 16, model, bits=(2, 4, 8), **kw)
        bits = _split(expected.bits, members, channels)
    assert (result.exposed_s, result.time_s) == (expected.exposed_s, expected.time_s)
    assert len(widths) == len(channels)
    for got, want, c in zip(widths, bits, channels, strict=True):
        assert got.shape == (c.num_messages,)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("full_precision", ["auto", "never", "profile"])
def test_only_profile_puts_float32_among_the_host_models_widths(full_precision):
    """Fast links and slow quantization: float32 wins where it is a width (under
    quant.full_precision = "profile"), and is none otherwise (under "auto" the planner,
    not the solver, sends float32 within a host)."""
    channels = [Channel(s, d, np.ones(50)) for s in range(2) for d in range(2) if s != d]
    links = LinkModel.uniform(2, 1e-5, 1e10)
    hosts = HostModel.uniform([0, 1], 1e-5, 1e10, 1e10, quant_s_per_value=1e-7)
    config = QuantConfig(scheme="adaptive", full_precision=full_precision)
    kind = cost_model_kind(config)
    kw = dict(group_size=10, reference_bits=2, window_s=0.0, method="milp", time_limit_s=5.0)
    _, widths = solve_exchange(kind, channels, 16, links, hosts, bits=(1, 2, 4, 8), **kw)
    used = set(np.concatenate(widths).tolist())
    if full_precision == "profile":
        assert used == {32}
    else:
        assert used and 32 not in used
