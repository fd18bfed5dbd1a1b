"""What a forward pass keeps for backward (adaqp/model/recompute.py): the bytes each layer
saves stay under a bound computed from the shapes, and what backward computes again (the
ReLU's mask, each layer's dropped-out input, dropout's masks) gives the bits that plain
autograd, keeping them, gives."""

from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch import nn

from adaqp.config import ModelConfig
from adaqp.data import GraphData, csr_from_edges
from adaqp.graph.local import LocalGraph
from adaqp.model import gnn as gnn_module
from adaqp.model import recompute
from adaqp.model.dropout import Dropout
from adaqp.model.gnn import GNN
from adaqp.model.layers import Propagation
from adaqp.model.recompute import SavedTensors, norm_relu
from adaqp.partitioning import schema
from adaqp.partitioning.build import build_parts
from adaqp.quant.draws import Draw, RowKeys, draw_key
from adaqp.quant.pack import pack, unpack

N, F, D, C = 3000, 16, 64, 5


def _local() -> LocalGraph:
    """A random graph of N nodes, average in-degree 6, as one part."""
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, N, size=(2, 6 * N))
    keep = src != dst
    indptr, indices = csr_from_edges(src[keep], dst[keep], N, symmetrize=False)
    train = rng.random(N) < 0.5
    graph = GraphData(
        name="random",
        indptr=indptr,
        indices=indices,
        features=rng.standard_normal((N, F)).astype(np.float32),
        labels=rng.integers(0, C, N).astype(np.int64),
        train_mask=train,
        val_mask=np.zeros(N, dtype=bool),
        test_mask=~train,
        num_classes=C,
    )
    arrays, _ = build_parts(graph, np.zeros(N, dtype=np.int64))
    return LocalGraph.from_part(schema.Part(0, 1, arrays[0]))


@pytest.fixture(scope="module")
def graph() -> LocalGraph:
    return _local()


def _model(name: str, layernorm: bool = True, transform_first: bool = True) -> GNN:
    torch.manual_seed(0)
    config = ModelConfig(name=name, layers=3, hidden=D, dropout=0.5, layernorm=layernorm)
    model = GNN(config, F, C, transform_first=transform_first)
    if layernorm:  # non-trivial affine parameters
        with torch.no_grad():
            for norm in model.norms:
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
    return model.train()


