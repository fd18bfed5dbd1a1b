"""Quantized training is what it claims: one process, the whole graph, keyed rounding.

``adaqp-q`` at a uniform width ``b`` (``quant.scheme = "uniform"``) has a single-process
definition, because every rounding draw is keyed by global identity, never by the rank that
draws it (``adaqp/quant/draws.py``, ``HaloTransport.draw_keys``). Write ``Q(x, key)`` for
per-row stochastic quantization to ``b`` bits followed by dequantization: each row's own
float32 min and max, codes ``floor(t) + Bernoulli(frac t)`` with ``t = (x - min) / step``
and ``step = (max - min) / (2**b - 1)``, rebuilt as ``min(min + q·step, max)``; row u's
draws are keyed by ``(base key, u)``. Epochs count from 1, layers from 0 (the model's).

* Forward, a layer that aggregates rows ``h`` (the layer's input, or ``h W`` where the
  trainer transforms first: GCN's and SAGE's layers that do not widen, every GAT layer): an
  edge u -> v reads ``h[u]`` when u and v are on one part, else
  ``Q(h[u], (draw_key(seed, epoch, layer, FORWARD), u))``: one rounding of u's row, whichever
  part reads it.
* Backward: the gradient reaching ``h[u]`` is that of u's in-part edges (and of its other
  uses, SAGE's root term), exactly, plus for every other part p that reads u
  ``Q(g_p[u], (draw_key(seed, epoch, layer, BACKWARD, p), u))``, ``g_p[u]`` the gradient of
  u's edges into p (what rank p sends u's owner, who adds it).
* Dropout 0.5 (GAT's attention 0.6): masks keyed by (seed, epoch, layer) and global ids
  (edges' for attention), so the reference draws them for the whole graph as every rank
  draws them for its rows, halo rows of the cached input included.
* Layer 0 reads its input in full precision (the halo input is fetched once, unquantized).

The reference below builds that from the dataset and the part of every node: an adjacency
of ``(P + 1)·N`` columns, column ``N + p·N + u`` standing for u's row as part p receives it,
fed by one autograd function (``_Halo``) that rounds with the project's quantizer
(``quantize_mixed`` and ``dequantize_mixed`` with explicit keys). It shares only the model
definition, the initial weights, the keyed dropout and that quantizer with the distributed
run (at P = 2, GCN, SAGE and GAT at 2 and 8 bits without dropout and at 4 bits with it;
at P = 4, GCN and GAT at 2 bits, SAGE at 8). Wrong references (rows in full precision, forward
rounding under another seed, backward rounding without the sending rank, epochs counted
from 0) must not match.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaqp.data import load_dataset
from adaqp.graph.aggregate import SparseAdjacency, spmm
from adaqp.model.gnn import CONVS, GNN
from adaqp.model.transform import Handoff
from adaqp.partitioning.build import make_partition
from adaqp.quant.draws import Draw, RowKeys, draw_key
from adaqp.quant.mixed import dequantize_mixed, quantize_mixed
from tests.distributed import RecordingWriter, owner_of, run_workers
from tests.run.exactness import (
    close,
    close_weights,
    exact_config,
    flat_params,
    full_adjacency,
    rank_trainer,
    set_flat,
)

EPOCHS = 4
SEED = 7
"""``quant.seed``: not the default, so that a reference keyed by the default is wrong."""

LOSS_RTOL = 1e-5
"""Per-epoch losses, element-wise (relative to the largest), as the exact modes'. Measured:
the distributed runs are 2e-8 to 3.8e-7 from the reference; the wrong references 1.1e-4 or
more. A rounding draw near its threshold could flip where the reference's row differs from
the owner's by float rounding (its own summation order): perturbing every rounded row and
gradient by 2e-7 (relative, about 2 ulp) moved the reference's losses by at most 1.6e-7
in 45 runs (P = 2, 5 epochs); only 2e-6 (about 20 ulp) reached 5.3e-5, in 2 of 5 GAT runs
at 8 bits."""

WEIGHTS_RTOL = 1e-3
"""Final weights, relative L2 norm: the coarse check (see tests/exchange/
test_stale_reference.py on Adam). Measured 8e-8 to 1.1e-5; the 2-ulp perturbations above
at most 2e-5, the 20-ulp ones 3.3e-3."""

# (model, bits, dropout): the cases every distributed run trains, one name each.
CASES = {
    2: [(m, b, False) for m in ("gcn", "sage", "gat") for b in (2, 8)]
    + [(m, 4, True) for m in ("gcn", "sage", "gat")],
    4: [("gcn", 2, False), ("sage", 8, False), ("gat", 2, False)],
}


def _name(model: str, bits: int, dropout: bool) -> str:
    return f"{model}-{bits}bit" + ("-dropout" if dropout else "")


def _config(model: str, part_dir: str, bits: int, dropout: bool):
    """The exactness tests' config (3 layers, LayerNorm), adaqp-q at a uniform width."""
    extra = (
        f"train.epochs={EPOCHS}",
        "train.eval_every=1000",
        "comm.mode=adaqp-q",
        "quant.scheme=uniform",
        f"quant.bits={bits}",
        "quant.full_precision=never",  # quantized over loopback too
        f"quant.seed={SEED}",
        # Every row computed: a layer as wide out as in then transforms first, as the
        # reference's does (on the loss's rows it may not: adaqp/model/first.py).
        "train.compute_rows=all",
    )
    return exact_config(model, part_dir, extra, dropout=dropout)


