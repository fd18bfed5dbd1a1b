"""The halo aggregation's overlap window: what runs while an exchange is in flight, and
that splitting the work around it changes no value."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from adaqp.exchange.transport import ExchangeKey
from adaqp.graph import aggregate as aggregate_module
from adaqp.graph.aggregate import LinearAggregation, SparseAdjacency, spmm
from adaqp.model import flight, layers
from adaqp.model.layers import Propagation

# 4 inner rows (0, 1 central; 2, 3 marginal), 2 halo rows (4, 5); rows 1 and 3 are sent.
EDGES = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 3), (2, 2), (2, 4), (3, 1), (3, 4), (3, 5)]
NUM_INNER, NUM_HALO, DIM = 4, 2, 3


class _Recorder:
    """A policy stand-in: logs starts and waits; the halo rows and the returned
    gradients are fixed tensors."""

    def __init__(self, events: list[str], halo_HD: torch.Tensor, grad_SD: torch.Tensor):
        self.events, self.halo, self.grad = events, halo_HD, grad_SD
        self.sent: dict[str, torch.Tensor] = {}
        self.may_wait = True

    def waits(self, layer: int) -> bool:
        return self.may_wait

    def start(self, key: ExchangeKey, rows: torch.Tensor, selected: bool = False):
        tag = str(key)
        self.events.append(f"start {tag}")
        self.sent[tag] = rows.clone()
        back = tag.endswith("backward")

        def wait():
            self.events.append(f"wait {tag}")
            return self.grad if back else self.halo

        return SimpleNamespace(wait=wait)


class _Logged(torch.autograd.Function):
    """Identity that logs when its rows' gradient is computed."""

    @staticmethod
    def forward(ctx, x, events, name):
        ctx.events, ctx.name = events, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.events.append(f"grad {ctx.name}")
        return grad, None, None


def _setup(overlap: bool):
    rows, cols = np.array(EDGES).T
    values = np.linspace(0.5, 1.4, len(EDGES)).astype(np.float32)
    order = np.lexsort((cols, rows))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=NUM_INNER))])
    adjacency = SparseAdjacency.from_csr(
        indptr, cols[order], values[order], (NUM_INNER, NUM_INNER + NUM_HALO)
    )
    graph = SimpleNamespace(
        num_inner=NUM_INNER,
        num_halo=NUM_HALO,
        num_central=2,
        send_idx=torch.tensor([1, 3]),
    )
    gen = torch.Generator().manual_seed(0)
    halo = torch.randn(NUM_HALO, DIM, generator=gen)
    grad_sent = torch.randn(2, DIM, generator=gen)
    events: list[str] = []
    policy = _Recorder(events, halo, grad_sent)
    prop = Propagation(graph, adjacency, policy, overlap=overlap)
    dense = torch.zeros(NUM_INNER, NUM_INNER + NUM_HALO)
    dense[rows, cols] = torch.from_numpy(values)
    return prop, events, policy, dense, halo, grad_sent


class _Scaled(LinearAggregation):
    """Another linear aggregation: the product times a constant, logged by block shape."""

    def __init__(self, scale: float, events: list[str] | None = None):
        self.scale, self.events = scale, events

    def __call__(self, block, x, rows):
        if self.events is not None:
            self.events.append(f"aggregate {block.shape[0]}x{block.shape[1]}")
        return self.scale * spmm(block, x)


AGGREGATES = {
    "product": None,
    "custom": lambda: _spmm_by_another_name,
    "scaled": lambda: _Scaled(0.5),
}
"""The default product, an aggregation with no linear promise, and another linear one."""


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("aggregate", list(AGGREGATES))
@pytest.mark.parametrize("weights", ["finish", "transform", "transform without bias"])
def test_split_work_equals_whole_aggregation(overlap, aggregate, weights):
    """Values and gradients equal the whole product's, whichever way the work is split:
    the weights applied in the finish, or as a transform (deferred weight gradients)."""
    prop, _, policy, dense, halo, grad_sent = _setup(overlap)
    if aggregate == "scaled":
        dense = 0.5 * dense
    torch.manual_seed(1)
    linear = torch.nn.Linear(DIM, 5, bias=weights != "transform without bias")
    h = torch.randn(NUM_INNER, DIM, requires_grad=True)
    make = AGGREGATES[aggregate]
    custom = {} if make is None else {"aggregate": make()}
    if weights == "finish":
        out = prop(h, 1, lambda agg, rows: linear(agg), **custom)
    else:
        out = prop(h, 1, transform=linear, **custom)
    upstream = torch.randn(NUM_INNER, 5)
    out.backward(upstream)

    h_ref = h.detach().clone().requires_grad_(True)
    linear_ref = copy.deepcopy(linear)
    linear_ref.zero_grad(set_to_none=True)
    expected = linear_ref(dense @ torch.cat([h_ref, halo]))
    # The halo rows' gradient goes to their owners; what they return for the sent rows
    # (grad_sent) is added to those rows' gradient.
    expected.backward(upstream)
    grad_halo = (dense.T @ (upstream @ linear.weight.detach()))[NUM_INNER:]
    torch.testing.assert_close(out, expected)
    for param, param_ref in zip(linear.parameters(), linear_ref.parameters(), strict=True):
        torch.testing.assert_close(param.grad, param_ref.grad)
    grad_h = h_ref.grad.index_add(0, torch.tensor([1, 3]), grad_sent)
    torch.testing.assert_close(h.grad, grad_h)
    torch.testing.assert_close(policy.sent["layer1/forward"], h.detach()[[1, 3]])
    torch.testing.assert_close(policy.sent["layer1/backward"], grad_halo)


