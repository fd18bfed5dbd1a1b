"""python -m adaqp.memory, and the refusals the launcher and the emulated cluster give
(above the usable share of a host's memory, not only above all of it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import adaqp.memory.limits as limits
from adaqp.config import load_config
from adaqp.emulate.cli import main as cluster_main
from adaqp.launcher import main as launcher_main
from adaqp.memory.__main__ import main as memory_main
from adaqp.memory.check import refusal
from adaqp.memory.estimate import RUNTIME_BYTES, _exchange_bits, predict
from adaqp.memory.limits import HostLimit
from adaqp.partitioning.build import ensure_partition

CONFIG = "configs/cora-gcn.toml"


@pytest.fixture(scope="module")
def cora_parts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parts") / "cora-p2"
    config = load_config(CONFIG, [])
    ensure_partition(config.data, config.partition, 2, out)
    return out


def test_json_gives_every_worker_and_the_largest(cora_parts, capsys) -> None:
    code = memory_main(
        ["--config", CONFIG, "--nproc", "2", "--json", "--set", f"partition.dir={cora_parts}"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    per_worker = out["peak_memory_bytes_per_worker"]
    assert len(per_worker) == 2 and out["peak_memory_bytes"] == max(per_worker)
    assert out["source"] == f"partition {cora_parts}"
    # The partition's own counts: both parts together hold every Cora node once.
    assert sum(s["num_inner"] for s in out["shape_per_worker"]) == 2708
    assert all(terms["runtime"] == RUNTIME_BYTES for terms in out["terms_per_worker"])
    terms = out["terms_per_worker"]
    assert all(sum(t.values()) == p for t, p in zip(terms, per_worker, strict=True))


def test_without_a_partition_the_graph_sizes_are_used(tmp_path) -> None:
    config = load_config(
        "configs/scaling-synthetic-signal-gcn.toml", [f"partition.dir={tmp_path / 'none'}"]
    )
    one, four = predict(config, 1), predict(config, 4, halo_per_inner=0.5)
    assert one.source.startswith("graph sizes") and one.workers[0].shape.num_halo == 0
    assert four.workers[0].shape.num_inner == 51500  # 1.03 x 200k / 4
    assert four.workers[0].shape.num_halo == 25750
    # Activations scale with the rows: without a halo, a quarter of the rows gives about
    # a quarter (four workers defer the weight gradient, one does not) ...
    alone = predict(config, 4, halo_per_inner=0.0)
    ratio = alone.workers[0].terms["activations"] / one.workers[0].terms["activations"]
    assert ratio == pytest.approx(51500 / 200000, rel=0.2)
    # ... and the halo rows add the cached input, and the exchange buffers where they
    # come at the peak (not here: the transformed rows go before the halo rows land).
    assert four.workers[0].terms["activations"] >= alone.workers[0].terms["activations"]
    assert four.peak_memory_bytes > alone.peak_memory_bytes
    assert four.workers[0].terms["features"] > alone.workers[0].terms["features"]
    overrides = [f"partition.dir={tmp_path / 'none'}", "model.hidden=512"]
    wider = predict(load_config("configs/scaling-synthetic-signal-gcn.toml", overrides), 1)
    assert wider.peak_memory_bytes > one.peak_memory_bytes


def test_bad_arguments_exit_2(capsys) -> None:
    assert memory_main(["--config", "nope.toml", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config file nope.toml not found; the configs here: "), err
    assert "configs/cora-gcn.toml" in err
    with pytest.raises(SystemExit) as stop:
        memory_main(["--config", CONFIG, "--nproc", "0"])
    assert stop.value.code == 2


def test_the_launcher_refuses_a_run_over_the_hosts_memory(cora_parts, monkeypatch, capsys):
    monkeypatch.setattr(limits, "host_limit", lambda: HostLimit(100 * 2**20, "a test limit"))
    args = [CONFIG, "--nproc", "2", "--epochs", "1", "--set", f"partition.dir={cora_parts}"]
    assert launcher_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: this host needs ")
    assert f"{limits.USABLE_FRACTION:.0%} of its 0.1 GiB (a test limit)" in err[0]


def _near_the_limit(cora_parts: Path) -> tuple[int, HostLimit]:
    """Two Cora workers' predicted need, and a limit it is under but within the headroom:
    midway between the usable share and the whole."""
    config = load_config(CONFIG, [f"partition.dir={cora_parts}"])
    need = predict(config, 2, config_path=CONFIG).host_bytes(range(2))
    limit = HostLimit(int(need / ((1 + limits.USABLE_FRACTION) / 2)), "a test limit")
    assert limit.usable_bytes < need < limit.bytes
    return need, limit


def test_the_launcher_refuses_a_need_within_the_headroom(cora_parts, monkeypatch, capsys):
    need, limit = _near_the_limit(cora_parts)
    monkeypatch.setattr(limits, "host_limit", lambda: limit)
    args = [CONFIG, "--nproc", "2", "--epochs", "1", "--set", f"partition.dir={cora_parts}"]
    assert launcher_main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"this host needs {need / 2**30:.2f} GiB" in line
    assert f"over the {limit.usable_bytes / 2**30:.2f} GiB a run may take: " in line
    assert f"{limits.USABLE_FRACTION:.0%} of its {limit.bytes / 2**30:.1f} GiB" in line


def test_the_check_refuses_within_the_headroom_and_passes_below_it(cora_parts) -> None:
    need, limit = _near_the_limit(cora_parts)
    train_args = ["--set", f"partition.dir={cora_parts}"]
    line = refusal(CONFIG, train_args, 2, [(range(2), limit)])
    assert line is not None and line.startswith(f"this host needs {need / 2**30:.2f} GiB")
    roomy = HostLimit(int(need / limits.USABLE_FRACTION) + 1, "a test limit")
    assert refusal(CONFIG, train_args, 2, [(range(2), roomy)]) is None


def test_the_emulated_cluster_refuses_before_starting_anything(cora_parts, caplog):
    args = ["--hosts", "2", "--memory-per-host", "100m", "--", "--config", CONFIG]
    args += ["--set", f"partition.dir={cora_parts}"]
    assert cluster_main(args) == 2
    assert "host 0 needs" in caplog.text and "(--memory-per-host)" in caplog.text


def test_gat_says_its_prediction_is_a_lower_bound(tmp_path, capsys) -> None:
    """docs/memory.md: GAT's per-edge attention tensors are not counted; the output says so
    (its fields unchanged), and GCN's says nothing of it."""
    no_parts = ["--set", f"partition.dir={tmp_path / 'none'}"]
    gat = ["--config", "configs/cora-gat.toml", "--nproc", "2", *no_parts]
    assert memory_main([*gat, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lower_bound"] is True and "lower bound" in out["note"]
    assert out["peak_memory_bytes"] == max(out["peak_memory_bytes_per_worker"])
    assert memory_main(gat) == 0
    text = capsys.readouterr().out
    assert f"largest worker: at least {out['peak_memory_bytes'] / 2**30:.2f} GiB" in text
    assert f"note: {out['note']}" in text
    gcn = ["--config", CONFIG, "--nproc", "2", *no_parts]
    assert memory_main([*gcn, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["lower_bound"], out["note"]) == (False, None)
    assert memory_main(gcn) == 0
    assert "at least" not in capsys.readouterr().out


def test_counts_of_one_are_singular(tmp_path, capsys) -> None:
    args = ["--config", CONFIG, "--set", f"partition.dir={tmp_path / 'none'}"]
    assert memory_main([*args, "--nproc", "2", "--halo-per-inner", "1"]) == 0
    out = capsys.readouterr().out
    assert "; 1 halo row per inner row assumed)" in out and ": 2 workers, " in out
    assert memory_main([*args, "--nproc", "1"]) == 0
    out = capsys.readouterr().out
    assert "; 0 halo rows per inner row assumed)" in out and ": 1 worker, " in out
    assert memory_main([*args, "--nproc", "2", "--halo-per-inner", "0.5"]) == 0
    assert "; 0.5 halo rows per inner row assumed)" in capsys.readouterr().out


def test_hosts_of_finds_the_fewest_hosts_that_fit(tmp_path, capsys) -> None:
    where = f"partition.dir={tmp_path / 'none'}"
    base = ["--config", CONFIG, "--set", where]
    assert memory_main([*base, "--hosts-of", "64g"]) == 0
    assert "fewest hosts of 64 GiB: 1" in capsys.readouterr().out
    assert memory_main([*base, "--hosts-of", "100m", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # under the runtime alone: nothing fits
    assert out["fewest_hosts"] is None and [t["nproc"] for t in out["tries"]][-1] == 1024
    with pytest.raises(SystemExit) as exited:  # neither --nproc nor --hosts-of
        memory_main(["--config", CONFIG])
    assert exited.value.code == 2 and "--hosts-of" in capsys.readouterr().err


def test_hosts_of_finds_a_number_between_powers_of_two(tmp_path, capsys) -> None:
    """Parts may be any number: a host that 3 workers fit and 2 do not gives 3, not 4."""
    where = f"partition.dir={tmp_path / 'none'}"
    scaling = "configs/scaling-synthetic-signal-gcn.toml"  # its peak falls with workers
    config = load_config(scaling, [where])
    two, three = (predict(config, p, None, scaling, 1).peak_memory_bytes for p in (2, 3))
    assert three < two
    host = int((two + three) / 2 / 0.9)  # --hosts-of counts 90% of a host usable
    assert (
        memory_main(["--config", scaling, "--set", where, "--hosts-of", str(host), "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["fewest_hosts"] == 3
    assert [t["nproc"] for t in out["tries"]] == [1, 2, 3, 4]


def test_a_quantized_mode_is_walked_as_float_rows_where_a_host_holds_two(cora_parts) -> None:
    def bits(mode: str, per_host: int, *overrides: str) -> int:
        return _exchange_bits(load_config(CONFIG, [f"comm.mode={mode}", *overrides]), per_host)

    assert bits("adaqp", 2) == 32  # float32 between the workers of one host
    assert bits("adaqp", 1) == bits("adaqp", 2, "quant.full_precision=never") == 1
    assert bits("adaqp", 1, "quant.full_precision=profile") == 32  # may choose float32
    assert bits("vanilla", 1) == 32
    config = load_config(CONFIG, [f"partition.dir={cora_parts}", "comm.mode=adaqp"])
    vanilla = predict(load_config(CONFIG, [f"partition.dir={cora_parts}"]), 2)
    assert predict(config, 2).workers[0].terms == vanilla.workers[0].terms


def test_help_names_every_option(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        memory_main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert all(flag in out for flag in ("--nproc-per-host", "--hosts-of", "within 90% of SIZE"))
