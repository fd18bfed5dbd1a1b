"""Benchmark bookkeeping: aggregates, tables and plots from run records."""

from __future__ import annotations

import argparse
import json
import time

import pytest

from adaqp.bench import cluster, cluster_table, costmodel, run_order
from adaqp.emulate import ClusterError
from tests.bench.cluster_runs import cluster_run


@pytest.fixture
def runs():
    return {
        "vanilla": [cluster_run(1.0, 0.7, [0.5, 0.6, 0.7], 0.80, 1000)],
        "adaqp": [cluster_run(0.4, 0.1, [0.5, 0.7, 0.72], 0.79, 100, quant_s=0.05)],
        "nocomm": [cluster_run(0.3, 0.0, [0.4, 0.5, 0.6], 0.50, 0)],
    }


def test_aggregate_ratios_and_time_to_accuracy(runs):
    agg = cluster._aggregate(runs, [0])
    assert agg["adaqp"]["speedup_over_vanilla"] == pytest.approx(2.5)
    assert agg["adaqp"]["ratio_to_nocomm"] == pytest.approx(0.4 / 0.3)
    # Vanilla's final val 0.7 is reached by adaqp at epoch 2 (0.8 s) vs vanilla's 3.0 s.
    assert agg["adaqp"]["time_to_vanilla_val_s"] == pytest.approx(0.8)
    assert agg["adaqp"]["time_to_accuracy_ratio"] == pytest.approx(0.8 / 3.0)
    assert agg["adaqp"]["runs_reaching_vanilla_val"] == 1
    assert agg["nocomm"]["time_to_vanilla_val_s"] is None
    assert agg["vanilla"]["wait_share"] == pytest.approx(0.7)
    b = agg["adaqp"]["breakdown"]
    assert sum(b.values()) == pytest.approx(0.4)