def _saved_bytes_by_layer(model: GNN, graph: LocalGraph, epoch: int = 1) -> dict[int, int]:
    """Bytes each layer keeps for backward (storages counted once, parameters left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[int, int]] = {}

    def observe(layer: int, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), (layer, storage.nbytes()))

    model.observe_saved = observe
    propagate = Propagation(graph, graph.adjacency(model.norm), policy=None)
    out = model(graph.features, propagate, epoch=epoch)
    model.observe_saved = None
    by_layer: dict[int, int] = {}
    for layer, nbytes in seen.values():
        by_layer[layer] = by_layer.get(layer, 0) + nbytes
    del out
    return by_layer


def _bound(layer: int, rows: int) -> int:
    """What backward needs, from the shapes: the rows the layer's weights read (the
    aggregated rows, F then D wide; at the last layer, which transforms first, its D-wide
    input, read first in backward), the norm's input and its per-row mean and inverse
    deviation (float32 each) and the ReLU's mask (bits); and, not per row, a copy of the
    layer's weights (SAGE's transform-first product saves its two weights as one) and 1 KiB
    for index tensors and the like."""
    agg = F if layer == 0 else D
    norm = D + 2 if layer < 2 else 0
    relu = -(-D // 8) if layer < 2 else 0  # the ReLU's mask, one bit a value
    return 4 * rows * (agg + norm) + rows * relu + 4 * 2 * D * max(F, D, C) + 1024


@contextmanager
def _plain_autograd():
    """The model as plain autograd runs it: ReLU and LayerNorm as themselves, nothing
    saved as a recipe (what the bound must catch and what the recompute must equal)."""
    norm_relu, recomputed = gnn_module.norm_relu, SavedTensors.recomputed
    gnn_module.norm_relu = lambda x, norm: torch.relu(norm(x))

    @contextmanager
    def keep(self, tensor, recipe):
        yield

    SavedTensors.recomputed = keep
    try:
        yield
    finally:
        gnn_module.norm_relu, SavedTensors.recomputed = norm_relu, recomputed


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_each_layer_saves_no_more_than_backward_reads(name, graph):
    saved = _saved_bytes_by_layer(_model(name), graph)
    for layer in range(3):
        assert saved.get(layer, 0) <= _bound(layer, graph.num_inner), (layer, saved)
    # The bound can fail: plain autograd keeps the ReLU's output and, for SAGE, the
    # dropped-out inputs its root weights read, on top.
    with _plain_autograd():
        plain = _saved_bytes_by_layer(_model(name), graph)
    assert any(plain.get(layer, 0) > _bound(layer, graph.num_inner) for layer in range(3))
    assert sum(plain.values()) > 1.3 * sum(saved.values())


def _gradients(model: GNN, graph: LocalGraph, epoch: int) -> list[torch.Tensor]:
    x = graph.features.clone().requires_grad_(True)
    propagate = Propagation(graph, graph.adjacency(model.norm), policy=None)
    target = torch.randn(graph.num_inner, C, generator=torch.Generator().manual_seed(7))
    model.zero_grad(set_to_none=True)
    out = model(x, propagate, epoch=epoch)
    (out * target).sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("transform_first", [True, False])
@pytest.mark.parametrize("layernorm", [True, False])
@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_recomputing_gives_plain_autogradss_outputs_and_gradients_bit_for_bit(
    name, layernorm, transform_first, graph
):
    """The ReLU's mask and each layer's dropped-out input, computed again in backward,
    give the bits plain autograd gives keeping them (the same kernels on the same values)."""
    model = _model(name, layernorm, transform_first)
    ours = _gradients(model, graph, epoch=3)
    with _plain_autograd():
        plain = _gradients(model, graph, epoch=3)
    for a, b in zip(ours, plain, strict=True):
        assert torch.equal(a, b)
    # And the comparison can fail: another epoch's masks give other gradients.
    assert not torch.equal(_gradients(model, graph, epoch=4)[2], ours[2])


@pytest.mark.parametrize("transform_first", [False, True])
@pytest.mark.parametrize("kernels", ["compiled", "torch"])
def test_masks_drawn_again_in_backward_equal_the_forwards(
    kernels, transform_first, graph, monkeypatch
):
    """Dropout's mask is drawn once in forward (its output stored here) and drawn again
    where backward recomputes a layer's input: the two are equal bit for bit."""
    model = _model("sage", transform_first=transform_first)
    model.dropout.kernels = kernels
    stored: list[torch.Tensor] = []
    replayed: list[torch.Tensor] = []
    forward, replay = Dropout.forward, Dropout.replay

    def storing_forward(self, x, keys=None, in_place=False):
        out = forward(self, x, keys, in_place)
        stored.append(out.detach().clone())
        return out

    def logged_replay(self, x, keys, in_place=False):
        out = replay(self, x, keys, in_place)
        replayed.append(out.clone())
        return out

    monkeypatch.setattr(Dropout, "forward", storing_forward)
    monkeypatch.setattr(Dropout, "replay", logged_replay)
    _gradients(model, graph, epoch=2)
    # Layer 0's input and layer 1's (read by SAGE's root weight), backward drawing them last
    # first; the last layer's input is kept where it aggregates first, drawn again where
    # it transforms first (its transform lets it go before making its gradient).
    assert len(stored) == 3 and len(replayed) == (3 if transform_first else 2)
    for before, again in zip(stored[: len(replayed)], replayed[::-1], strict=True):
        assert torch.equal(before, again)
    assert (stored[1] == 0).any() and (stored[1] != 0).any()  # dropout did drop


@pytest.mark.parametrize("kernels", ["compiled", "torch"])
def test_a_mask_drawn_in_place_equals_one_drawn_into_a_new_tensor(kernels):
    dropout = Dropout(0.5, kernels)
    keys = RowKeys.of(draw_key(0, 1, 1, Draw.DROPOUT), None, 50)
    x = torch.randn(50, 33)
    fresh = dropout.replay(x, keys)
    in_place = x.clone()
    assert dropout.replay(in_place, keys, in_place=True).data_ptr() == in_place.data_ptr()
    assert torch.equal(in_place, fresh)
    assert not torch.equal(fresh, x)


