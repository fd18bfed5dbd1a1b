"""Where benchmarks write, what they write without matplotlib, the workloads they train,
and the command lines they keep accepting."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

import adaqp.bench as bench
from adaqp.bench import COMMITTED_OUT_DIR, DEFAULT_OUT_DIR, MATPLOTLIB_HINT, cluster, costmodel
from adaqp.bench import scaling as scaling_bench
from adaqp.bench.__main__ import BENCHMARKS, build_parser, main
from adaqp.bench.cluster_plot import FIGURES
from adaqp.config import load_config

ROOT = Path(__file__).resolve().parents[2]

# The README cluster workload as adaqp/bench/__init__.py spelled it before it had a file.
EARLIER_OVERRIDES = [
    "data.synthetic.num_nodes=20000",
    "data.synthetic.avg_degree=10",
    "data.synthetic.feature_dim=64",
    "data.synthetic.num_classes=8",
    "data.synthetic.feature_noise=2.0",
]


@pytest.fixture
def no_matplotlib(monkeypatch):
    """``import matplotlib`` fails, as where the [bench] extra is not installed."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def _hints(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and MATPLOTLIB_HINT in r.getMessage()
    ]


def _write_run(run_dir: Path, epoch_s: float, val_curve: list[float], nbytes: int) -> None:
    run_dir.mkdir(parents=True)
    summary = {
        "epoch_time_s": epoch_s,
        "comm_wait_s": epoch_s / 2,
        "quant_time_s": 0.0,
        "dequant_time_s": 0.0,
        "allreduce_time_s": 0.01,
        "test_acc": 0.7,
        "halo_bytes_per_epoch": nbytes,
        "avg_bits": 32.0,
        "hidden_comm_fraction": 0.0,
        "halo_bytes_by_tag": {"layer1/forward": nbytes // 2, "layer1/backward": nbytes // 2},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    lines = [
        json.dumps({"epoch": i + 1, "val_acc": v, "epoch_time_s": epoch_s})
        for i, v in enumerate(val_curve)
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _cluster_runs(root: Path, name: str) -> None:
    runs = root / "results" / "runs" / f"bench-{name}"
    _write_run(runs / "vanilla-seed0", 1.0, [0.5, 0.6, 0.7], 1000)
    _write_run(runs / "adaqp-seed0", 0.4, [0.5, 0.7, 0.72], 100)


def test_cluster_without_matplotlib_writes_json_and_table_with_one_warning(
    tmp_path, monkeypatch, caplog, capsys, no_matplotlib
):
    monkeypatch.chdir(tmp_path)
    _cluster_runs(tmp_path, "t")
    argv = ["cluster", "--name", "t", "--render-only", "--seeds", "0", "--modes", "vanilla,adaqp"]
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    out = tmp_path / DEFAULT_OUT_DIR / "t"
    assert json.loads((out / "cluster.json").read_text())["meta"]["name"] == "t"
    assert "| adaqp |" in (out / "cluster.md").read_text()
    assert not list(out.glob("*.png"))
    assert len(_hints(caplog)) == 1
    assert "breakdown.png" in _hints(caplog)[0].getMessage()
    assert str(DEFAULT_OUT_DIR / "t") in capsys.readouterr().out


def test_cluster_with_matplotlib_draws_and_does_not_warn(tmp_path, monkeypatch, caplog):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    _cluster_runs(tmp_path, "t")
    argv = ["cluster", "--name", "t", "--render-only", "--seeds", "0", "--modes", "vanilla,adaqp"]
    with caplog.at_level(logging.WARNING):
        assert main([*argv, "--out-dir", "elsewhere"]) == 0
    assert {p.name for p in (tmp_path / "elsewhere" / "t").glob("*.png")} == set(FIGURES)
    assert not _hints(caplog)


def test_costmodel_without_matplotlib_writes_json_with_one_warning(tmp_path, caplog, no_matplotlib):
    adaptive = {
        "calibrated_exchange_s_by_tag": {"layer1/forward": 0.1},
        "exchange_after_arrival_s_by_tag": {"layer1/forward": 0.11},
    }
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "cluster.json").write_text(
        json.dumps({"meta": {"bandwidth": "1gbit", "seeds": [0]}, "runs": {"adaqp": [adaptive]}})
    )
    with caplog.at_level(logging.WARNING):
        assert main(["costmodel", "--clusters", "c", "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "cost_model.json").read_text())
    assert report["within_tolerance_on_shaped_clusters"]
    assert report["sources"] == {"c": str(tmp_path / "c" / "cluster.json")}
    assert not (tmp_path / "cost_model.png").exists()
    assert len(_hints(caplog)) == 1


def test_scaling_without_matplotlib_writes_json_and_table_with_one_warning(
    tmp_path, monkeypatch, caplog, no_matplotlib
):
    def training(world_size, args, runs_dir):
        return {
            "world_size": world_size,
            "epoch_time_s": 1.0 / world_size,
            "comm_time_s": 0.1,
            "peak_memory_mb_per_rank": 900.0 / world_size,
            "halo_bytes_per_epoch": 1e6 * world_size,
        }

    def partitioning(num_nodes, num_parts, timeout):
        return {
            "num_nodes": num_nodes,
            "num_edges": 20 * num_nodes,
            "generate_s": 0.1,
            "partition_s": num_nodes / 1e4,
            "edge_cut": num_nodes,
            "peak_rss_mb": 220.0 + num_nodes / 1e3,
        }

    monkeypatch.setattr(scaling_bench, "_training_point", training)
    monkeypatch.setattr(scaling_bench, "_partition_point", partitioning)
    argv = ["scaling", "--world-sizes", "1,2", "--partition-nodes", "5000,15000"]
    with caplog.at_level(logging.WARNING):
        assert main([*argv, "--out-dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "scaling.json").read_text())["exponents"]
    assert "| 2 | 500 |" in (tmp_path / "scaling.md").read_text()
    assert not (tmp_path / "scaling.png").exists()
    assert len(_hints(caplog)) == 1


def test_costmodel_reads_the_committed_clusters_when_not_run_here(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    committed = "signal-300mbit-gcn-solver"
    args = build_parser("costmodel").parse_args(
        ["costmodel", "--clusters", committed, "--out-dir", str(tmp_path)]
    )
    assert costmodel._cluster_path(committed, args) == costmodel.COMMITTED_CLUSTERS / committed / (
        "cluster.json"
    )
    local = tmp_path / committed
    local.mkdir()
    (local / "cluster.json").write_text("{}")
    assert costmodel._cluster_path(committed, args) == local / "cluster.json"
    args.clusters_dir = tmp_path / "none"
    with pytest.raises(SystemExit, match="none/signal-300mbit-gcn-solver/cluster.json"):
        costmodel._cluster_path(committed, args)


# Command lines as the docs and earlier scripts wrote them: every flag must keep parsing.
EARLIER_COMMAND_LINES = {
    "aggregate": "--num-nodes 1000 --avg-degree 5 --dim 8 --repeats 1 --threads 1 --out a.json",
    "modes": "--dataset synthetic --world-size 2 --seeds 0 --epochs 3 --timeout 60 "
    "--variants vanilla,adaqp-q,adaqp-p,adaqp,onebit-s1,onebit-s2,adaqp-shared,adaqp-host,"
    "uniform-2,uniform-4,uniform-8 --set train.lr=0.1 --out-dir o",
    "cluster": "--name n --workload synthetic-local --hosts 2 --procs-per-host 2 "
    "--bandwidth 300mbit,75mbit --latency 0.1ms --seeds 0,1 --epochs 2 "
    "--modes vanilla,adaqp-q,adaqp-p,adaqp,onebit-s1,onebit-s2,nocomm,adaqp-shared,adaqp-host "
    "--set train.eval_every=2 --timeout 60 --tta-tolerance 0.01 --render-only --out-dir o",
    "costmodel": "--clusters a,b --tolerance 0.1 --out-dir o",
    "scaling": "--world-sizes 1,2 --train-nodes 100 --epochs 1 --partition-nodes 100,200 "
    "--num-parts 2 --timeout 60 --out-dir o",
}


@pytest.mark.parametrize("name", sorted(EARLIER_COMMAND_LINES))
def test_earlier_command_lines_still_parse(name):
    args = build_parser(name).parse_args([name, *EARLIER_COMMAND_LINES[name].split()])
    assert args.benchmark == name
    assert _written_to(args) in (Path("o"), Path("a.json"))


def _written_to(args) -> Path:
    """Where the benchmark of ``args`` writes: its file (aggregate, quant), else its folder."""
    if args.benchmark in ONE_FILE:
        return bench.out_file(args, ONE_FILE[args.benchmark])
    return args.out_dir


def test_cluster_and_modes_accept_every_variant_name_they_did():
    earlier = {"vanilla", "adaqp-q", "adaqp-p", "adaqp", "onebit-s1", "onebit-s2"}
    assert earlier | {"nocomm", "adaqp-shared", "adaqp-host"} <= set(cluster.VARIANTS)
    from adaqp.bench import modes

    assert earlier | {"adaqp-shared", "adaqp-host", "uniform-2", "uniform-8"} <= set(modes.VARIANTS)


ONE_FILE = {"aggregate": "aggregate.json", "quant": "quant.json"}
"""The benchmarks that write one file (``--out`` names it; else it goes into --out-dir)."""


@pytest.mark.parametrize("name", BENCHMARKS)
def test_default_output_is_outside_the_committed_results(name):
    """``bench quant`` with no flags rewrote the committed quant.json."""
    assert Path("results/local/bench") == DEFAULT_OUT_DIR
    args = build_parser(name).parse_args([name])
    assert args.out_dir == DEFAULT_OUT_DIR
    out = _written_to(args)
    assert out.is_relative_to(DEFAULT_OUT_DIR) and not out.is_relative_to(COMMITTED_OUT_DIR)
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert f"/{DEFAULT_OUT_DIR.parent}/" in ignored


@pytest.mark.parametrize("name", BENCHMARKS)
def test_out_dir_results_bench_updates_the_committed_readings(name):
    args = build_parser(name).parse_args([name, "--out-dir", str(COMMITTED_OUT_DIR)])
    assert _written_to(args).is_relative_to(COMMITTED_OUT_DIR)


@pytest.mark.parametrize("name", sorted(ONE_FILE))
def test_out_names_the_file_whatever_out_dir_says(name):
    args = build_parser(name).parse_args([name, "--out-dir", "d", "--out", "f.json"])
    assert _written_to(args) == Path("f.json")
    assert _written_to(build_parser(name).parse_args([name, "--out-dir", "d"])) == Path(
        "d", ONE_FILE[name]
    )


def test_synthetic_workloads_resolve_as_the_earlier_overrides_did():
    """One definition (configs/cluster-synthetic-gcn.toml), the same configs as before."""
    from adaqp.bench import modes

    base = ROOT / "configs" / "synthetic-gcn.toml"
    for (config, overrides), eval_every in (
        (cluster.WORKLOADS["synthetic"], 1),
        (modes.DATASETS["synthetic"], 5),
    ):
        assert config == "configs/cluster-synthetic-gcn.toml"
        earlier = load_config(base, [*EARLIER_OVERRIDES, f"train.eval_every={eval_every}"])
        assert load_config(ROOT / config, list(overrides)) == earlier


def test_cluster_default_workload_is_the_signal_graph_and_the_earlier_one_stays():
    """The default: configs/synthetic-local-gcn.toml with 30% of edges between communities
    (results/bench/modes/workload-search/); --workload synthetic is the earlier default."""
    from adaqp.bench import modes

    args = build_parser("cluster").parse_args(["cluster"])
    assert args.workload == "synthetic-signal"
    config, overrides = cluster.WORKLOADS[args.workload]
    local = ROOT / "configs" / "synthetic-local-gcn.toml"
    expected = load_config(local, ["data.synthetic.inter_community=0.3", *overrides])
    assert load_config(ROOT / config, list(overrides)) == expected
    assert modes.DATASETS["synthetic-signal"][0] == config
    assert cluster.WORKLOADS["synthetic"][0] == "configs/cluster-synthetic-gcn.toml"


def _cluster_json(folder: Path, adaptive: bool = True) -> None:
    run = {
        "calibrated_exchange_s_by_tag": {"layer1/forward": 0.1},
        "exchange_after_arrival_s_by_tag": {"layer1/forward": 0.11} if adaptive else {},
    }
    folder.mkdir(parents=True)
    (folder / "cluster.json").write_text(
        json.dumps({"meta": {"bandwidth": "1gbit", "seeds": [0]}, "runs": {"adaqp": [run]}})
    )


def test_costmodel_without_clusters_reads_every_cluster_it_can(tmp_path, monkeypatch, capsys):
    """``bench costmodel`` with no arguments exited 2 (--clusters was required)."""
    monkeypatch.chdir(tmp_path)
    _cluster_json(tmp_path / DEFAULT_OUT_DIR / "local")
    committed_clusters = tmp_path / costmodel.COMMITTED_CLUSTERS
    _cluster_json(committed_clusters / "committed")
    _cluster_json(committed_clusters / "no-adaptive", adaptive=False)
    (committed_clusters / "garbled").mkdir()
    (committed_clusters / "garbled" / "cluster.json").write_text("{")
    assert main(["costmodel"]) == 0
    report = json.loads((tmp_path / DEFAULT_OUT_DIR / "cost_model.json").read_text())
    assert report["sources"] == {
        "committed": str(costmodel.COMMITTED_CLUSTERS / "committed" / "cluster.json"),
        "local": str(DEFAULT_OUT_DIR / "local" / "cluster.json"),
    }
    assert "reading all 2 found: committed, local" in capsys.readouterr().out


def test_costmodel_with_nothing_to_read_names_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["costmodel"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--clusters not given" in err
    assert f"{costmodel.COMMITTED_CLUSTERS}/NAME/cluster.json" in err


def test_costmodel_reads_the_clusters_its_committed_reading_holds(tmp_path, monkeypatch):
    """The committed reading's command (its README) finds every cluster the reading read."""
    monkeypatch.chdir(ROOT)
    reading_dir = COMMITTED_OUT_DIR / "costmodel" / "shared-vs-host"
    args = build_parser("costmodel").parse_args(
        ["costmodel", "--clusters-dir", str(reading_dir / "clusters"), "--out-dir", str(tmp_path)]
    )
    found = costmodel.readable_clusters(args)
    reading = json.loads((reading_dir / "cost_model.json").read_text())
    assert set(reading["clusters"]) == set(found)
    assert reading["sources"] == {name: str(path) for name, path in found.items()}


def test_costmodel_by_default_reads_the_committed_cluster_readings(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = build_parser("costmodel").parse_args(["costmodel", "--out-dir", str(tmp_path)])
    found = costmodel.readable_clusters(args)
    assert found and all(
        path.parent.parent == costmodel.COMMITTED_CLUSTERS for path in found.values()
    )
