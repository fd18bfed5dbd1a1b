"""Bit-width planning across ranks: one assignment for all, from the right statistics."""

from __future__ import annotations

import json
import math
from contextlib import contextmanager

import numpy as np
import pytest

from adaqp.assign import CHECK_SIZES, PROFILE_SIZES, HostModel, LinkModel, cost_model_kind
from adaqp.config import load_config
from adaqp.data import load_dataset
from adaqp.exchange import planner as planner_module
from adaqp.exchange.first_plans import FirstPlans
from adaqp.exchange.transport import Direction, ExchangeKey
from adaqp.graph.local import LocalGraph
from adaqp.partitioning.build import make_partition
from adaqp.partitioning.schema import read_metadata
from adaqp.partitioning.store import load_part
from adaqp.run.trainer import Trainer
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import NullWriter, run_workers

RESOLVE_BUDGET_S = 0.4


@contextmanager
def _trained(config, init_method: str, rank: int, world_size: int, part_dir: str):
    """Yields ``(graph, trainer, summary)`` of this rank's part trained under ``config``;
    the process group is shut down afterwards."""
    world = init_distributed(config.comm, init_method, rank, world_size)
    try:
        meta = read_metadata(part_dir)
        graph = LocalGraph.from_part(load_part(part_dir, rank, meta))
        trainer = Trainer(config, graph, meta, world)
        yield graph, trainer, trainer.fit(NullWriter())
    finally:
        shutdown()


def _plan_worker(rank: int, world_size: int, init_method: str, part_dir: str, scheme: str):
    scheme, cost_model, allowed = (*scheme.split("/"), "", "")[:3]
    config = load_config(
        None,
        [
            *([f"quant.allowed_bits=[{allowed}]"] if allowed else []),
            "data.dataset=cora",
            f"partition.dir={part_dir}",
            "comm.mode=adaqp",
            f"quant.scheme={scheme}",
            f"quant.cost_model={cost_model or 'shared'}",
            # One machine: quantized by the solver's choice, not float32 within the host;
            # the host model may choose float32 where its profile predicts it faster.
            f"quant.full_precision={'profile' if cost_model == 'host' else 'never'}",
            "quant.assign_cycle=2",
            # The host model re-profiles before every re-solve but the first.
            f"quant.profile_every={1 if cost_model == 'host' else 0}",
            "quant.group_size=10",
            f"quant.resolve_budget_s={RESOLVE_BUDGET_S}",
            "train.epochs=6",
            "model.hidden=32",
            "model.layers=3",
            "train.eval_every=0",
        ],
    )
    profiles, limits, solved = [], [], []
    profile = planner_module.profile_links
    planner_module.profile_links = lambda world, *a, **kw: (
        profiles.append(1) or profile(world, *a, **kw)
    )
    solve = planner_module.solve_exchange
    planner_module.solve_exchange = lambda *a, **kw: (
        limits.append(kw["time_limit_s"])
        or solved.append(sum(c.num_messages for c in a[1]))  # the messages priced
        or solve(*a, **kw)
    )
    with _trained(config, init_method, rank, world_size, part_dir) as (graph, trainer, summary):
        out = {
            "send_counts": np.array(graph.send_counts),
            "recv_counts": np.array(graph.recv_counts),
            "sent_ids": graph.global_ids[graph.send_idx.numpy()],
            "avg_bits": np.array(summary.avg_bits),
            "profiles": np.array(len(profiles)),
            "limits": np.array(limits, dtype=np.float64),
            "solved": np.array(solved, dtype=np.int64),
        }
        planner = trainer.policy.planner
        if rank == 0 and scheme == "adaptive":
            # The last plans solved (after epoch 6), by pair, as the summary reports them
            # for the plans that ran (solved after epoch 4).
            report = {
                "pair_bits_final": planner.solutions[6]["pair_bits"],
                "calibrated": summary.calibrated_exchange_s_by_tag,
                "calibration": summary.cost_calibration,
                "pair_bits": summary.plan_bits_by_pair,
                "predicted": summary.predicted_exchange_s_by_tag,
                "spans": summary.exchange_span_s_by_tag,
                "after_arrival": summary.exchange_after_arrival_s_by_tag,
                "hosts": summary.host_of_rank,
                "fabric": summary.fabric_Bps,
            }
            out["report"] = np.array(json.dumps(report))  # results travel without pickle
        if planner.forward_coef is not None:
            out["forward_coef"] = planner.forward_coef.numpy()
        for key, plan in planner.plans.items():
            tag = str(key)
            out[f"{tag}/out"] = plan.out_bits.numpy()
            out[f"{tag}/in"] = plan.in_bits.numpy()
            # Which of the messages out travel in training (only the loss's rows do).
            travels = np.ones(plan.out_bits.numel(), dtype=bool)
            selection = trainer.transport.selection(key, selected=True)
            if selection is not None:
                travels[:] = False
                travels[selection.keep(key.direction.sends_inner)[0].numpy()] = True
            out[f"{tag}/travels"] = travels
        return out