def test_table_and_plots_are_written(runs, tmp_path):
    agg = cluster._aggregate(runs, [0])
    meta = {
        "hosts": 4,
        "procs_per_host": 1,
        "bandwidth": "1gbit",
        "epochs": 3,
        "seeds": [0],
        "config": "c.toml",
        "overrides": ["x=1"],
        "tta_tolerance": 0.0,
    }
    table = cluster_table.render("t", meta, agg)
    assert "| adaqp | 400.0 |" in table and "2.50x" in table and "n/a" in table
    pytest.importorskip("matplotlib")
    cluster.plot(tmp_path, runs, agg)
    for name in ("breakdown.png", "time_to_accuracy.png", "bytes_by_layer.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_adaptive_runs_report_prediction_ratio_and_bits_by_host_pair(runs):
    """2 hosts x 2 ranks: bits grouped by host pair, measured/predicted over exchanges."""
    planned = {
        "predicted_exchange_s_by_tag": {"layer1/forward": 0.10, "layer1/backward": 0.30},
        "exchange_span_s_by_tag": {"layer1/forward": 0.12, "layer1/backward": 0.28},
        "exchange_after_arrival_s_by_tag": {"layer1/forward": 0.09, "layer1/backward": 0.21},
        "calibrated_exchange_s_by_tag": {"layer1/forward": 0.10, "layer1/backward": 0.20},
        "host_of_rank": [0, 0, 1, 1],
        "plan_bits_by_pair": {"0->1": 32.0, "1->0": 8.0, "0->2": 2.0, "2->0": 4.0, "2->3": 32.0},
    }
    runs["adaqp"][0]["summary"].update(planned)
    agg = cluster._aggregate(runs, [0])
    a = agg["adaqp"]
    assert a["measured_over_predicted"] == pytest.approx(0.40 / 0.40)
    assert a["measured_over_predicted_by_tag"]["layer1/forward"] == pytest.approx(1.2)
    assert a["after_arrival_over_predicted"] == pytest.approx(0.30 / 0.40)
    assert a["after_arrival_over_predicted_by_tag"]["layer1/backward"] == pytest.approx(0.7)
    assert a["after_arrival_exchange_s"] == pytest.approx(0.30)
    assert a["after_arrival_over_calibrated"] == pytest.approx(0.30 / 0.30)
    assert a["after_arrival_over_calibrated_by_tag"]["layer1/forward"] == pytest.approx(0.9)
    assert a["bits_by_host_pair"] == {"0->0": 20.0, "0->1": 2.0, "1->0": 4.0, "1->1": 32.0}
    assert "bits_by_host_pair" not in agg["vanilla"]
    meta = {
        "hosts": 2,
        "procs_per_host": 2,
        "bandwidth": "300mbit",
        "epochs": 3,
        "seeds": [0],
        "config": "c.toml",
        "overrides": [],
        "tta_tolerance": 0.0,
    }
    table = cluster_table.render("t", meta, agg)
    assert (
        "| adaqp | 400.0 | 400.0 | 1.00 | 300.0 | 0.75 | 300.0 | 1.00 | layer1/backward "
        "1.05, layer1/forward 0.90 | 20.00 | 2.00 | 4.00 | 32.00 |"
    ) in table


def _cluster_json(bandwidth: str, calibrated: dict, measured: dict) -> dict:
    adaptive = {
        "calibrated_exchange_s_by_tag": calibrated,
        "exchange_after_arrival_s_by_tag": measured,
    }
    return {
        "meta": {"bandwidth": bandwidth, "seeds": [0, 1]},
        "runs": {"vanilla": [{}, {}], "adaqp-host": [adaptive, adaptive]},
    }


def test_cost_model_report_ranges_and_tolerance(tmp_path):
    """Measured / calibrated per seed and exchange; the verdict covers shaped clusters."""
    shaped = _cluster_json(
        "300mbit",
        {"layer1/forward": 0.10, "layer1/backward": 0.02},
        {"layer1/forward": 0.12, "layer1/backward": 0.016, "layer2/forward": 0.5},
    )
    unshaped = _cluster_json("", {"layer1/forward": 0.01}, {"layer1/forward": 0.02})
    report = costmodel.summarise({"a": shaped, "b": unshaped}, tolerance=0.25)
    entry = report["clusters"]["a"]["modes"]["adaqp-host"]
    assert "vanilla" not in report["clusters"]["a"]["modes"]
    assert len(entry["points"]) == 4  # 2 seeds x the 2 exchanges the model priced
    assert (entry["ratio_min"], entry["ratio_max"]) == pytest.approx((0.8, 1.2))
    assert entry["within_tolerance"]
    assert not report["clusters"]["b"]["modes"]["adaqp-host"]["within_tolerance"]
    assert report["within_tolerance_on_shaped_clusters"]  # the unshaped 2.0 is not counted
    tight = costmodel.summarise({"a": shaped}, tolerance=0.1)
    assert not tight["within_tolerance_on_shaped_clusters"]
    with pytest.raises(ValueError, match="no adaptive run"):
        costmodel.summarise({"c": _cluster_json("1gbit", {}, {})}, tolerance=0.25)
    pytest.importorskip("matplotlib")
    costmodel.plot(report, tmp_path / "cost_model.png")
    assert (tmp_path / "cost_model.png").stat().st_size > 1000


def test_cost_model_report_names_a_missing_cluster(tmp_path):
    args = argparse.Namespace(clusters="absent", tolerance=0.25, out_dir=tmp_path)
    with pytest.raises(SystemExit, match="absent/cluster.json: not found"):
        costmodel.main(args)
    assert not (tmp_path / "cost_model.json").exists()
    with pytest.raises(SystemExit, match="at least one"):
        costmodel.main(argparse.Namespace(clusters=",", tolerance=0.25, out_dir=tmp_path))


def test_run_order_rotates_the_modes_seed_by_seed():
    """Both benchmarks that compare modes (cluster, modes) run them in this order."""
    modes, seeds = ["vanilla", "adaqp", "nocomm"], [0, 1, 2, 3]
    order = run_order(modes, seeds)
    assert sorted(order) == sorted((m, s) for m in modes for s in seeds)  # each run once
    assert [m for m, s in order if s == 0] == modes  # one seed: the order given
    assert [order[3 * i][0] for i in range(4)] == ["vanilla", "adaqp", "nocomm", "vanilla"]
    for mode in modes:  # each mode's runs in seed order (the aggregate pairs them by index)
        assert [s for m, s in order if m == mode] == seeds


def test_aggregate_arms_take_turns_after_a_dropped_warm_up():
    from adaqp.bench.aggregate import _time_fwd_bwd

    calls = []

    def arm(name: str, first_s: float = 0.0):
        def step():
            calls.append(name)
            if first_s and calls.count(name) == 1:
                time.sleep(first_s)  # a warm-up that must not count
            return None, lambda out: calls.append(f"{name} backward")

        return step

    timings = _time_fwd_bwd({"ours": arm("ours", first_s=0.5), "other": arm("other")}, 3)
    round_ = ["ours", "ours backward", "other", "other backward"]
    assert calls == round_ * 4  # one warm-up round, then 3 in turn
    assert set(timings) == {"ours", "other"}
    assert timings["ours"]["forward_s"] < 0.25 and timings["ours"]["total_s"] < 0.25


def test_merge_overrides_keeps_each_key_once_with_its_last_value():
    from adaqp.bench import merge_overrides

    items = ("train.eval_every=1", "model.hidden=64", "train.eval_every = 2", "x.y=a=b")
    assert merge_overrides(items) == ["train.eval_every = 2", "model.hidden=64", "x.y=a=b"]
    assert merge_overrides(["a.b=1", "a.bc=2"]) == ["a.b=1", "a.bc=2"]  # keys, not prefixes
    assert merge_overrides([]) == []


def test_cluster_table_names_a_key_set_twice_once(runs):
    """A workload's default (train.eval_every=1) and the user's --set for the same key: the
    header states what ran (the last value), also for cluster.json files written before."""
    meta = {
        "hosts": 4,
        "procs_per_host": 1,
        "bandwidth": "300mbit",
        "epochs": 3,
        "seeds": [0],
        "config": "c.toml",
        "overrides": ["train.eval_every=1", "train.eval_every=2", "quant.cost_model=sender"],
        "tta_tolerance": 0.005,
    }
    table = cluster_table.render("t", meta, cluster._aggregate(runs, [0]))
    assert "Workload: `c.toml` with train.eval_every=2, quant.cost_model=sender.\n" in table


def test_modes_runs_and_table_set_a_key_once(tmp_path, monkeypatch):
    """`bench modes --dataset synthetic --set train.eval_every=2`: the run gets one
    train.eval_every (the user's), and the table's settings line names it once."""
    import json

    from adaqp.bench import modes

    seen: list[list[str]] = []

    def fake_train(nproc, train_args, timeout_s, what):
        seen.append(train_args)
        out = tmp_path / "runs" / "vanilla-seed0"
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({k: 1.0 for k in modes.SUMMARY_KEYS}))

    monkeypatch.setattr(modes, "torchrun_train", fake_train)
    args = argparse.Namespace(
        epochs=2, world_size=4, timeout=10.0, set=["train.eval_every=2", "train.lr=0.1"]
    )
    summary = modes._run_one("synthetic", "vanilla", 0, args, tmp_path / "runs", tmp_path / "p")
    sets = [seen[0][i + 1] for i, a in enumerate(seen[0]) if a == "--set"]
    assert [s for s in sets if s.startswith("train.")] == ["train.eval_every=2", "train.lr=0.1"]
    results = {"vanilla": {"runs": [summary], "aggregate": modes._aggregate([summary])}}
    meta = {
        "world_size": 4,
        "epochs": 2,
        "seeds": [0],
        "config": "c.toml",
        "overrides": ["train.eval_every=5", "staleness.landing=fixed", "train.eval_every=4"],
    }
    table = modes._table("synthetic", results, meta)
    assert "with train.eval_every=4, staleness.landing=fixed.\n" in table