def _log_deferred_grads(monkeypatch, events: list[str]) -> None:
    """Logs "weight gradients" in ``events`` where a layer computes its deferred ones."""
    settle_deferred = flight.InFlight.settle_deferred

    def logged_settle_deferred(flight):
        if flight.deferred is not None:
            events.append("weight gradients")
        return settle_deferred(flight)

    monkeypatch.setattr(flight.InFlight, "settle_deferred", logged_settle_deferred)


def test_inner_columns_are_aggregated_and_differentiated_while_the_exchange_travels(
    monkeypatch,
):
    """The product aggregation's window: every row's sum over its inner in-neighbours
    runs in flight, the halo terms and the finish after landing; backward, the transform's
    weight gradient is made at once, before the halo gradients are sent (its input and
    output gradient let go before the exchange's buffers are made: the inner sum's
    gradient, computed between sending and waiting, hides the exchange)."""
    prop, events, policy, dense, halo, _ = _setup(overlap=True)

    def logged_spmm(block, x, hand=None):
        events.append(f"aggregate {block.shape[0]}x{block.shape[1]}")
        if hand is None:
            return spmm(block, _Logged.apply(x, events, "inner"))

        def logged_hand(grad):  # the inner rows' gradient, handed to the exchange
            events.append("grad inner")
            return hand(grad)

        return spmm(block, x, logged_hand)

    monkeypatch.setattr(aggregate_module, "spmm", logged_spmm)
    monkeypatch.setattr(layers, "spmm", logged_spmm)
    _log_deferred_grads(monkeypatch, events)
    linear = torch.nn.Linear(DIM, 5)
    h = torch.randn(NUM_INNER, DIM, requires_grad=True)

    def finish(agg, rows):
        events.append(f"finish {rows.start}:{rows.stop}")
        return agg

    out = prop(h, 1, finish, transform=linear)
    assert events == [
        "start layer1/forward",
        f"aggregate {NUM_INNER}x{NUM_INNER}",  # inside the window
        "wait layer1/forward",
        f"finish 0:{NUM_INNER}",
    ]
    torch.testing.assert_close(out, linear(dense @ torch.cat([h.detach(), halo])))
    events.clear()
    linear.weight.register_post_accumulate_grad_hook(lambda p: events.append("weight ready"))
    out.sum().backward()
    assert events == [
        "weight ready",  # at once: nothing deferred
        "start layer1/backward",
        "grad inner",  # inside the window
        "wait layer1/backward",
    ]


@pytest.mark.parametrize("overlap", [True, False])
def test_the_landed_gradients_are_added_where_the_inner_rows_gradient_is(monkeypatch, overlap):
    """A layer that aggregates first hands its inner rows' product's input gradient to
    the exchange, which adds the landed gradients into that tensor: the input's gradient
    is it, dense, with no second [I, D] tensor made. Not overlapped, the halo gradients
    land (and the weight gradient is made) before the inner rows' gradient is."""
    prop, events, policy, dense, halo, grad_sent = _setup(overlap)
    _log_deferred_grads(monkeypatch, events)
    handed: list[torch.Tensor] = []
    hand = flight.InFlight.hand_inner_grad

    def logged_hand(self, grad):
        events.append("grad inner")
        handed.append(grad)
        return hand(self, grad)

    monkeypatch.setattr(flight.InFlight, "hand_inner_grad", logged_hand)
    linear = torch.nn.Linear(DIM, 5)
    h = torch.randn(NUM_INNER, DIM, requires_grad=True)
    reached: list[torch.Tensor] = []
    h.register_hook(reached.append)
    out = prop(h, 1, transform=linear)
    events.clear()
    upstream = torch.randn(NUM_INNER, 5)
    out.backward(upstream)
    if overlap:
        assert events == ["start layer1/backward", "grad inner", "wait layer1/backward"]
    else:
        assert events == [
            "start layer1/backward",
            "weight gradients",
            "wait layer1/backward",
            "grad inner",
        ]
    (grad,) = reached
    assert not grad.is_sparse and grad.data_ptr() == handed[0].data_ptr()
    grad_inner = (dense.T @ (upstream @ linear.weight.detach()))[:NUM_INNER]
    expected = grad_inner.index_add(0, torch.tensor([1, 3]), grad_sent)
    torch.testing.assert_close(h.grad, expected)