def _segments(result, tag: str, side: str) -> list[np.ndarray]:
    """A rank's widths of one exchange, split by peer (``side``: "/out" or "/in"; or
    "/travels", whether each message out travels in training)."""
    forward_out = tag.endswith("/forward") == (side != "/in")
    counts = result["send_counts" if forward_out else "recv_counts"]
    return np.split(result[f"{tag}{side}"], np.cumsum(counts)[:-1])


@pytest.fixture(scope="module")
def cora():
    return load_dataset("cora")


@pytest.mark.distributed
def test_allowed_widths_without_the_uniform_width_still_train(cora, tmp_path):
    """The first cycle runs at the uniform width (GCN's 1 bit) under the host model even
    where the allowed widths leave it out: its (de)quantization is profiled too (it once
    failed at epoch 1, at ``initial_bits`` 8 then: "quant_s_per_value has no entry for
    widths [8]"), and the solver keeps it among its widths (the reference plan)."""
    parts = tmp_path / "parts"
    make_partition(cora, parts, num_parts=2, spec=load_config(None, []).data.spec())
    results = run_workers(_plan_worker, 2, tmp_path, str(parts), "adaptive/host/2,4")
    for r in results:
        widths = {int(b) for k, v in r.items() if k.endswith("/out") for b in np.unique(v)}
        assert widths and widths <= {1, 2, 4, 32}, widths


def _planner_of(
    overrides: list[str], hosts=(0, 1), counts=((0, 500), (500, 0))
) -> planner_module.BitWidthPlanner:
    """A planner with only its configuration, cost model, hosts and counts (the same both
    ways): enough for its first widths."""
    planner = planner_module.BitWidthPlanner.__new__(planner_module.BitWidthPlanner)
    planner.config = load_config(None, ["comm.mode=adaqp", *overrides]).quant
    planner.cost_kind = cost_model_kind(planner.config)
    planner.counts = dict.fromkeys(Direction, np.array(counts))
    planner.first = FirstPlans(planner.config, np.array(hosts), planner.counts)
    return planner


PROFILE = "quant.full_precision=profile"


@pytest.mark.parametrize(
    ("overrides", "quant_s", "beta_Bps", "expected"),
    [
        ([PROFILE], 1e-7, 1e10, 32),  # fast links, slow quantizing: float32
        ([PROFILE], 1e-10, 1e7, 1),  # slow links: the uniform width
        ([], 1e-7, 1e10, 1),  # the default: between hosts at the width, however fast
        (["quant.full_precision=never"], 1e-7, 1e10, 1),  # a forced width
        ([PROFILE, "quant.cost_model=shared"], 1e-7, 1e10, 1),  # quantizes regardless
        ([PROFILE, "model.name=sage"], 1e-7, 1e10, 32),
        ([PROFILE, "model.name=sage"], 1e-10, 1e7, 2),
        ([PROFILE, "quant.scheme=adaptive"], 1e-7, 1e10, 32),  # its first cycle
        (["quant.scheme=adaptive"], 1e-7, 1e10, 1),
        (["quant.scheme=adaptive", "quant.full_precision=never"], 1e-7, 1e10, 1),
    ],
)
def test_a_uniform_plan_is_float32_between_hosts_only_where_a_profile_is_asked_for(
    overrides, quant_s, beta_Bps, expected
):
    """Between two hosts a uniform plan (either scheme's) is float32 only under
    quant.full_precision = "profile", where the host cost model predicts quantizing
    costs more than the bytes it saves; by default it is the width on any network."""
    key = ExchangeKey.forward(1)
    planner = _planner_of(overrides)
    planner.host_model = HostModel.uniform(
        [0, 1], 1e-5, beta_Bps, beta_Bps, quant_s_per_value=quant_s
    )
    assert planner._first_widths(key, 64, say=False).tolist() == [[expected] * 2] * 2