@pytest.mark.parametrize("layernorm", [True, False])
def test_norm_relu_equals_relu_of_the_norm_bit_for_bit(layernorm):
    torch.manual_seed(2)
    norm = nn.LayerNorm(37) if layernorm else nn.Identity()
    if layernorm:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    # Enough rows for several chunks of the mask unpacked, exact zeros and NaNs included.
    x = torch.randn(2 * recompute._CHUNK_VALUES // 37 + 5, 37)
    x[3] = 0.0
    x[5, :4] = float("nan")
    grad = torch.randn_like(x)
    results = []
    for fn in (norm_relu, lambda x, norm: torch.relu(norm(x))):
        x_ = x.clone().requires_grad_(True)
        norm.zero_grad(set_to_none=True)
        y = fn(x_, norm)
        y.backward(grad)
        results.append([y.detach(), x_.grad, *(p.grad for p in norm.parameters())])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
        assert torch.equal(a.isnan(), b.isnan())


@pytest.mark.parametrize("dim", [37, 64])
def test_mask_bits_have_the_quantizers_one_bit_layout_on_every_path(dim):
    """The CPU path (numpy's packbits) and the path elsewhere (``adaqp.quant.pack`` at one
    bit) lay the bits out alike, and unpack to the mask."""
    mask = torch.rand(50, dim) < 0.5
    packed = recompute._pack_mask(mask)
    assert packed.shape == (50, -(-dim // 8)) and packed.dtype == torch.uint8
    assert torch.equal(packed, pack(mask.view(torch.uint8), 1))
    assert torch.equal(recompute._unpack_mask(packed, dim), mask)
    assert torch.equal(unpack(packed, 1, dim) != 0, mask)


def test_norm_relu_keeps_only_its_input():
    norm = nn.LayerNorm(16)
    x = torch.randn(100, 16, requires_grad=True)
    kept: list[torch.Tensor] = []
    saved = SavedTensors(lambda layer, t: kept.append(t))
    with saved.hooks():
        norm_relu(x * 2, norm)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kept}
    params = {p.untyped_storage().data_ptr() for p in norm.parameters()}
    kept_bytes = sorted(n for ptr, n in storages.items() if ptr not in params)
    # x * 2, once; the ReLU's mask, 2 bytes a row; LayerNorm's mean and inverse deviation.
    assert kept_bytes == [100 * 2, 100 * 4, 100 * 4, 100 * 16 * 4]


def test_a_registered_tensor_is_saved_as_its_recipe_and_freed():
    """A tensor registered with a recipe is not kept by the nodes that save it (it is freed
    once the forward lets go of it) and comes back, view and all, from the recipe."""
    weight = torch.randn(8, 5, requires_grad=True)
    base = torch.randn(40, 8)
    calls = []

    def recipe():
        calls.append(1)
        return base * 2

    saved = SavedTensors()
    with saved.hooks():
        h = base * 2
        alive = weakref.ref(h)
        with saved.recomputed(h, recipe):
            out = h[10:30] @ weight  # mm saves the view h[10:30]
        del h
    gc.collect()
    assert alive() is None  # freed: the mm node holds the recipe, not the rows
    out.sum().backward()
    assert calls == [1]
    expected = (base * 2)[10:30].t() @ torch.ones(20, 5)
    assert torch.equal(weight.grad, expected)


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_evaluation_keeps_nothing_to_compute_again(name, graph, monkeypatch):
    """Without autograd no layer's input is computed again, so none is kept for it: no
    recipe is made, and a layer's rows before its norm are let go once the norm is done
    (they lived through the next layer, a [I, D] more at evaluation's peak). The logits
    are those of a forward that keeps them."""
    model = _model(name).eval()
    propagate = Propagation(graph, graph.adjacency(model.norm), policy=None)
    with torch.enable_grad():
        kept = model(graph.features, propagate).detach()
    made = []
    recipe = GNN._recipe
    monkeypatch.setattr(GNN, "_recipe", lambda self, *a: made.append(a) or recipe(self, *a))
    alive = []
    norm_relu_ = gnn_module.norm_relu

    def watch(x, norm):
        alive.append(weakref.ref(x))  # the rows before the norm
        return norm_relu_(x, norm)

    monkeypatch.setattr(gnn_module, "norm_relu", watch)
    conv = type(model.convs[1]).forward

    def second_layer(self, *args, **kwargs):
        if self is model.convs[1]:
            gc.collect()
            assert alive and alive[0]() is None, "layer 0's rows before its norm are alive"
        return conv(self, *args, **kwargs)

    monkeypatch.setattr(type(model.convs[1]), "forward", second_layer)
    with torch.no_grad():
        logits = model(graph.features, propagate)
    assert made == []
    assert torch.equal(logits, kept)
    alive.clear()
    # The check can fail: with autograd the rows are kept.
    with torch.enable_grad(), pytest.raises(AssertionError, match="alive"):
        model(graph.features, propagate)