def _worker(rank, world_size, init_method, part_dir: str, cases):
    result = {}
    for model, bits, dropout in cases:
        name = _name(model, bits, dropout)
        config = _config(model, part_dir, bits, dropout)
        with rank_trainer(config, init_method + name, rank, world_size, part_dir) as (
            trainer,
            graph,
        ):
            result[f"{name}/initial"] = flat_params(trainer.model)
            records = RecordingWriter()
            trainer.fit(records)
            result[f"{name}/losses"] = np.array([r.train_loss for r in records.records])
            result[f"{name}/weights"] = flat_params(trainer.model)
            result["global_ids"] = graph.global_ids  # one partition: every case's
    return result


def _round(x: torch.Tensor, bits: int, base: np.uint64) -> torch.Tensor:
    """``Q(x)``: every row quantized to ``bits`` and back, row u keyed by ``(base, u)`` (the
    whole graph's row index is the global id): the transport's quantizer, called directly."""
    widths = torch.full((x.shape[0],), bits, dtype=torch.int8)
    keys = RowKeys.of(base, count=x.shape[0])
    return dequantize_mixed(quantize_mixed(x.detach(), widths, keys=keys), widths, x.shape[1])


@dataclass(frozen=True)
class Rounding:
    """How the reference rounds (the right way by default; the fields name wrong ones)."""

    bits: int
    parts: int
    exact: bool = False
    """Halo rows and gradients in full precision (Vanilla)."""
    forward_seed: int = SEED
    sender: bool = True
    """The backward base key hashes the sending part."""
    first_epoch: int = 1
    """What the first epoch is numbered in the keys."""

    def forward(self, h: torch.Tensor, epoch: int, layer: int) -> torch.Tensor:
        if self.exact:
            return h.detach().clone()
        epoch += self.first_epoch - 1
        return _round(h, self.bits, draw_key(self.forward_seed, epoch, layer, Draw.FORWARD))

    def backward(self, g: torch.Tensor, epoch: int, layer: int, part: int) -> torch.Tensor:
        if self.exact:
            return g
        epoch += self.first_epoch - 1
        sender = (part,) if self.sender else ()
        return _round(g, self.bits, draw_key(SEED, epoch, layer, Draw.BACKWARD, *sender))


class _Halo(torch.autograd.Function):
    """``h`` [N, D] -> ``[P·N, D]``: block p holds the rows part p receives (all rows, the
    unread ones never reach an edge). Backward: block p's gradient (rank p's partial sums;
    zero rows for nodes p does not read, which round to zero) rounded with p's key, summed."""

    @staticmethod
    def forward(ctx, h, rounding: Rounding, epoch: int, layer: int):
        ctx.rounding, ctx.epoch, ctx.layer = rounding, epoch, layer
        return rounding.forward(h, epoch, layer).repeat(rounding.parts, 1)

    @staticmethod
    def backward(ctx, grad):
        rounding, n = ctx.rounding, grad.shape[0] // ctx.rounding.parts
        blocks = grad.contiguous().split(n)
        args = (ctx.epoch, ctx.layer)
        total = sum(rounding.backward(g, *args, p) for p, g in enumerate(blocks))
        return total, None, None, None


def _halo_adjacency(graph, owner: np.ndarray, norm: str) -> SparseAdjacency:
    """The whole graph's aggregation ``[N, (P + 1)·N]`` (GAT: its edges and self-loops,
    valued 1), every cross-part edge u -> v re-pointed at column ``N + owner(v)·N + u``;
    every column keyed by its node's global id (attention dropout's edge keys)."""
    n, parts = graph.num_nodes, int(owner.max()) + 1
    if norm == "gat":
        dst = np.concatenate([np.repeat(np.arange(n), np.diff(graph.indptr)), np.arange(n)])
        src = np.concatenate([graph.indices, np.arange(n)]).astype(np.int64)
        values = np.ones(len(src), dtype=np.float32)
    else:
        full = full_adjacency(graph, norm).numpy()
        dst, src = np.nonzero(full)
        values = full[dst, src]
    cols = np.where(owner[src] != owner[dst], n + owner[dst] * n + src, src)
    order = np.lexsort((cols, dst))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
    shape = (n, (parts + 1) * n)
    col_ids = np.tile(np.arange(n, dtype=np.int64), parts + 1)
    return SparseAdjacency.from_csr(indptr, cols[order], values[order], shape, col_ids=col_ids)