@pytest.mark.parametrize("scheme", ["uniform", "adaptive"])
def test_the_default_sends_float32_within_a_host_and_the_width_between_hosts(scheme):
    """By topology, with no profile: ranks 0 and 1 share a host, rank 2 is alone."""
    key = ExchangeKey.backward(1)
    counts = ((0, 3, 4), (5, 0, 0), (1, 2, 0))
    overrides = [f"quant.scheme={scheme}", "model.name=sage"]
    planner = _planner_of(overrides, hosts=(0, 0, 1), counts=counts)
    widths = planner._first_widths(key, 16)
    assert widths[0, 1] == widths[1, 0] == 32
    assert widths[0, 2] == widths[2, 0] == widths[1, 2] == widths[2, 1] == 2
    assert planner.first.pair_bits() == {
        "0->1": 32.0,
        "0->2": 2.0,
        "1->0": 32.0,
        "2->0": 2.0,
        "2->1": 2.0,
    }
    # Rank 1's side: float32 to and from rank 0, 2 bits from rank 2.
    plan = planner.first.plan(key, widths, "cpu")
    plan_1 = FirstPlans(planner.config, np.array([0, 0, 1]), planner.counts, rank=1).plan(
        key, widths, "cpu"
    )
    assert plan.out_bits.tolist() == [32] * 3 + [2] * 4
    assert plan_1.out_bits.tolist() == [32] * 5 and plan_1.in_bits.tolist() == [32] * 3 + [2] * 2
    never = _planner_of(["quant.full_precision=never", "model.name=sage"], hosts=(0, 0, 1))
    assert (never._first_widths(key, 16)[~np.eye(3, dtype=bool)] == 2).all()


def _pinned_uniform_worker(rank, world_size, init_method, part_dir, overrides):
    """An adaqp run (uniform unless ``overrides`` say otherwise) whose start-up profile is
    pinned: links of 1 GB/s and (de)quantization at 1 µs per value, so that float32 is
    predicted faster."""

    probes = []

    def links(world, sizes=None, repeats=None):
        probes.append((sizes, repeats))
        p = world.world_size
        return LinkModel(np.full((p, p), 20e-6), np.full((p, p), 1e9))

    planner_module.profile_links = links
    planner_module.time_quantization = lambda widths, *a, **kw: (
        dict.fromkeys(widths, 1e-6),
        dict.fromkeys(widths, 1e-6),
        None,
    )
    planner_module.profile_fabric = lambda *args, **kwargs: math.inf
    base = ["data.dataset=cora", f"partition.dir={part_dir}", "comm.mode=adaqp"]
    config = load_config(None, [*base, "train.epochs=2", "model.hidden=16", *overrides])
    with _trained(config, init_method, rank, world_size, part_dir) as (_, _, summary):
        return {"avg_bits": np.array(summary.avg_bits), "probes": np.array(json.dumps(probes))}


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("overrides", "bits", "probes"),
    [
        # Both ranks on this machine: float32 by topology, and nothing profiled.
        ([], 32.0, []),
        (["quant.full_precision=never"], 1.0, []),
        # Profiled briefly where asked for: one repeat of the two quick probes.
        ([PROFILE], 32.0, [[list(CHECK_SIZES), 1]]),
        # The solver's profile: every probe size, once each.
        (["quant.scheme=adaptive", PROFILE], 32.0, [[list(PROFILE_SIZES), 1]]),
    ],
)
def test_the_default_adaqp_sends_float32_within_a_host_and_profiles_only_when_told(
    cora, tmp_path, overrides, bits, probes
):
    parts = tmp_path / "parts"
    make_partition(cora, parts, num_parts=2, spec=load_config(None, []).data.spec())
    results = run_workers(_pinned_uniform_worker, 2, tmp_path, str(parts), overrides)
    assert [float(r["avg_bits"]) for r in results] == [bits, bits]
    assert [json.loads(str(r["probes"])) for r in results] == [probes, probes]


