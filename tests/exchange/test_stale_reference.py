"""Stale training is what it claims: one process, the whole graph, a ring of past rows.

Stale-by-S training has a single-process definition. Every cross-part edge v -> u (v and u
on different parts) reads v's row as it was S epochs earlier (forward) and returns u's
gradient for it S epochs late (backward); in-part edges read the current epoch. The
reference below builds exactly that from the dataset and the part of every node, with its
own dense adjacency and autograd function; it shares only the model definition and the
initial weights with the distributed run (GAT's reference attends with the project's
attention, checked on its own against a dense GAT in tests/model/test_gat.py, over the
whole graph with a stale copy of every cross-part source). The distributed mode (``onebit`` at
``staleness.bits = 32``, ``landing = "fixed"``, dropout 0) must match it to float
tolerance, and must not match the references one epoch fresher or staler.

Under ``landing = "newest"`` what a layer reads depends on which exchanges have landed;
with a landing schedule injected (``tests/exchange/landings.py``) it depends on the
schedule alone, and the reference chooses by the same schedule: per exchange, the newest
landed buffer started within the bound, else the oldest within it. With smoothing, each
chosen buffer enters the moving average once; a buffer chosen again (nothing newer has
landed) leaves the average as it is.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaqp.data import load_dataset
from adaqp.exchange.transport import Direction, ExchangeKey
from adaqp.graph.aggregate import SparseAdjacency
from adaqp.model.gnn import GNN
from adaqp.model.transform import Handoff
from adaqp.partitioning.build import make_partition
from tests.distributed import RecordingWriter, owner_of, run_workers
from tests.exchange.landings import delay_landings, schedule_landings
from tests.run.exactness import (
    close,
    close_weights,
    exact_config,
    flat_params,
    full_adjacency,
    rank_trainer,
    set_flat,
)

EPOCHS = 6
MODELS = ("gcn", "sage", "gat")

LOSS_RTOL = 1e-5
"""Per-epoch losses, element-wise (relative to the largest): the tight check. Epoch t's
loss is computed with the weights after t - 1 steps, so it checks every step but the
last; the references one epoch fresher or staler miss it (asserted below)."""

WEIGHTS_RTOL = 5e-3
"""Final weights, relative L2 norm: a coarse check of the last step. Adam divides each
element's step by the size of its own gradient, so an element whose gradient is a
near-cancelling sum moves by up to ``lr`` per step either way with the summation order
of another CPU. Here the distributed runs match the reference to 1-6e-7, but CI's
machine once measured 4.3e-4 on the stale GCN at P = 2 with every loss within 1e-5;
the references one epoch fresher or staler are 0.018-0.064 away."""


STALE = (
    f"train.epochs={EPOCHS}",
    "train.eval_every=1000",
    "comm.mode=onebit",
    "staleness.bits=32",
    "staleness.landing=fixed",
    "staleness.smoothing=0",
)


def _config(model: str, part_dir: str, extra: tuple[str, ...] = ()):
    """The exactness test's config (dropout 0, 3 layers), trained stale, every row
    computed (a layer as wide out as in then transforms first, as the reference's does;
    on the loss's rows it may not: adaqp/model/first.py)."""
    return exact_config(model, part_dir, (*STALE, *extra, "train.compute_rows=all"))


# Per direction, the epochs after its start at which the exchange started at epoch s
# (1..6) lands. Forward: read at once (epochs 1, 2, 5), one epoch late, and chosen again
# where the next has not landed (epochs 3, 6). Backward: blocked on at epoch 1, chosen
# again at ages 1 and 2, blocked on at age 2 where nothing within the bound has landed
# (epoch 4).
LANDING_DELAYS = {Direction.FORWARD: (0, 0, 1, 3, 0, 2), Direction.BACKWARD: (1, 5, 5, 5, 0, 5)}


def scheduled(key: ExchangeKey, started: int, now: int) -> bool:
    """Whether the exchange of ``key`` started at epoch ``started`` has landed at ``now``."""
    return now >= started + LANDING_DELAYS[key.direction][started - 1]


def _worker(
    rank,
    world_size,
    init_method,
    part_dir: str,
    extra: tuple[str, ...],
    delay: float,
    models: tuple[str, ...] = MODELS,
    landed=None,
):
    """Trains each model for EPOCHS epochs; ``delay``: rank 1's exchanges land that late;
    ``landed``: a landing schedule for every rank (see ``scheduled``)."""
    result = {}
    for model in models:
        config = _config(model, part_dir, extra)
        with rank_trainer(config, init_method + model, rank, world_size, part_dir) as (
            trainer,
            graph,
        ):
            delay_landings(trainer.transport, delay if rank == 1 else 0.0)
            if landed is not None:
                schedule_landings(trainer, landed)
            result[f"{model}/initial"] = flat_params(trainer.model)
            records = RecordingWriter()
            trainer.fit(records)
            result[f"{model}/losses"] = np.array([r.train_loss for r in records.records])
            result[f"{model}/staleness"] = np.array([r.max_staleness for r in records.records])
            result[f"{model}/effective"] = np.array(
                [r.effective_staleness for r in records.records]
            )
            result[f"{model}/weights"] = flat_params(trainer.model)
            result[f"{model}/global_ids"] = graph.global_ids
    return result


class _Ring:
    """Past rows and past cross-part gradients, by (layer, epoch); with ``smoothing = g``
    also their moving averages by exchange (what the layer then reads). ``ages``: per
    epoch, the age of every read under the average's weights. ``blend_again``: a buffer
    read again is blended again (what the comparison must tell apart)."""

    def __init__(self, smoothing: float = 0.0, blend_again: bool = False):
        self.blend_again = blend_again
        self.rows: dict[tuple[int, int], torch.Tensor] = {}
        self.grads: dict[tuple[int, int], torch.Tensor] = {}
        self.smoothing = smoothing
        self.averages: dict[ExchangeKey, torch.Tensor] = {}
        # Per exchange: (the epoch whose buffer was read last, the mean epoch of what the
        # layer read, under the average's weights).
        self.last: dict[ExchangeKey, tuple[int, float]] = {}
        self.ages: dict[int, list[float]] = {}

    def smooth(
        self, key: ExchangeKey, epoch: int, source: int, value: torch.Tensor, fresh: bool
    ) -> torch.Tensor:
        """``value`` (epoch ``source``'s), or its moving average; a synchronous read
        restarts the average, a buffer read again leaves it as it is."""
        g, last = self.smoothing, self.last.get(key)
        if not g or last is None or fresh:
            mean = float(source)
            self.averages[key] = value.clone()
        elif last[0] == source and not self.blend_again:
            mean = last[1]
        else:
            mean = g * last[1] + (1 - g) * source
            self.averages[key] = self.averages[key] * g + value * (1 - g)
        self.last[key] = (source, mean)
        self.ages.setdefault(epoch, []).append(epoch - mean)
        return self.averages[key].clone()


class _Stale(torch.autograd.Function):
    """Forward: the rows of epoch ``sources[0]`` (this epoch's are kept for later).
    Backward: the cross-part gradient of epoch ``sources[1]`` (this epoch's are kept)."""

    @staticmethod
    def forward(ctx, h, ring: _Ring, layer: int, epoch: int, sources: tuple, fresh: bool):
        ctx.ring, ctx.layer, ctx.epoch, ctx.sources, ctx.fresh = ring, layer, epoch, sources, fresh
        ring.rows[layer, epoch] = h.detach().clone()
        rows = ring.rows[layer, sources[0]]
        return ring.smooth(ExchangeKey.forward(layer), epoch, sources[0], rows, fresh)

    @staticmethod
    def backward(ctx, grad):
        ring, layer, epoch, source = ctx.ring, ctx.layer, ctx.epoch, ctx.sources[1]
        ring.grads[layer, epoch] = grad.detach().clone()
        grads = ring.grads[layer, source]
        return ring.smooth(ExchangeKey.backward(layer), epoch, source, grads, ctx.fresh), *[
            None
        ] * 5


def newest_landed(landed, bound: int, keys, epochs: int) -> dict[tuple[ExchangeKey, int], int]:
    """Per exchange and epoch t, the epoch whose buffer ``landing = "newest"`` reads under
    the schedule ``landed``: the newest started within the bound (at t - bound or later)
    that has landed, or was read before (waited for); if none has, the oldest of them."""
    chosen = {}
    for key in keys:
        last = 0
        for t in range(1, epochs + 1):
            within = range(max(1, t - bound), t + 1)
            ready = [s for s in within if landed(key, s, t) or s == last]
            last = chosen[key, t] = max(ready) if ready else within[0]
    return chosen


def _stale_reference(
    graph,
    owner: np.ndarray,
    model_name: str,
    initial,
    staleness: int,
    warmup: int = 0,
    smoothing: float = 0.0,
    fresh_last: bool = False,
    landed=None,
    blend_again: bool = False,
):
    """Whole-graph training in which cross-part edges read rows ``staleness`` epochs old
    (epoch 1's in the first epochs), or with a landing schedule ``landed`` those that
    ``newest_landed`` chooses; layer 0 reads the input, which never changes. The
    first ``warmup`` epochs, and with ``fresh_last`` the last layer, read the current
    epoch; ``smoothing`` averages what cross-part edges read (rows and gradients).
    Returns the losses, the final weights and per epoch the mean age of the reads."""
    config = _config(model_name, "unused")
    last = config.model.layers - 1
    torch.manual_seed(0)
    # The distributed run's flags: they decide which tensor a layer exchanges (h or h W).
    model = GNN(config.model, graph.feature_dim, graph.num_classes, True, cached_input=True)
    set_flat(model, initial)
    if model_name == "gat":
        whole, mixed = _attention_edges(graph, owner)
    else:
        full = full_adjacency(graph, model.norm)
        own = torch.from_numpy(owner)
        cross = full * (own[:, None] != own[None, :])
        inside = full - cross
    x = torch.from_numpy(graph.features)
    y = torch.from_numpy(graph.labels).long()
    mask = torch.from_numpy(graph.train_mask)
    train = config.train
    optimizer = torch.optim.Adam(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    ring, losses = _Ring(smoothing, blend_again), []
    keys = [ExchangeKey(layer, d) for layer in range(1, last + 1) for d in LANDING_DELAYS]
    newest = newest_landed(landed, staleness, keys, EPOCHS) if landed is not None else {}
    for epoch in range(1, EPOCHS + 1):

        def fresh(layer: int, e: int = epoch) -> bool:
            return e <= warmup or (fresh_last and layer == last) or staleness == 0

        def source(layer: int, e: int = epoch) -> tuple[int, int]:
            if fresh(layer, e):
                return e, e
            if newest:
                return newest[ExchangeKey.forward(layer), e], newest[ExchangeKey.backward(layer), e]
            return max(1, e - staleness), max(1, e - staleness)

        def propagate(
            h,
            layer,
            finish=lambda agg, rows: agg,
            aggregate=None,
            transform=None,
            first=None,
            e=epoch,
        ):
            if first is not None:  # transformed first: the rows exchanged are h W
                h = h.take() if isinstance(h, Handoff) else h
                hw, root = first(h, h.shape[0])
                added = finish if root is None else lambda agg, rows: finish(root + agg, rows)
                return propagate(hw, layer, added, aggregate, e=e)
            if transform is not None:
                transformed = lambda agg, rows: finish(transform(agg), rows)  # noqa: E731
                return propagate(h, layer, transformed, aggregate, e=e)
            every = slice(0, h.shape[0])
            if aggregate is not None:  # GAT: fresh rows, then stale copies, as sources
                if layer == 0:
                    return finish(aggregate(whole, h, every), every)
                stale = _Stale.apply(h, ring, layer, e, source(layer), fresh(layer))
                return finish(aggregate(mixed, torch.cat([h, stale]), every), every)
            if layer == 0:
                return finish(full @ h, every)
            stale = _Stale.apply(h, ring, layer, e, source(layer), fresh(layer))
            return finish(inside @ h + cross @ stale, every)

        optimizer.zero_grad()
        loss = F.cross_entropy(model(x, propagate)[mask], y[mask])
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ages = [float(np.mean(ring.ages[e])) for e in range(1, EPOCHS + 1)]
    return torch.tensor(losses), weights, np.array(ages)


def _attention_edges(graph, owner: np.ndarray):
    """GAT's edges of the whole graph (with self-loops), ``[N, N]``, and the same with
    every cross-part source pointing at its stale copy, column ``N + v``: ``[N, 2N]``."""
    n = graph.num_nodes
    dst = np.concatenate([np.repeat(np.arange(n), np.diff(graph.indptr)), np.arange(n)])
    src = np.concatenate([graph.indices, np.arange(n)])
    order = np.lexsort((src, dst))
    dst, src = dst[order], src[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
    ones = np.ones(len(src), dtype=np.float32)
    whole = SparseAdjacency.from_csr(indptr, src, ones, (n, n))
    mixed_src = np.where(owner[dst] != owner[src], src + n, src)
    # Re-pointing keeps each row's sources sorted within fresh and stale copies apart.
    order = np.lexsort((mixed_src, dst))
    mixed = SparseAdjacency.from_csr(indptr, mixed_src[order], ones, (n, 2 * n))
    return whole, mixed


@pytest.fixture(scope="module")
def cora():
    return load_dataset("cora")


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("world_size", "models"), [(2, MODELS), (4, ("gcn", "sage"))], ids=["P=2", "P=4"]
)
def test_stale_mode_matches_the_single_process_stale_reference(world_size, models, cora, tmp_path):
    part_dir = tmp_path / "parts"
    make_partition(cora, part_dir, num_parts=world_size, spec=_config("gcn", "").data.spec())
    # Rank 1's exchanges land late: under the fixed landing rule that changes nothing.
    results = run_workers(_worker, world_size, tmp_path, str(part_dir), (), 0.05, models)
    owner = owner_of([r[f"{MODELS[0]}/global_ids"] for r in results], cora.num_nodes)
    for model in models:
        initial = results[0][f"{model}/initial"]
        losses, weights, _ = _stale_reference(cora, owner, model, initial, staleness=1)
        for r in results:
            assert r[f"{model}/staleness"].tolist() == [0] + [1] * (EPOCHS - 1)
            close(r[f"{model}/losses"], losses, LOSS_RTOL, f"{model} losses, P={world_size}")
            close_weights(
                r[f"{model}/weights"], weights, WEIGHTS_RTOL, f"{model} weights, P={world_size}"
            )
        # Both comparisons can fail: one epoch fresher or staler is another run.
        for other in (0, 2):
            wrong_losses, wrong, _ = _stale_reference(cora, owner, model, initial, staleness=other)
            with pytest.raises(AssertionError):
                close(results[0][f"{model}/losses"], wrong_losses, LOSS_RTOL, f"S={other}")
            with pytest.raises(AssertionError):
                close_weights(results[0][f"{model}/weights"], wrong, WEIGHTS_RTOL, f"S={other}")


@pytest.mark.distributed
def test_fixed_landing_makes_stale_runs_independent_of_timing(cora, tmp_path):
    """One-bit, S = 1, landing "fixed": a run whose rank 1 lands every exchange 50 ms late
    ends bitwise equal to one without the delay (under "newest" the late rank would use
    older rows on some epochs)."""
    part_dir = tmp_path / "parts"
    make_partition(cora, part_dir, num_parts=2, spec=_config("gcn", "").data.spec())
    extra, models = ("staleness.bits=1",), ("gcn",)
    prompt = run_workers(_worker, 2, tmp_path, str(part_dir), extra, 0.0, models)
    late = run_workers(_worker, 2, tmp_path, str(part_dir), extra, 0.05, models)
    for a, b in zip(prompt, late, strict=True):
        for model in models:
            np.testing.assert_array_equal(a[f"{model}/weights"], b[f"{model}/weights"])
            np.testing.assert_array_equal(a[f"{model}/losses"], b[f"{model}/losses"])


@pytest.mark.distributed
def test_compensations_match_the_reference_with_the_same_compensations(cora, tmp_path):
    """Warm-up (2 synchronous epochs), smoothing (0.9) and a fresh last layer, all on at
    once, P = 2: the distributed run is the reference with the same three changes, and
    not the plain stale reference."""
    part_dir = tmp_path / "parts"
    make_partition(cora, part_dir, num_parts=2, spec=_config("gcn", "").data.spec())
    extra = (
        "staleness.warmup_epochs=2",
        "staleness.smoothing=0.9",
        "staleness.fresh_last_layer=true",
    )
    results = run_workers(_worker, 2, tmp_path, str(part_dir), extra, 0.0)
    owner = owner_of([r[f"{MODELS[0]}/global_ids"] for r in results], cora.num_nodes)
    for model in MODELS:
        initial = results[0][f"{model}/initial"]
        options = dict(warmup=2, smoothing=0.9, fresh_last=True)
        losses, weights, _ = _stale_reference(cora, owner, model, initial, 1, **options)
        for r in results:
            # Layer 1 is stale from epoch 3 on; the last layer (2) never is.
            assert r[f"{model}/staleness"].tolist() == [0, 0] + [1] * (EPOCHS - 2)
            close(r[f"{model}/losses"], losses, LOSS_RTOL, f"{model} losses")
            close_weights(r[f"{model}/weights"], weights, WEIGHTS_RTOL, f"{model} weights")
        plain_losses, plain, _ = _stale_reference(cora, owner, model, initial, 1)
        with pytest.raises(AssertionError):
            close(results[0][f"{model}/losses"], plain_losses, LOSS_RTOL, "without them")
        with pytest.raises(AssertionError):
            close_weights(results[0][f"{model}/weights"], plain, WEIGHTS_RTOL, "without them")


@pytest.mark.distributed
def test_newest_landing_matches_the_reference_under_a_landing_schedule(cora, tmp_path):
    """Landing "newest", S = 2, smoothing 0.9, every rank's exchanges landing by the
    schedule ``LANDING_DELAYS``, P = 2: the distributed run is the reference that reads
    the same buffers and blends each into the average once, its ages (``max_staleness``
    and ``effective_staleness``) included; the reference that blends a buffer chosen
    again a second time is another run (its losses)."""
    keys = [ExchangeKey.forward(1), ExchangeKey.backward(1)]
    chosen = newest_landed(scheduled, 2, keys, EPOCHS)
    assert [chosen[keys[0], t] for t in range(1, EPOCHS + 1)] == [1, 2, 2, 3, 5, 5]
    assert [chosen[keys[1], t] for t in range(1, EPOCHS + 1)] == [1, 1, 1, 2, 5, 5]
    part_dir = tmp_path / "parts"
    make_partition(cora, part_dir, num_parts=2, spec=_config("gcn", "").data.spec())
    extra = ("staleness.landing=newest", "staleness.bound=2", "staleness.smoothing=0.9")
    results = run_workers(_worker, 2, tmp_path, str(part_dir), extra, 0.0, MODELS, scheduled)
    owner = owner_of([r[f"{MODELS[0]}/global_ids"] for r in results], cora.num_nodes)
    for model in MODELS:
        initial = results[0][f"{model}/initial"]
        options = dict(smoothing=0.9, landed=scheduled)
        losses, weights, ages = _stale_reference(cora, owner, model, initial, 2, **options)
        for r in results:
            assert r[f"{model}/staleness"].tolist() == [0, 1, 2, 2, 0, 1]
            np.testing.assert_allclose(r[f"{model}/effective"], ages, rtol=1e-9)
            close(r[f"{model}/losses"], losses, LOSS_RTOL, f"{model} losses")
            close_weights(r[f"{model}/weights"], weights, WEIGHTS_RTOL, f"{model} weights")
        # The losses tell it apart (by 1.7-6.9e-4, measured); after 6 epochs the final
        # weights are only 4-5e-3 apart, inside their loose bound.
        twice_losses, _, _ = _stale_reference(
            cora, owner, model, initial, 2, **options, blend_again=True
        )
        with pytest.raises(AssertionError):
            close(results[0][f"{model}/losses"], twice_losses, LOSS_RTOL, "blended twice")
