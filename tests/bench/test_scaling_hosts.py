"""``bench scaling --hosts``: the points and tables built from what runs wrote, its flags,
the sweep's flow with stand-in runs, and one tiny real sweep on emulated hosts."""

from __future__ import annotations

import json
import os
from importlib.util import find_spec
from pathlib import Path

import pytest

from adaqp.bench import scaling_hosts
from adaqp.bench.__main__ import build_parser, main
from adaqp.emulate.cgroups import CgroupTree
from tests.emulate.helpers import _namespaces, needs_cgroups, needs_root

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
REQUIRED = {
    "mode",
    "hosts",
    "epoch_time_s",
    "speedup",
    "peak_memory_bytes",
    "peak_memory_above_baseline_bytes",
}


def _result(mode: str, hosts: int, epoch_s: float, peak_mib: float, vals: list[float]) -> dict:
    """What one run wrote, as ``run_point`` returns it."""
    return {
        "mode": mode,
        "hosts": hosts,
        "load_before": 1.0,
        "summary": {
            "epoch_time_s": epoch_s,
            "comm_wait_s": 0.1 * epoch_s,
            "cpu_time_s": 0.4 * epoch_s,
            "halo_bytes_per_epoch": 0 if hosts == 1 else 10_000_000 * hosts,
            "avg_bits": 32.0,
            "test_acc": 0.7,
        },
        "cluster": {
            "elapsed_s": 100.0,
            "hosts": [
                {"peak_memory_bytes": int(peak_mib * MIB) + i, "cpu_seconds": 40.0}
                for i in range(hosts)
            ],
        },
        "epochs": [{"epoch_time_s": epoch_s, "val_acc": v} for v in vals],
    }


def test_points_give_speedup_efficiency_memory_above_baseline_and_time_to_accuracy():
    results = [
        _result("vanilla", 4, 2.0, 400, [0.5, 0.6, 0.7]),
        _result("vanilla", 1, 4.0, 1300, [0.5, 0.6, 0.7]),
        _result("adaqp", 1, 4.0, 1300, [0.5, 0.6, 0.68]),
        _result("adaqp", 4, 1.0, 400, [0.6, 0.7, 0.7]),
    ]
    points = scaling_hosts.build_points(results, baseline_bytes=300 * MIB, tolerance=0.005)
    by = {(p["mode"], p["hosts"]): p for p in points}
    assert set(by) == {("adaqp", 1), ("adaqp", 4), ("vanilla", 1), ("vanilla", 4)}
    assert all(set(p) >= REQUIRED for p in points)
    four = by["adaqp", 4]
    assert four["speedup"] == pytest.approx(4.0) and four["efficiency"] == pytest.approx(1.0)
    assert by["vanilla", 4]["speedup"] == pytest.approx(2.0)
    assert by["vanilla", 4]["efficiency"] == pytest.approx(0.5)
    assert four["speedup_over_vanilla"] == pytest.approx(4.0)
    assert four["speedup_over_fewest_hosts_mean"] == pytest.approx(4.0)  # both took 4 s
    # The highest host's peak (host i adds i bytes), less the baseline.
    assert four["peak_memory_bytes"] == 400 * MIB + 3
    assert four["peak_memory_above_baseline_bytes"] == 100 * MIB + 3
    assert four["memory_above_baseline_ratio"] == pytest.approx((100 * MIB + 3) / (1000 * MIB))
    assert four["halo_mb_per_epoch"] == pytest.approx(40.0)
    assert four["cpu_share_by_host"] == [0.4] * 4
    # Target: 1-host Vanilla's final val 0.7 - 0.005. adaqp on 1 host never reaches it;
    # on 4 hosts in its second epoch (two epochs of 1 s).
    assert by["adaqp", 1]["time_to_vanilla_val_s"] is None
    assert four["time_to_vanilla_val_s"] == pytest.approx(2.0)
    assert by["vanilla", 1]["time_to_vanilla_val_s"] == pytest.approx(12.0)
    assert by["vanilla", 1]["final_val_acc"] == 0.7


def test_time_to_accuracy_counts_the_solves_between_epochs():
    """The ranks wait for a bit-width re-solve before the next epoch: it is training time."""
    results = [
        _result("vanilla", 1, 4.0, 1300, [0.5, 0.6, 0.7]),
        _result("adaqp", 4, 1.0, 400, [0.6, 0.7, 0.7]),
    ]
    results[1]["epochs"][0]["solver_time_s"] = 0.5
    points = scaling_hosts.build_points(results, baseline_bytes=None)
    adaqp = next(p for p in points if p["mode"] == "adaqp")
    assert adaqp["time_to_vanilla_val_s"] == pytest.approx(2.5)


def test_points_without_a_baseline_or_memory_counters_leave_those_keys_empty():
    result = _result("vanilla", 1, 1.0, 100, [0.5])
    result["cluster"]["hosts"][0]["peak_memory_bytes"] = None
    (point,) = scaling_hosts.build_points([result], baseline_bytes=None)
    assert point["peak_memory_bytes"] is None
    assert point["peak_memory_above_baseline_bytes"] is None
    assert point["memory_above_baseline_ratio"] is None
    assert point["speedup"] == 1.0


