"""GNN on one worker (no exchange): its shape follows the config, dropout is off in
evaluation, and its forward and backward equal a dense reference computed here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from adaqp.config import ModelConfig
from adaqp.model.gnn import GNN
from adaqp.model.layers import GCNConv, SAGEConv
from tests.model.tiny_graph import C, F, N, edges, propagation, tiny_graph

pytestmark = pytest.mark.usefixtures("one_thread")


def _dense_matrices() -> tuple[torch.Tensor, torch.Tensor]:
    """(GCN's D^-1/2 (A + I) D^-1/2, the mean aggregator), float64, from the edge list."""
    src, dst = edges()
    a = torch.zeros(N, N, dtype=torch.float64)
    a[dst, src] = 1.0  # edge v -> u: row u, column v
    deg = a.sum(1)
    d = (deg + 1.0).rsqrt()
    gcn = d[:, None] * (a + torch.eye(N, dtype=torch.float64)) * d[None, :]
    mean = a / deg.clamp(min=1.0)[:, None]
    return gcn, mean


def _p(linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    bias = None if linear.bias is None else linear.bias.detach().double()
    return linear.weight.detach().double(), bias


def _reference(model: GNN, x: torch.Tensor) -> torch.Tensor:
    """The model's forward (eval mode), written out densely in float64."""
    gcn, mean = _dense_matrices()
    h = x.double()
    for layer, conv in enumerate(model.convs):
        if isinstance(conv, GCNConv):
            w, b = _p(conv.linear)
            h = gcn @ h @ w.T + b
        else:
            w_root, b_root = _p(conv.root)
            w_neigh, _ = _p(conv.neigh)
            h = h @ w_root.T + b_root + (mean @ h) @ w_neigh.T
        if layer < len(model.convs) - 1:
            norm = model.norms[layer]
            if isinstance(norm, nn.LayerNorm):
                h = nn.functional.layer_norm(
                    h, norm.normalized_shape, norm.weight.double(), norm.bias.double(), norm.eps
                )
            h = torch.relu(h)
    return h


def _model(name: str, layers: int = 2, hidden: int = 8, **kwargs) -> GNN:
    torch.manual_seed(0)
    config = ModelConfig(name=name, layers=layers, hidden=hidden, dropout=0.5, **kwargs)
    return GNN(config, F, C)


@pytest.mark.parametrize("name, conv_type", [("gcn", GCNConv), ("sage", SAGEConv)])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_layers_and_widths_follow_the_config(name, conv_type, layers):
    config = ModelConfig(name=name, layers=layers, hidden=7, dropout=0.25, layernorm=True)
    model = GNN(config, F, C)
    dims = [F] + [7] * (layers - 1) + [C]
    assert len(model.convs) == layers
    for conv, (a, b) in zip(model.convs, zip(dims[:-1], dims[1:], strict=True), strict=True):
        assert type(conv) is conv_type
        linear = conv.linear if name == "gcn" else conv.root
        assert (linear.in_features, linear.out_features) == (a, b)
        if name == "sage":
            assert (conv.neigh.in_features, conv.neigh.out_features) == (a, b)
            assert conv.neigh.bias is None
    assert len(model.norms) == layers - 1
    assert all(isinstance(n, nn.LayerNorm) and n.normalized_shape == (7,) for n in model.norms)
    assert model.dropout.p == 0.25
    assert model.norm == ("gcn" if name == "gcn" else "mean")


def test_no_layernorm_means_identity_norms():
    model = _model("gcn", layers=3)
    assert len(model.norms) == 2 and all(isinstance(n, nn.Identity) for n in model.norms)


def test_transform_first_only_where_gcn_rows_do_not_widen():
    config = ModelConfig(name="gcn", layers=3, hidden=4)
    flags = [c.transform_first for c in GNN(config, F, C, transform_first=True).convs]
    assert flags == [True, True, True]  # 6 -> 4 narrows, 4 -> 4 keeps, 4 -> 3 narrows
    flags = [c.transform_first for c in GNN(ModelConfig(name="gcn", hidden=8), F, C, True).convs]
    assert flags == [False, True]  # 6 -> 8 widens
    # A cached layer-0 input has its halo rows already: nothing to narrow there.
    cached = GNN(ModelConfig(name="gcn", hidden=5), F, C, transform_first=True, cached_input=True)
    assert [c.transform_first for c in cached.convs] == [False, True]
    assert not any(c.transform_first for c in GNN(config, F, C).convs)


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_eval_forward_is_deterministic_and_training_drops_out(name):
    model = _model(name)
    prop, graph = propagation(model)
    x = graph.features
    model.eval()
    a, b = model(x, prop), model(x, prop)
    assert a.shape == (N, C)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    model.train()
    c, d = model(x, prop, epoch=1), model(x, prop, epoch=2)
    assert not torch.equal(c, d)
    assert not torch.equal(c, a)
    # The masks are keyed by the epoch (and the rows' global ids): no generator involved.
    torch.manual_seed(1)
    torch.testing.assert_close(model(x, prop, epoch=1), c, rtol=0, atol=0)


@pytest.mark.parametrize("transform_first", [False, True])
@pytest.mark.parametrize("layernorm", [False, True])
@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_forward_equals_dense_reference(name, layernorm, transform_first):
    torch.manual_seed(0)
    config = ModelConfig(name=name, layers=2, hidden=4, dropout=0.5, layernorm=layernorm)
    model = GNN(config, F, C, transform_first=transform_first).eval()
    if layernorm:  # non-trivial affine parameters
        with torch.no_grad():
            model.norms[0].weight.uniform_(0.5, 1.5)
            model.norms[0].bias.uniform_(-0.5, 0.5)
    prop, graph = propagation(model)
    # The local order may differ from the global: compare in global order.
    order = np.argsort(graph.global_ids)
    out = model(graph.features, prop)[order]
    expected = _reference(model, torch.from_numpy(tiny_graph().features))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_two_layer_gcn_is_the_textbook_formula():
    model = _model("gcn", hidden=5).eval()
    prop, graph = propagation(model)
    gcn, _ = _dense_matrices()
    x = torch.from_numpy(tiny_graph().features).double()
    w1, b1 = _p(model.convs[0].linear)
    w2, b2 = _p(model.convs[1].linear)
    expected = gcn @ torch.relu(gcn @ x @ w1.T + b1) @ w2.T + b2
    out = model(graph.features, prop)[np.argsort(graph.global_ids)]
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_gradients_equal_dense_reference(name):
    model = _model(name, hidden=5).eval()
    prop, graph = propagation(model)
    order = np.argsort(graph.global_ids)
    target = torch.randn(N, C, generator=torch.Generator().manual_seed(2))
    x = graph.features.clone().requires_grad_(True)
    loss = (model(x, prop)[order] * target).sum()
    loss.backward()

    ref = _model(name, hidden=5).double().eval()
    x_ref = torch.from_numpy(tiny_graph().features).double().requires_grad_(True)
    _reference_with_grad(ref, x_ref, target.double()).backward()
    for (key, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad.double(), p_ref.grad, rtol=1e-5, atol=1e-5, msg=key)
    torch.testing.assert_close(x.grad.double()[order], x_ref.grad, rtol=1e-5, atol=1e-5)


def _reference_with_grad(model: GNN, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """As ``_reference`` but through the parameters themselves, so autograd reaches them."""
    gcn, mean = _dense_matrices()
    h = x
    for layer, conv in enumerate(model.convs):
        if isinstance(conv, GCNConv):
            h = conv.linear(gcn @ h)
        else:
            h = conv.root(h) + conv.neigh(mean @ h)
        if layer < len(model.convs) - 1:
            h = torch.relu(h)
    return (h * target).sum()
