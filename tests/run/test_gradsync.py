"""Bucketed gradient all-reduce: equals the flat all-reduce and the hand-made sum over
ranks, launches during backward in one fixed order, and keeps unused parameters apart."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from adaqp.config import CommConfig, ModelConfig
from adaqp.model.gnn import GNN
from adaqp.run.gradsync import GradientBuckets, gnn_layer_groups
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import expect_worker_failure, run_workers

ROWS, IN, HID, OUT = 16, 7, 11, 5


class _Net(nn.Module):
    """Three Linear layers, LayerNorm after the first: the shape of ``adaqp.model.gnn.GNN``.

    ``spare`` is used only by rank ``spare_rank``; ``idle`` by no rank.
    """

    def __init__(self, spare_rank: int | None = None):
        super().__init__()
        torch.manual_seed(0)  # every rank starts from the same weights
        self.convs = nn.ModuleList([nn.Linear(IN, HID), nn.Linear(HID, HID), nn.Linear(HID, OUT)])
        self.norms = nn.ModuleList([nn.LayerNorm(HID), nn.Identity()])
        self.spare_rank = spare_rank
        if spare_rank is not None:
            self.spare = nn.Linear(IN, OUT)
            self.idle = nn.Parameter(torch.ones(3))

    def loss(self, rank: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(10 + rank)
        x = torch.randn(ROWS, IN, generator=gen) * (rank + 1)  # different data per rank
        target = torch.randn(ROWS, OUT, generator=gen)
        h = x
        for layer, conv in enumerate(self.convs):
            h = conv(h)
            if layer < len(self.convs) - 1:
                h = torch.relu(self.norms[layer](h))
        if rank == self.spare_rank:
            h = h + self.spare(x)
        return ((h - target) ** 2).mean()

    def groups(self) -> list[list[nn.Parameter]]:
        """Layer groups. ``spare`` joins the group launched first (complete on one rank
        only); ``idle`` the group launched last (complete on no rank)."""
        groups = [
            [*self.convs[0].parameters(), *self.norms[0].parameters()],
            list(self.convs[1].parameters()),
            list(self.convs[2].parameters()),
        ]
        if self.spare_rank is not None:
            groups[2] += list(self.spare.parameters())
            groups[0].append(self.idle)
        return groups


def _grads(model: nn.Module, prefix: str) -> dict[str, np.ndarray]:
    return {
        f"{prefix}/{name}": p.grad.detach().numpy().copy()
        for name, p in model.named_parameters()
        if p.grad is not None
    }


def _local_grads(rank: int, spare_rank: int | None = None) -> dict[str, np.ndarray]:
    """This rank's gradients without any communication (computed in the test process)."""
    model = _Net(spare_rank)
    model.loss(rank).backward()
    return {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}