def test_host_sweep_flags_parse_with_their_defaults():
    args = build_parser("scaling").parse_args(
        ["scaling", "--hosts", "1,2,4", "--bandwidth", "300mbit", "--memory-per-host", "3g"]
    )
    assert args.hosts == [1, 2, 4]
    assert (args.cpus_per_host, args.bandwidth, args.memory_per_host) == ("0.5", "300mbit", "3g")
    assert args.modes == "vanilla,adaqp,onebit,nocomm"
    assert args.config == scaling_hosts.HOSTS_CONFIG and (ROOT / args.config).is_file()
    plain = build_parser("scaling").parse_args(["scaling"])
    assert plain.hosts is None and plain.world_sizes == [1, 2, 4, 8]  # the P sweep, unchanged
    with pytest.raises(SystemExit):
        build_parser("scaling").parse_args(["scaling", "--hosts", "0,2"])


def test_help_names_the_host_sweep(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["scaling", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--hosts", "--cpus-per-host", "--bandwidth", "--modes", "--world-sizes"):
        assert flag in out


@pytest.fixture
def stand_ins(monkeypatch):
    """The sweep with its runs, partitions, baseline and control groups stood in for."""
    calls = []

    def run_point(args, tree, mode, hosts):
        calls.append((mode, hosts))
        if mode == "adaqp" and hosts == 2:
            raise RuntimeError("host 1 exited with 1")
        return _result(mode, hosts, 4.0 / hosts, 1300 / hosts, [0.6, 0.7])

    monkeypatch.setattr(scaling_hosts, "run_point", run_point)
    monkeypatch.setattr(scaling_hosts, "_partition", lambda args, hosts: 0.5)
    monkeypatch.setattr(scaling_hosts, "measure_baseline", lambda tree, cpus, t: 300 * MIB)
    monkeypatch.setattr(scaling_hosts, "find_cgroups", lambda: CgroupTree(2, ()))
    return calls


def test_sweep_runs_every_mode_at_every_host_count_and_writes_json_table_and_figure(
    tmp_path, stand_ins, capsys
):
    code = main(
        ["scaling", "--hosts", "1,2", "--modes", "vanilla,adaqp", "--out-dir", str(tmp_path)]
    )
    assert code == 1  # one point failed: reported, the others written
    assert stand_ins == [("vanilla", 1), ("vanilla", 2), ("adaqp", 2), ("adaqp", 1)]
    report = json.loads((tmp_path / "scaling.json").read_text())
    points = report["hosts_sweep"]
    assert [(p["mode"], p["hosts"]) for p in points] == [
        ("adaqp", 1),
        ("vanilla", 1),
        ("vanilla", 2),
    ]
    assert all(set(p) >= REQUIRED for p in points)
    assert report["hosts_meta"]["baseline_peak_memory_bytes"] == 300 * MIB
    assert report["hosts_meta"]["failed"] == {"adaqp-h2": "host 1 exited with 1"}
    table = (tmp_path / "scaling.md").read_text()
    assert "| vanilla | 2 | 2000 | 2.00x | 1.00 |" in table
    assert "Failed: adaqp-h2" in table
    assert (tmp_path / "scaling.png").exists() == (find_spec("matplotlib") is not None)
    out = capsys.readouterr().out
    assert "vanilla on 1 host: epoch 4000 ms" in out and "vanilla on 2 hosts: epoch" in out
    assert "adaqp on 2 hosts: failed, host 1 exited with 1" in out


def test_sweep_refuses_modes_without_vanilla_or_unknown(tmp_path, stand_ins, capsys):
    for modes in ("adaqp,nocomm", "vanilla,bogus"):
        with pytest.raises(SystemExit) as exit_info:
            main(["scaling", "--hosts", "1,2", "--modes", modes, "--out-dir", str(tmp_path)])
        assert exit_info.value.code == 2
    assert "must include vanilla" in capsys.readouterr().err
    assert not stand_ins


@pytest.mark.slow
@needs_root
@needs_cgroups
def test_tiny_real_sweep_on_cora_measures_and_tears_down(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs and partitions go under tmp_path
    code = main(
        [
            *("scaling", "--hosts", "1,2", "--modes", "vanilla", "--epochs", "2"),
            *("--config", str(ROOT / "configs/cora-gcn.toml"), "--timeout", "240"),
            *("--set", "train.eval_every=1", "--out-dir", "out"),
        ]
    )
    assert code == 0
    report = json.loads(Path("out/scaling.json").read_text())
    points = {p["hosts"]: p for p in report["hosts_sweep"]}
    assert set(points) == {1, 2}
    baseline = report["hosts_meta"]["baseline_peak_memory_bytes"]
    assert 50 * MIB < baseline < points[1]["peak_memory_bytes"]
    assert points[2]["halo_mb_per_epoch"] > 0 == points[1]["halo_mb_per_epoch"]
    assert points[1]["speedup"] == 1.0 and points[2]["speedup"] > 0
    assert _namespaces(str(os.getpid() % 100000)) == []


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--cpus-per-host", "0.5,0.5"), ("--memory-per-host", "1g,2g"), ("--bandwidth", "1gbit,")],
)
def test_sweep_refuses_one_value_per_host_before_any_work(tmp_path, stand_ins, capsys, flag, value):
    """Its points differ in their host count: a list fits at most one of them (it used to
    pass the check, then fail after partitioning)."""
    partitioned = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scaling_hosts, "_partition", lambda args, hosts: partitioned.append(hosts))
        with pytest.raises(SystemExit) as exit_info:
            main(["scaling", "--hosts", "1,2", flag, value, "--out-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} {value}: the host sweep gives every host the same value" in err, err
    assert (partitioned, stand_ins) == ([], [])


def test_sweep_refuses_a_value_it_cannot_read(tmp_path, stand_ins, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["scaling", "--hosts", "2", "--cpus-per-host", "half", "--out-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "cpus-per-host: cannot read 'half'" in capsys.readouterr().err