class _FakeCluster:
    """``EmulatedCluster`` without namespaces: a launch fails where ``failing`` says."""

    failing: set[str] = set()

    def __init__(self, hosts, links, budgets=None, cgroups=None):
        self.launched: list[str] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def launch(self, procs, train_args, log_dir, timeout):
        mode = str(log_dir.parent.name).rsplit("-seed", 1)[0]
        if mode in self.failing:
            raise ClusterError(f"host 0 exited with 1; see {log_dir}/host0.log")


def _bench(monkeypatch, tmp_path, failing, modes="vanilla,nocomm,adaqp,adaqp-bits12"):
    monkeypatch.chdir(tmp_path)
    _FakeCluster.failing = failing
    monkeypatch.setattr(cluster, "EmulatedCluster", _FakeCluster)
    monkeypatch.setattr(cluster, "plot", lambda *a: None)
    made = {"vanilla": (1.0, 0.80), "nocomm": (0.3, 0.5), "adaqp": (0.4, 0.79)}
    monkeypatch.setattr(
        cluster,
        "read_run",
        lambda run_dir: cluster_run(
            *made.get(run_dir.name.rsplit("-seed", 1)[0], (0.5, 0.7))[:1],
            0.1,
            [0.5, 0.7, 0.8],
            0.75,
            100,
        ),
    )
    parser = argparse.ArgumentParser()
    cluster.add_arguments(parser)
    args = parser.parse_args(
        ["--name", "t", "--seeds", "0,1", "--modes", modes, "--out-dir", str(tmp_path / "out")]
    )
    return cluster.main(args)


