"""GAT on one worker: its shape follows the config, and its forward and backward equal the
dense reference of ``tests/model/gat_reference.py`` (float64) to 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaqp.config import ModelConfig, load_config
from adaqp.graph.attention import attend, attention_weights
from adaqp.model.gat import GATConv
from adaqp.model.gnn import GNN
from tests.model.gat_reference import dense_gat, edge_mask
from tests.model.tiny_graph import C, F, N, propagation, tiny_graph

pytestmark = pytest.mark.usefixtures("one_thread")


def _gat(layers: int = 2, **kwargs) -> GNN:
    torch.manual_seed(0)
    config = ModelConfig(name="gat", layers=layers, hidden=3, dropout=0.5, **kwargs)
    return GNN(config, F, C)


def _mask() -> torch.Tensor:
    graph = tiny_graph()
    return edge_mask(graph.indptr, graph.indices, N)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_heads_and_widths_follow_the_config(layers):
    model = _gat(layers, heads=4, output_heads=2, attn_dropout=0.3, layernorm=True)
    assert model.norm == "gat"
    assert all(type(conv) is GATConv for conv in model.convs)
    ins = [F] + [12] * (layers - 1)
    for layer, conv in enumerate(model.convs):
        last = layer == layers - 1
        assert conv.linear.in_features == ins[layer]
        assert (conv.heads, conv.out_dim, conv.concat) == ((2, C, False) if last else (4, 3, True))
        assert conv.bias.shape == ((C,) if last else (12,))
        assert conv.attn_dropout.p == 0.3
    assert all(n.normalized_shape == (12,) for n in model.norms)


@pytest.mark.parametrize("layernorm", [False, True])
@pytest.mark.parametrize("heads, output_heads", [(1, 1), (4, 1), (2, 3)])
def test_forward_equals_dense_reference(heads, output_heads, layernorm):
    model = _gat(heads=heads, output_heads=output_heads, layernorm=layernorm).eval()
    with torch.no_grad():  # non-trivial biases and norms
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5)
    prop, graph = propagation(model)
    out = model(graph.features, prop)[np.argsort(graph.global_ids)]
    x = torch.from_numpy(tiny_graph().features).double()
    expected = dense_gat(model, x, _mask())
    assert out.shape == (N, C)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_gradients_equal_dense_reference():
    model = _gat(heads=3, output_heads=2).eval()
    prop, graph = propagation(model)
    order = np.argsort(graph.global_ids)
    target = torch.randn(N, C, generator=torch.Generator().manual_seed(2))
    x = graph.features.clone().requires_grad_(True)
    (model(x, prop)[order] * target).sum().backward()

    ref = _gat(heads=3, output_heads=2).double().eval()
    x_ref = torch.from_numpy(tiny_graph().features).double().requires_grad_(True)
    (dense_gat(ref, x_ref, _mask()) * target.double()).sum().backward()
    for (key, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad.double(), p_ref.grad, rtol=1e-5, atol=1e-5, msg=key)
    torch.testing.assert_close(x.grad.double()[order], x_ref.grad, rtol=1e-5, atol=1e-5)


def test_attention_passes_gradcheck():
    _, graph = propagation(_gat())
    adjacency = graph.adjacency("gat")
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(N, 2, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    att_src = torch.randn(2, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    att_dst = torch.randn(2, 3, dtype=torch.float64, generator=generator, requires_grad=True)

    def run(x, att_src, att_dst):
        return attend(adjacency, x, att_src, att_dst, slice(0, N))

    assert torch.autograd.gradcheck(run, (x, att_src, att_dst))


def test_weights_sum_to_one_per_destination_and_head():
    model = _gat(heads=2).eval()
    _, graph = propagation(model)
    adjacency = graph.adjacency("gat")
    x = torch.randn(N, 2, 3)
    alpha = attention_weights(adjacency, x, torch.randn(2, 3), torch.randn(2, 3), slice(0, N))
    dst, _, _ = adjacency.edges()
    totals = torch.zeros(N, 2).index_add(0, dst, alpha)
    torch.testing.assert_close(totals, torch.ones(N, 2))
    assert (alpha > 0).all()
    # A node without in-edges attends to itself alone.
    alone = torch.bincount(dst, minlength=N) == 1
    assert alone.any()
    torch.testing.assert_close(alpha[alone[dst]], torch.ones(int(alone.sum()), 2))


def test_training_drops_attention_and_evaluation_does_not():
    model = _gat(heads=2, attn_dropout=0.5)
    model.dropout.p = 0.0  # only the attention dropout left
    prop, graph = propagation(model)
    model.eval()
    a, b = model(graph.features, prop), model(graph.features, prop)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    model.train()
    c = model(graph.features, prop, epoch=1)
    assert not torch.equal(a, c)
    # Keyed by the epoch (and the edges' global ids): the same epoch drops the same weights.
    assert torch.equal(model(graph.features, prop, epoch=1), c)
    assert not torch.equal(model(graph.features, prop, epoch=2), c)
    with pytest.raises(ValueError, match="pass the epoch"):
        model(graph.features, prop)


def test_gat_only_fields_are_left_out_of_other_models_fingerprints():
    gcn = load_config(None, ["model.name=gcn"]).fingerprint()
    gat = load_config(None, ["model.name=gat"]).fingerprint()
    assert "model.heads" not in gcn and "model.attn_dropout" not in gcn
    assert gat["model.heads"] == 4 and gat["model.output_heads"] == 1
