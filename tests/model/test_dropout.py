"""Tests for adaqp.model.dropout: nn.Dropout's distribution from a mask keyed by global ids.

Keep rate and scaling (statistically, and bit for bit against nn.Dropout's kept values), the
gradient through the same mask, the compiled and torch paths equal bit for bit, independence
from the thread count, and what makes P workers equal one process: a value's mask is a
function of (base key, the row's global id, column) alone, so a rank's call equals the
whole graph's call restricted to its rows, and ranks seeded alike do not share masks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaqp.config import ModelConfig
from adaqp.model.dropout import Dropout, keep_scale
from adaqp.model.gnn import GNN
from adaqp.quant import kernels as quant_kernels
from adaqp.quant.draws import Draw, RowKeys, draw_key

PATHS = ["compiled", "torch"]


def _keys(rows: int, epoch: int = 1, ids=None) -> RowKeys:
    return RowKeys.of(draw_key(0, epoch, 0, Draw.DROPOUT), ids, rows)


@pytest.mark.parametrize("kernels", PATHS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_scale(p: float, kernels: str):
    torch.manual_seed(int(p * 10))
    x = torch.rand(300, 700) + 0.5  # no zeros: a zero output means dropped
    y = Dropout(p, kernels)(x, _keys(300))
    kept = y != 0
    n = x.numel()
    rate = kept.double().mean().item()
    assert abs(rate - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / n)
    # Kept values are x / (1 - p), bit for bit nn.Dropout's (same float32 scale, one multiply).
    reference = F.dropout(x, p, True)
    scale = keep_scale(p)
    assert torch.equal(y[kept], x[kept] * scale)
    assert torch.equal(reference[reference != 0], x[reference != 0] * scale)
    assert (y[~kept] == 0).all()
    # No stripes: the keep rate of every column block and row block is 1 - p within noise.
    for blocks in (kept.view(300, 7, 100).double().mean((0, 2)), kept.double().mean(1)):
        count = n / blocks.numel()
        assert ((blocks - (1 - p)).abs() <= 5 * math.sqrt(p * (1 - p) / count)).all()
    # Its expectation is x: the mean of y / x over all values is 1 within noise.
    ratio = (y / x).double().mean().item()
    assert abs(ratio - 1) <= 5 * scale * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("kernels", PATHS)
def test_gradient_goes_through_the_same_mask(kernels: str):
    torch.manual_seed(3)
    x = (torch.rand(64, 50) + 0.5).requires_grad_()
    dropout = Dropout(0.4, kernels)
    y = dropout(x, _keys(64))
    grad = torch.randn(64, 50)
    y.backward(grad)
    scale = keep_scale(0.4)
    assert torch.equal(x.grad, torch.where(y != 0, grad * scale, grad * 0.0))
    # Another epoch draws another mask; the same keys the same one.
    assert not torch.equal(dropout(x, _keys(64, epoch=2)) != 0, y != 0)
    assert torch.equal(dropout(x, _keys(64)), y)


@pytest.mark.parametrize("shape", [(1, 1), (37, 3), (200, 300), (5000, 2), (9,)])
def test_the_compiled_and_torch_paths_draw_the_same_mask(shape):
    """Bit for bit (the torch path is CUDA's and other dtypes'), from the serial kernel, the
    parallel one (60000 values) and a 1-D tensor (one value a row)."""
    x = torch.rand(shape) + 0.5
    ids = np.random.default_rng(1).choice(10**9, shape[0], replace=False)
    keys = _keys(shape[0], ids=ids)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        y = Dropout(0.5, "compiled")(x, keys)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(y, Dropout(0.5, "torch")(x, keys))
    # Another dtype takes the torch path: the same mask, nn.Dropout's float64 scale.
    y64 = Dropout(0.5)(x.double(), keys)
    assert torch.equal(y64 != 0, y != 0)
    assert torch.equal(y64[y64 != 0], x.double()[y64 != 0] * 2.0)


def test_masks_ignore_the_thread_count():
    x = torch.rand(200, 200) + 0.5  # 40000 values: the prange kernel when threads > 1
    dropout = Dropout(0.5, "compiled")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = dropout(x, _keys(200))
        torch.set_num_threads(2)
        again = dropout(x, _keys(200))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first, again)


@pytest.mark.parametrize("kernels", PATHS)
def test_a_ranks_mask_is_the_whole_graphs_on_its_rows(kernels: str):
    """What makes P workers equal one process. Two ranks, seeded alike, each hold some nodes
    of a 500-node graph in their own order (and one holds a node of the other as a halo
    row). Each rank's mask is the whole graph's mask (keys 0..N-1) on its rows, so the two
    ranks' masks differ where their nodes differ: with masks drawn per local row, as before,
    rank 0's first 300 rows would have taken rank 1's first 300 rows' mask."""
    x_full = torch.rand(500, 40) + 0.5
    dropout = Dropout(0.5, kernels)
    full = dropout(x_full, _keys(500))
    rng = np.random.default_rng(7)
    order = rng.permutation(500)
    ranks = [np.append(order[:300], order[300]), order[300:]]  # rank 0 holds node 300 as halo
    masks = []
    for ids in ranks:
        torch.manual_seed(0)  # every rank seeds alike: nothing may hang on the generator
        y = dropout(x_full[ids], _keys(len(ids), ids=ids))
        assert torch.equal(y, full[ids])
        masks.append(y != 0)
    shared = min(len(ranks[0]), len(ranks[1]))
    assert not torch.equal(masks[0][:shared], masks[1][:shared])
    assert torch.equal(masks[0][-1], masks[1][0])  # the halo row as its owner drops it