def test_the_first_cycle_traces_at_the_uniform_width():
    """The first cycle's trace reads the rows before quantization, so a wider first cycle
    buys the solver nothing: it runs at the width the uniform scheme would send (8 bits
    before, 2.5 times the 1-bit epochs' time on the README cluster)."""
    key = ExchangeKey.forward(1)
    adaptive = ["quant.scheme=adaptive", "quant.cost_model=shared"]

    def first(overrides):  # between the two hosts
        return int(_planner_of(overrides)._first_widths(key, 64, say=False)[0, 1])

    assert first(adaptive) == 1  # GCN's uniform width
    assert first([*adaptive, "model.name=sage"]) == 2
    assert first([*adaptive, "quant.bits=4"]) == 4
    assert first([*adaptive, "quant.initial_bits=8"]) == 8


@pytest.mark.distributed
@pytest.mark.parametrize("scheme", ["adaptive", "random", "adaptive/host"])
def test_every_rank_applies_the_same_assignment(scheme, cora, tmp_path):
    world_size = 3
    parts = tmp_path / "parts"
    make_partition(
        cora, parts, num_parts=world_size, spec=load_config(None, ["data.dataset=cora"]).data.spec()
    )
    results = run_workers(_plan_worker, world_size, tmp_path, str(parts), scheme)
    tags = sorted(k[: -len("/out")] for k in results[0] if k.endswith("/out"))
    assert "layer1/forward" in tags and "layer1/backward" in tags
    widths = set()
    for tag in tags:
        for p, rp in enumerate(results):
            out_segments = _segments(rp, tag, "/out")
            for q, rq in enumerate(results):
                if p == q:
                    continue
                in_segments = _segments(rq, tag, "/in")
                # What p sends q at which width is exactly what q expects from p.
                np.testing.assert_array_equal(out_segments[q], in_segments[p])
            widths |= set(np.unique(rp[f"{tag}/out"][rp[f"{tag}/travels"]]).tolist())
    # Links are profiled for the adaptive scheme only; again before the second and third
    # re-solves with profile_every=1 (the host case).
    profiles = {"adaptive": 1, "random": 0, "adaptive/host": 3}[scheme]
    assert [int(r["profiles"]) for r in results] == [profiles] * 3
    if scheme.startswith("adaptive"):
        r0, report = results[0], json.loads(str(results[0]["report"]))
        assert report["hosts"] == [0, 0, 0]  # one machine
        assert set(report["predicted"]) == set(report["spans"]) == set(tags)
        assert set(report["after_arrival"]) == set(tags)
        for tag in tags:  # the exchange alone is never longer than the slowest rank's span
            assert 0 < report["after_arrival"][tag] <= report["spans"][tag] + 1e-3
        # The solve after epoch 4 states its plans through the calibration fitted on the
        # exchanges of epochs 3-4.
        calibration = report["calibration"]
        fixed, scale = calibration["fixed_s_by_tag"], calibration["scale"]
        assert calibration["fixed_s"] >= 0 and scale >= 0
        assert set(fixed) == set(report["calibrated"]) == set(tags)
        for tag in tags:
            assert fixed[tag] >= 0 and fixed[tag] + scale > 0
            expected = fixed[tag] + scale * report["predicted"][tag]
            assert report["calibrated"][tag] == pytest.approx(expected)
        # Rank 0 solved every exchange of the 3 re-solves, each within its share of the
        # re-solve's budget (the first of a re-solve: an equal share of all of it).
        limits = r0["limits"].reshape(3, len(tags))
        assert (limits <= RESOLVE_BUDGET_S / np.arange(len(tags), 0, -1) + 1e-9).all()
        assert [len(r["limits"]) for r in results[1:]] == [0, 0]
        # Each solve prices the messages that travel in training, and no other: under the
        # default only the loss's rows, fewer than the whole exchange's.
        travelling = [sum(int(r[f"{tag}/travels"].sum()) for r in results) for tag in tags]
        whole = [sum(r[f"{tag}/travels"].size for r in results) for tag in tags]
        assert r0["solved"].reshape(3, len(tags)).tolist() == [travelling] * 3
        assert sum(travelling) < sum(whole)
        # One machine: the all-to-all is as fast as the pairs, or measured bounded.
        assert report["fabric"] is None or report["fabric"] > 0
        assert all(t > 0 for t in report["predicted"].values())
        assert set(report["pair_bits"]) == {"0->1", "0->2", "1->0", "1->2", "2->0", "2->1"}
        for dst in (1, 2):
            sent = np.concatenate(
                [_segments(r0, t, "/out")[dst][_segments(r0, t, "/travels")[dst]] for t in tags]
            )
            assert report["pair_bits_final"][f"0->{dst}"] == pytest.approx(sent.mean())
    if scheme.endswith("/host"):  # full precision is a choice of the host model
        assert widths <= {1, 2, 4, 8, 32}
        assert widths != {8}, "the re-solve should move some messages off the initial 8 bits"
        return
    assert widths <= {1, 2, 4, 8}  # the planner's default widths for GCN
    if scheme == "random":
        # Mixed widths, so the comparison of both sides above is not one of equal arrays.
        # (The solver may keep every travelling message at the uniform 1 bit: on Cora's
        # few rows that meets the variance budget at the least time, as the first plans.)
        assert len(widths) > 1, widths
    assert all(float(r["avg_bits"]) < 8 for r in results)