def _sync_worker(rank: int, world_size: int, init_method: str):
    init_distributed(CommConfig(timeout_s=60), init_method, rank, world_size)
    try:
        model = _Net()
        groups = gnn_layer_groups(model)
        buckets = GradientBuckets(groups, timeout_s=60)
        flat = GradientBuckets(groups, enabled=False, timeout_s=60)
        # Registered after the buckets' hooks, so each sees the count right after its own.
        launched_when = []
        for g, group in enumerate(groups):
            for p in group:
                p.register_post_accumulate_grad_hook(
                    lambda _p, g=g: launched_when.append((g, buckets.num_launched))
                )

        # Not armed: a plain local backward, nothing launched.
        model.loss(rank).backward()
        out = _grads(model, "inert")
        assert {n for _, n in launched_when} == {0}, launched_when
        launched_when.clear()

        model.zero_grad(set_to_none=True)
        buckets.start()
        with pytest.raises(RuntimeError, match="twice without finish"):
            buckets.start()
        model.loss(rank).backward()
        times = buckets.finish()
        out.update(_grads(model, "bucketed"))
        first_layer0 = next(n for g, n in launched_when if g == 0)

        model.zero_grad(set_to_none=True)
        flat.start()
        model.loss(rank).backward()
        flat_times = flat.finish()
        out.update(_grads(model, "flat"))

        with pytest.raises(RuntimeError, match="without start"):
            buckets.finish()
        # A second backward in one step would change gradients already on the wire.
        model.zero_grad(set_to_none=True)
        buckets.start()
        loss = model.loss(rank)
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="second gradient"):
            loss.backward()
        buckets.finish()  # the launched buckets still complete on every rank

        out.update(
            first_layer0=np.array(first_layer0),
            blocked_s=np.array([times.blocked_s, flat_times.blocked_s]),
            exchange_s=np.array(times.exchange_s),
            flat_exchange_s=np.array(flat_times.exchange_s),
            num_buckets=np.array([times.num_buckets, flat_times.num_buckets]),
            early=np.array([times.num_launched_early, flat_times.num_launched_early]),
        )
        return out
    finally:
        shutdown()


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
def test_buckets_equal_flat_and_hand_sum(world_size, tmp_path):
    results = run_workers(_sync_worker, world_size, tmp_path, timeout=120)
    local = [_local_grads(rank) for rank in range(world_size)]
    expected = {
        name: sum(g[name].astype(np.float64) for g in local).astype(np.float32) for name in local[0]
    }
    # The comparison can fail: one rank's gradients are far from the sum.
    assert not all(np.allclose(local[0][n], expected[n], atol=1e-3) for n in expected)
    for rank, result in enumerate(results):
        for name, want in expected.items():
            got, flat = result[f"bucketed/{name}"], result[f"flat/{name}"]
            np.testing.assert_allclose(got, flat, rtol=1e-6, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
            np.testing.assert_array_equal(got, results[0][f"bucketed/{name}"])
            if world_size == 2:  # a + b has one rounding: bitwise equal whatever the layout
                np.testing.assert_array_equal(got, flat, err_msg=name)
            # Hooks outside start()/finish() leave the local gradients alone.
            np.testing.assert_allclose(
                result[f"inert/{name}"], local[rank][name], rtol=1e-6, atol=1e-7
            )
        # Layers 2 and 1 were on the wire before layer 0's gradients landed, and the last
        # bucket went out before backward returned.
        assert int(result["first_layer0"]) == 2
        assert result["early"].tolist() == [3, 0]
        assert result["num_buckets"].tolist() == [3, 1]
        assert len(result["exchange_s"]) == 3 and len(result["flat_exchange_s"]) == 1
        assert (result["exchange_s"] >= 0).all() and (result["blocked_s"] >= 0).all()


def _unused_worker(rank: int, world_size: int, init_method: str):
    init_distributed(CommConfig(timeout_s=60), init_method, rank, world_size)
    try:
        model = _Net(spare_rank=1)
        out = {}
        for mode, enabled in (("buckets", True), ("flat", False)):
            buckets = GradientBuckets(model.groups(), enabled=enabled, timeout_s=30)
            model.zero_grad(set_to_none=True)
            buckets.start()
            model.loss(rank).backward()
            times = buckets.finish()
            buckets.remove()
            out.update(_grads(model, mode))
            out[f"{mode}/idle_none"] = np.array(model.idle.grad is None)
            out[f"{mode}/early"] = np.array(times.num_launched_early)
        return out
    finally:
        shutdown()


@pytest.mark.distributed
def test_parameter_without_gradient(tmp_path):
    """Used on one rank: every rank gets that rank's gradient. Used on none: stays None.

    On ranks 0 and 2 the bucket launched first (group 2) is incomplete after backward,
    so they launch all three in finish() while rank 1 launched two during backward:
    the all-reduces still pair up because the order is fixed. Group 0 (with ``idle``)
    is complete on no rank, so every rank launches it in finish().
    """
    world_size = 3
    results = run_workers(_unused_worker, world_size, tmp_path, timeout=120)
    local = [_local_grads(rank, spare_rank=1) for rank in range(world_size)]
    assert "spare.weight" in local[1] and "spare.weight" not in local[0]
    for rank, result in enumerate(results):
        for mode in ("buckets", "flat"):
            assert bool(result[f"{mode}/idle_none"])
            assert f"{mode}/idle" not in result
            for name in ("spare.weight", "spare.bias"):  # x + 0 + 0 is exact
                np.testing.assert_array_equal(result[f"{mode}/{name}"], local[1][name])
            for name in local[0]:
                want = sum(g[name].astype(np.float64) for g in local)
                got = result[f"{mode}/{name}"]
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
        assert int(result["buckets/early"]) == (2 if rank == 1 else 0)
        assert int(result["flat/early"]) == 0


def _dead_peer_worker(rank: int, world_size: int, init_method: str):
    init_distributed(CommConfig(timeout_s=60), init_method, rank, world_size)
    model = _Net()
    buckets = GradientBuckets(gnn_layer_groups(model), timeout_s=2)
    if rank == 1:
        time.sleep(6)  # well past the 2 s bound on rank 0's wait
        raise RuntimeError("rank 1 skips the step")
    buckets.start(step=7)  # the trainer numbers steps by epoch
    model.loss(rank).backward()
    buckets.finish()


@pytest.mark.distributed
def test_dead_peer_names_rank_and_bucket(tmp_path):
    tracebacks = expect_worker_failure(_dead_peer_worker, 2, tmp_path, timeout=90)
    assert "GradientSyncError" in tracebacks[0], tracebacks[0]
    assert "rank 0: gradient bucket 2 of 3 at step 7" in tracebacks[0], tracebacks[0]


def test_hooks_inert_and_state_errors_without_a_process_group():
    model = _Net()
    buckets = GradientBuckets(gnn_layer_groups(model))
    model.loss(0).backward()  # no process group: unarmed hooks must not communicate
    assert model.convs[0].weight.grad is not None and buckets.num_launched == 0
    with torch.no_grad():
        model.loss(0)
    with pytest.raises(RuntimeError, match="without start"):
        buckets.finish()
    buckets.start()
    assert buckets.armed
    with pytest.raises(RuntimeError, match="twice without finish"):
        buckets.start()
    with pytest.raises(RuntimeError, match="between start"):
        buckets.remove()


def test_remove_detaches_hooks():
    model = _Net()
    buckets = GradientBuckets(gnn_layer_groups(model))
    buckets.remove()
    with pytest.raises(RuntimeError, match="after remove"):
        buckets.start()


def test_invalid_groups_are_refused():
    model = _Net()
    w, b = model.convs[0].weight, model.convs[0].bias
    with pytest.raises(ValueError, match=r"groups\[1\] is empty"):
        GradientBuckets([[w], []])
    with pytest.raises(ValueError, match="more than one place"):
        GradientBuckets([[w], [b, w]])
    frozen = nn.Parameter(torch.ones(2), requires_grad=False)
    with pytest.raises(ValueError, match="does not require grad"):
        GradientBuckets([[w, frozen]])
    with pytest.raises(ValueError, match="float64"):
        GradientBuckets([[w], [nn.Parameter(torch.ones(2, dtype=torch.float64))]])
    with pytest.raises(ValueError, match="timeout_s"):
        GradientBuckets([[w]], timeout_s=0)


@pytest.mark.parametrize("layernorm", [True, False])
def test_gnn_layer_groups_cover_every_parameter_once(layernorm):
    config = ModelConfig(name="sage", layers=3, hidden=8, layernorm=layernorm)
    model = GNN(config, in_dim=5, out_dim=3)
    groups = gnn_layer_groups(model)
    assert len(groups) == 3
    ids = [id(p) for group in groups for p in group]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())
    for layer, group in enumerate(groups):
        expected = list(model.convs[layer].parameters())
        if layer < 2:
            expected += list(model.norms[layer].parameters())
        assert [id(p) for p in group] == [id(p) for p in expected]