def test_a_failed_mode_is_reported_and_the_others_still_aggregate(monkeypatch, tmp_path, capsys):
    """A variant that fails (here at its first seed) costs its own row, not the benchmark:
    its second seed is skipped, the others run, cluster.md names it, the exit code is 1."""
    assert _bench(monkeypatch, tmp_path, {"adaqp-bits12"}) == 1
    out = capsys.readouterr().out
    assert "adaqp-bits12 seed 0: failed, host 0 exited with 1" in out
    assert "adaqp-bits12 seed 1" not in out  # its other seed skipped
    assert "error: 1 of 4 modes failed: adaqp-bits12" in out
    written = json.loads((tmp_path / "out" / "t" / "cluster.json").read_text())
    assert set(written["aggregate"]) == {"vanilla", "nocomm", "adaqp"}
    assert written["meta"]["failed"]["adaqp-bits12"].startswith("seed 0: host 0 exited")
    table = (tmp_path / "out" / "t" / "cluster.md").read_text()
    assert "- adaqp-bits12: seed 0: host 0 exited with 1" in table
    assert _bench(monkeypatch, tmp_path, set()) == 0


def test_a_failed_vanilla_ends_the_benchmark(monkeypatch, tmp_path):
    with pytest.raises(ClusterError, match="host 0 exited"):
        _bench(monkeypatch, tmp_path, {"vanilla"})
    assert not (tmp_path / "out" / "t" / "cluster.json").exists()


def _column(table: str, header: str) -> dict[str, str]:
    """One column of a Markdown table: the first cell of each row -> that column's cell."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    head = next(r for r in rows if header in r)
    at = head.index(header)
    return {r[0]: r[at] for r in rows[rows.index(head) + 2 :] if len(r) == len(head)}


def test_cluster_table_shows_no_bits_for_nocomm_which_sends_nothing(runs):
    """nocomm's summary says 32 bits (``avg_bits``) though it sends no halo byte."""
    meta = {
        "hosts": 4,
        "procs_per_host": 1,
        "bandwidth": "1gbit",
        "epochs": 3,
        "seeds": [0],
        "config": "c.toml",
        "overrides": [],
        "tta_tolerance": 0.0,
    }
    bits = _column(cluster_table.render("t", meta, cluster._aggregate(runs, [0])), "avg bits")
    assert bits == {"vanilla": "32.00", "adaqp": "32.00", "nocomm": "-"}


def test_modes_table_shows_no_bits_for_nocomm_which_sends_nothing():
    from adaqp.bench import modes

    def summary(nbytes: int, bits: float) -> dict[str, float]:
        return {key: 0.5 for key in modes.SUMMARY_KEYS} | {
            "halo_bytes_per_epoch": nbytes,
            "avg_bits": bits,
        }

    results = {
        name: {"aggregate": modes._aggregate([summary(nbytes, bits)])}
        for name, nbytes, bits in (
            ("vanilla", 1000, 32.0),
            ("adaqp", 100, 2.0),
            ("nocomm", 0, 32.0),
        )
    }
    meta = {"world_size": 2, "epochs": 3, "seeds": [0], "config": "c.toml", "overrides": []}
    bits = _column(modes._table("cora", results, meta), "avg bits")
    assert bits == {"vanilla": "32.00", "adaqp": "2.00", "nocomm": "-"}