@pytest.mark.distributed
def test_forward_weights_use_receiver_squared_coefficients(cora, tmp_path):
    world_size = 3
    parts = tmp_path / "parts"
    make_partition(
        cora, parts, num_parts=world_size, spec=load_config(None, ["data.dataset=cora"]).data.spec()
    )
    results = run_workers(_plan_worker, world_size, tmp_path, str(parts), "adaptive")
    owner = np.zeros(cora.num_nodes, dtype=np.int64)
    for rank in range(world_size):
        owner[load_part(parts, rank).global_ids] = rank
    deg = np.diff(cora.indptr).astype(np.float64)
    for rank, r in enumerate(results):
        segments = np.split(np.arange(len(r["sent_ids"])), np.cumsum(r["send_counts"])[:-1])
        for q, seg in enumerate(segments):
            for i in seg:
                v = int(r["sent_ids"][i])
                # Edges v -> u into q's nodes (the graph is symmetric: u lists v as in-edge).
                u = cora.indices[cora.indptr[v] : cora.indptr[v + 1]]
                u = u[owner[u] == q]
                expected = np.sum(1.0 / ((deg[u] + 1) * (deg[v] + 1)))
                assert r["forward_coef"][i] == pytest.approx(expected, rel=1e-5)
        assert rank != 0 or len(r["sent_ids"]) > 0


def _two_host_worker(rank, world_size, init_method, part_dir):
    """Ranks 0 and 1 on torchrun's node 0, ranks 2 and 3 on node 1 (``GROUP_RANK``, as
    torchrun sets it on each host), training the default adaqp for 2 epochs."""
    import os

    os.environ["GROUP_RANK"] = str(rank // 2)
    base = ["data.dataset=cora", f"partition.dir={part_dir}", "comm.mode=adaqp"]
    config = load_config(None, [*base, "train.epochs=2", "model.hidden=16"])
    with _trained(config, init_method, rank, world_size, part_dir) as (graph, trainer, summary):
        plans = trainer.policy.planner.plans.items()
        plan = next(p for key, p in plans if key.direction is Direction.FORWARD)
        return {
            "pairs": np.array(json.dumps(summary.plan_bits_by_pair)),
            "hosts": np.array(summary.host_of_rank),
            "out_bits": plan.out_bits.numpy(),
            "send_counts": np.array(graph.send_counts),
        }


@pytest.mark.distributed
def test_the_default_sends_float32_within_a_torchrun_node_and_one_bit_between_nodes(cora, tmp_path):
    parts = tmp_path / "parts"
    make_partition(cora, parts, num_parts=4, spec=load_config(None, []).data.spec())
    results = run_workers(_two_host_worker, 4, tmp_path, str(parts))
    assert results[0]["hosts"].tolist() == [0, 0, 1, 1]
    pairs = json.loads(str(results[0]["pairs"]))
    for pair, bits in pairs.items():
        src, dst = map(int, pair.split("->"))
        assert bits == (32.0 if src // 2 == dst // 2 else 1.0), pairs
    assert len(pairs) >= 8  # Cora's parts exchange with every other part
    for rank, result in enumerate(results):  # what each rank actually sends, peer by peer
        segments = np.split(result["out_bits"], np.cumsum(result["send_counts"])[:-1])
        for peer, widths in enumerate(segments):
            if peer != rank and widths.size:
                assert set(widths.tolist()) == {32 if peer // 2 == rank // 2 else 1}