def _reference(graph, adjacency, case: tuple, initial: np.ndarray, rounding: Rounding):
    """Whole-graph training of ``case`` from ``initial``, halo reads rounded by ``rounding``;
    returns the per-epoch losses and the final weights."""
    model_name, bits, dropout = case
    config = _config(model_name, "unused", bits, dropout)
    torch.manual_seed(0)
    # The distributed run's flags: they decide which tensor a layer exchanges (h or h W).
    model = GNN(
        config.model, graph.feature_dim, graph.num_classes, True, True, seed=config.train.seed
    )
    set_flat(model, initial)
    x = torch.from_numpy(graph.features)
    y = torch.from_numpy(graph.labels).long()
    mask = torch.from_numpy(graph.train_mask)
    train = config.train
    optimizer = torch.optim.Adam(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    every = slice(0, graph.num_nodes)

    def propagate(
        h, layer, finish=lambda agg, rows: agg, aggregate=None, transform=None, first=None, epoch=1
    ):
        root = None
        if first is not None:  # transformed first: the rows exchanged are h W
            h, root = first(h.take() if isinstance(h, Handoff) else h, graph.num_nodes)
        cached = layer == 0  # the cached input: every part reads it exactly
        halo = h.repeat(rounding.parts, 1) if cached else _Halo.apply(h, rounding, epoch, layer)
        rows = torch.cat([h, halo])
        agg = spmm(adjacency, rows) if aggregate is None else aggregate(adjacency, rows, every)
        agg = agg if root is None else root + agg  # SAGE's root term
        return finish(agg if transform is None else transform(agg), every)

    losses = []
    for epoch in range(1, EPOCHS + 1):
        optimizer.zero_grad()
        # Rows keyed by their index, the global id: the masks every rank draws.
        logits = model(x, partial(propagate, epoch=epoch), epoch)
        loss = F.cross_entropy(logits[mask], y[mask])
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return torch.tensor(losses), weights


def _wrong(rounding: Rounding) -> dict[str, Rounding]:
    """References that are not the distributed run: their losses must miss it. Rows in
    full precision in every case; at 2 bits also each key changed in one of its parts. (At
    8 bits a forward rounding under another seed moves GCN's losses by only 4.6e-6 (P = 4)
    to 2.5e-5, measured, about the tolerance; at 2 bits each wrong key misses by 1.3e-3 or
    more.)"""
    wrong = {"full-precision halo": replace(rounding, exact=True)}
    if rounding.bits == 2:
        wrong["forward under another seed"] = replace(rounding, forward_seed=SEED + 1)
        wrong["backward without the sender"] = replace(rounding, sender=False)
        wrong["epochs from 0"] = replace(rounding, first_epoch=0)
    return wrong


@pytest.fixture(scope="module")
def cora():
    return load_dataset("cora")


def _loss_error(result, name: str, losses: torch.Tensor) -> float:
    """The largest loss difference, relative to the largest loss (what ``close`` bounds)."""
    return float(np.abs(result[f"{name}/losses"] - losses.numpy()).max() / losses.abs().max())


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4], ids=["P=2", "P=4"])
def test_quantized_mode_matches_the_single_process_reference(world_size, cora, tmp_path):
    """Every case of ``CASES``: each rank's per-epoch losses and final weights are the
    reference's; the wrong references' losses are not."""
    part_dir = tmp_path / "parts"
    spec = _config("gcn", "", 2, False).data.spec()
    make_partition(cora, part_dir, num_parts=world_size, spec=spec)
    cases = CASES[world_size]
    results = run_workers(_worker, world_size, tmp_path, str(part_dir), cases)
    owner = owner_of([r["global_ids"] for r in results], cora.num_nodes)
    adjacencies: dict[str, SparseAdjacency] = {}
    for case in cases:
        name, norm = _name(*case), CONVS[case[0]].norm
        if norm not in adjacencies:
            adjacencies[norm] = _halo_adjacency(cora, owner, norm)
        initial = results[0][f"{name}/initial"]
        rounding = Rounding(case[1], world_size)
        losses, weights = _reference(cora, adjacencies[norm], case, initial, rounding)
        for r in results:
            close(r[f"{name}/losses"], losses, LOSS_RTOL, f"{name} losses, P={world_size}")
            close_weights(r[f"{name}/weights"], weights, WEIGHTS_RTOL, f"{name} weights")
        said = [f"P={world_size} {name}: {_loss_error(results[0], name, losses):.1e}"]
        for what, wrong in _wrong(rounding).items():
            wrong_losses, _ = _reference(cora, adjacencies[norm], case, initial, wrong)
            said.append(f"{what} {_loss_error(results[0], name, wrong_losses):.1e}")
            with pytest.raises(AssertionError):
                close(results[0][f"{name}/losses"], wrong_losses, LOSS_RTOL, what)
        print(", ".join(said))  # the measured loss differences (pytest -s)