def _spmm_by_another_name(block, x, rows):
    """A custom aggregation (GAT's path) with the product's values."""
    return spmm(block, x)


def test_a_custom_aggregation_finishes_the_central_rows_while_the_exchange_travels():
    prop, events, policy, dense, halo, _ = _setup(overlap=True)
    weight = torch.randn(DIM, 5, requires_grad=True)
    h = torch.randn(NUM_INNER, DIM, requires_grad=True)

    def finish(agg, rows):
        name = "central" if rows.start == 0 else "marginal"
        events.append(f"finish {name}")
        return _Logged.apply(agg, events, name) @ weight

    out = prop(h, 1, finish, aggregate=_spmm_by_another_name)
    assert events == [
        "start layer1/forward",
        "finish central",  # inside the window
        "wait layer1/forward",
        "finish marginal",
    ]
    torch.testing.assert_close(out, dense @ torch.cat([h.detach(), halo]) @ weight.detach())
    events.clear()
    out.sum().backward()
    assert events == [
        "grad marginal",
        "start layer1/backward",
        "grad central",  # inside the window
        "wait layer1/backward",
    ]


def test_a_layer_that_will_not_wait_does_not_split_its_rows():
    """Where the policy reads rows already at hand (stale ones), the layer aggregates all
    its rows at once: same result, no central/marginal split in either direction."""
    prop, events, policy, dense, halo, _ = _setup(overlap=True)
    policy.may_wait = False
    weight = torch.randn(DIM, 5, requires_grad=True)
    h = torch.randn(NUM_INNER, DIM, requires_grad=True)

    def finish(agg, rows):
        events.append(f"finish {rows.start}:{rows.stop}")
        return agg @ weight

    out = prop(h, 1, finish)
    assert events == ["start layer1/forward", "wait layer1/forward", f"finish 0:{NUM_INNER}"]
    torch.testing.assert_close(out, dense @ torch.cat([h.detach(), halo]) @ weight.detach())
    events.clear()
    out.sum().backward()
    assert events == ["start layer1/backward", "wait layer1/backward"]


@pytest.mark.parametrize("aggregate", ["product", "custom"])
@pytest.mark.parametrize(("num_central", "num_halo"), [(NUM_INNER, 0), (0, 2)])
def test_a_part_with_no_halo_rows_or_no_central_rows(aggregate, num_central, num_halo):
    """Every rank joins every exchange: a part with no halo in-neighbour still starts and
    lands one (with zero rows), and one whose every row is marginal has an empty window."""
    edges = [(u, v) for u, v in EDGES if v < NUM_INNER + num_halo]
    rows, cols = np.array(edges).T
    values = np.linspace(0.5, 1.4, len(edges)).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=NUM_INNER))])
    shape = (NUM_INNER, NUM_INNER + num_halo)
    adjacency = SparseAdjacency.from_csr(indptr, cols, values, shape)
    graph = SimpleNamespace(
        num_inner=NUM_INNER, num_halo=num_halo, num_central=num_central, send_idx=torch.tensor([1])
    )
    halo = torch.randn(num_halo, DIM)
    events: list[str] = []
    prop = Propagation(graph, adjacency, _Recorder(events, halo, torch.randn(1, DIM)), True)
    h = torch.randn(NUM_INNER, DIM, requires_grad=True)
    custom = {"aggregate": _spmm_by_another_name} if aggregate == "custom" else {}
    out = prop(h, 1, **custom)
    dense = torch.zeros(shape)
    dense[rows, cols] = torch.from_numpy(values)
    torch.testing.assert_close(out, dense @ torch.cat([h.detach(), halo]))
    out.sum().backward()
    assert events == [
        f"{verb} layer1/{way}" for way in ("forward", "backward") for verb in ("start", "wait")
    ]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_an_input_without_a_gradient_sends_no_gradient_back(overlap, bias):
    """Layer 0 without the cached input: the features need no gradient, so no halo
    gradient is exchanged backward (deferring the transform's weight gradients would send
    one); those gradients, then the transform's own, equal the whole product's."""
    prop, events, _, dense, halo, _ = _setup(overlap)
    torch.manual_seed(2)
    linear = torch.nn.Linear(DIM, 5, bias=bias)
    h = torch.randn(NUM_INNER, DIM)
    out = prop(h, 0, transform=linear)
    upstream = torch.randn(NUM_INNER, 5)
    out.backward(upstream)
    assert events == ["start layer0/forward", "wait layer0/forward"]
    reference = copy.deepcopy(linear)
    reference.zero_grad(set_to_none=True)
    expected = reference(dense @ torch.cat([h, halo]))
    expected.backward(upstream)
    torch.testing.assert_close(out, expected)
    for param, param_ref in zip(linear.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.grad, param_ref.grad)