def test_identity_in_evaluation_and_at_zero_without_drawing():
    x = torch.randn(10, 10)
    state = torch.get_rng_state()
    assert Dropout(0.0)(x) is x
    evaluation = Dropout(0.5)
    evaluation.eval()
    assert evaluation(x) is x
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)
    # Training needs the keys: a mask drawn without them could differ between ranks.
    with pytest.raises(ValueError, match="keys"):
        Dropout(0.5)(x)
    Dropout(0.5, "torch")(x, _keys(10))
    assert torch.equal(torch.get_rng_state(), state)  # keyed: torch's generator untouched


def test_the_model_uses_it_and_keys_it_by_epoch_and_layer():
    model = GNN(ModelConfig(dropout=0.3), 5, 2, kernels="torch")
    assert isinstance(model.dropout, Dropout) and model.dropout.p == 0.3
    assert model.dropout.kernels == "torch"
    x = torch.rand(30, 5)

    def propagate(h, layer, finish=lambda agg, rows: agg, transform=None):
        return finish(h if transform is None else transform(h), slice(0, 30))

    with pytest.raises(ValueError, match="pass the epoch"):
        model(x, propagate)
    first = model(x, propagate, epoch=1)
    assert torch.equal(model(x, propagate, epoch=1), first)
    assert not torch.equal(model(x, propagate, epoch=2), first)
    # Rows keyed by global id: the rows of nodes 0..29 in another order give those rows.
    perm = np.random.default_rng(0).permutation(30)
    torch.testing.assert_close(model(x[perm], propagate, 1, row_ids=perm), first[perm])


def test_each_model_keeps_the_kernels_it_was_built_with(monkeypatch):
    """The path is fixed when a model is built (``auto`` unless chosen) and passed to every
    dropout in it (GAT's attention dropout too): two models in one process each run their
    own, and the process default, set afterwards, changes neither (it used to be read at
    every call by a model built without a choice)."""
    config = ModelConfig(dropout=0.5)
    # Built first: a model on the compiled path loads (or, on a cold cache, compiles) the
    # kernels as it is built, which the stand-ins below could not.
    models = {"auto": GNN(config, 5, 2), "torch": GNN(config, 5, 2, kernels="torch")}
    gat = GNN(ModelConfig(name="gat", attn_dropout=0.5), 5, 2, kernels="torch")
    compiled = quant_kernels.compiled_module()
    calls = []
    for name in ("masked_scale_serial", "masked_scale_parallel"):
        kernel = getattr(compiled, name)
        monkeypatch.setattr(compiled, name, lambda *a, k=kernel: calls.append(1) or k(*a))
    assert all(d.kernels == "torch" for d in gat.modules() if isinstance(d, Dropout))
    x = torch.rand(30, 5)

    def propagate(h, layer, finish=lambda agg, rows: agg, transform=None):
        return finish(h if transform is None else transform(h), slice(0, 30))

    previous = quant_kernels.set_kernels("torch")
    try:
        calls.clear()
        models["auto"](x, propagate, epoch=1)  # float32 on the CPU: the compiled kernel
        assert calls
        quant_kernels.set_kernels("compiled")
        calls.clear()
        models["torch"](x, propagate, epoch=1)
        assert not calls
    finally:
        quant_kernels.set_kernels(previous)