@pytest.mark.parametrize("overlap", [True, False])
def test_another_linear_aggregation_splits_by_columns_and_defers_the_weights(monkeypatch, overlap):
    """The path follows what an aggregation declares, not which one it is: a scaled
    product (a LinearAggregation) aggregates every row's inner columns (in flight where the
    layer overlaps; where it does not, the exchange starts after them) and adds the
    marginal rows' halo columns after landing; its transform's weight gradients are
    computed in the backward window where the layer does not overlap, as the product's
    are, and at once where it does."""
    prop, events, _, dense, halo, _ = _setup(overlap=overlap)
    _log_deferred_grads(monkeypatch, events)
    linear = torch.nn.Linear(DIM, 5)
    h = torch.randn(NUM_INNER, DIM, requires_grad=True)
    out = prop(h, 1, aggregate=_Scaled(0.5, events), transform=linear)
    inner = f"aggregate {NUM_INNER}x{NUM_INNER}"
    start = "start layer1/forward"
    window = [start, inner] if overlap else [inner, start]
    assert events == [
        *window,
        "wait layer1/forward",
        f"aggregate {NUM_INNER - 2}x{NUM_HALO}",  # the marginal rows' halo block
    ]
    torch.testing.assert_close(out, linear(0.5 * dense @ torch.cat([h.detach(), halo])))
    events.clear()
    out.sum().backward()
    deferred = [] if overlap else ["weight gradients"]
    assert events == ["start layer1/backward", *deferred, "wait layer1/backward"]


@pytest.mark.parametrize(("num_central", "stray"), [(3, 1), (4, 3)])
def test_central_rows_that_read_halo_columns_are_refused(num_central, stray):
    """Both splits drop a central row's halo entries: an adjacency with some in the rows
    the graph calls central is refused when the Propagation is built, with the count."""
    prop, *_ = _setup(overlap=True)
    graph = SimpleNamespace(**{**vars(prop.graph), "num_central": num_central})
    match = f"{stray} adjacency entries of the {num_central} central rows read halo columns"
    with pytest.raises(ValueError, match=match):
        Propagation(graph, prop.adjacency, prop.policy, overlap=True)


@pytest.mark.parametrize("weights", ["finish", "transform"])
def test_linear_only_keeps_the_column_blocks_and_aggregates_a_cached_input_by_them(weights):
    """Built for linear aggregations, with a policy, a Propagation holds the adjacency only
    as its column blocks (each entry once); the cached layer-0 input ``[I + H, D]`` is
    aggregated block by block, equal to the whole matrix's product, gradients included."""
    whole, _, policy, dense, halo, _ = _setup(overlap=True)
    split = Propagation(whole.graph, whole.adjacency, policy, True, cached_input=True, linear=True)
    assert split.adjacency is None
    blocks = split._column_blocks
    entries = sum(int(b.forward.values().numel()) for b in blocks)
    assert entries == int(whole.adjacency.forward.values().numel())
    torch.manual_seed(4)
    linear = torch.nn.Linear(DIM, 5)
    h = torch.randn(NUM_INNER + NUM_HALO, DIM, requires_grad=True)
    kwargs = {"transform": linear} if weights == "transform" else {}
    finish = (lambda agg, rows: linear(agg)) if weights == "finish" else layers._whole
    out = split(h, 0, finish, **kwargs)
    upstream = torch.randn(NUM_INNER, 5)
    out.backward(upstream)
    h_ref = h.detach().clone().requires_grad_(True)
    reference = copy.deepcopy(linear)
    reference.zero_grad(set_to_none=True)
    expected = reference(dense @ h_ref)
    expected.backward(upstream)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(h.grad, h_ref.grad)
    for param, param_ref in zip(linear.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.grad, param_ref.grad)
    assert not policy.sent  # the input held its halo rows: nothing exchanged
    # No whole matrix to run another aggregation on: refused, not silently wrong.
    with pytest.raises(ValueError, match="linear aggregations only"):
        split(h, 1, aggregate=_spmm_by_another_name)
