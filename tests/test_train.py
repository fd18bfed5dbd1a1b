"""The command-line contract and its errors, through real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from adaqp.config import load_config
from adaqp.data import load_dataset
from adaqp.graph.local import LocalGraph
from adaqp.partitioning.build import make_partition
from adaqp.partitioning.schema import read_metadata
from adaqp.partitioning.store import load_part
from adaqp.run.trainer import Trainer
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import NullWriter, expect_worker_failure
from tests.train_command import ROOT, command_env, run_command, train_args, wait_for

SUMMARY_FIELDS = {
    "mode",
    "dataset",
    "model",
    "world_size",
    "epochs",
    "final_train_loss",
    "best_val_acc",
    "test_acc",
    "epoch_time_s",
    "comm_time_s",
    "halo_bytes_per_epoch",
    "avg_bits",
    "max_staleness",
}


def _torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--standalone",
        "-m",
        "adaqp.train",
    ]


@pytest.mark.distributed
@pytest.mark.slow
def test_four_worker_cora_gcn_run_learns_and_writes_outputs(tmp_path):
    out = tmp_path / "run"
    proc = run_command(
        _torchrun(4)
        + [
            "--config",
            str(ROOT / "configs/cora-gcn.toml"),
            "--mode",
            "vanilla",
            "--epochs",
            "40",  # accuracy after 200 epochs: test_trainer's 4-worker Cora comparison
            "--seed",
            "0",
            "--out",
            str(out),
            "--set",
            f"partition.dir={tmp_path / 'p'}",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= SUMMARY_FIELDS
    assert summary["world_size"] == 4 and summary["mode"] == "vanilla"
    assert summary["avg_bits"] == 32 and summary["max_staleness"] == 0
    assert summary["halo_bytes_per_epoch"] > 0
    assert summary["test_acc"] >= 0.7, summary  # it learned (chance is 0.3)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 40
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["hidden"] == 64 and config["world_size"] == 4
    assert "test acc" in proc.stdout


@pytest.mark.distributed
@pytest.mark.slow
def test_four_layers_without_the_input_cache_train_only_the_loss_rows_as_all(tmp_path):
    """The command that crashed the default (a rank's exchange full in one direction
    only): Cora, 4 layers, no layer-0 halo cache, 4 workers. It trains, and its losses
    equal computing every row's."""
    losses = {}
    for rows in ("loss", "all"):
        out = tmp_path / rows
        proc = run_command(
            _torchrun(4)
            + [
                # train_args without its "python -m adaqp.train", which torchrun replaces
                *train_args(out, tmp_path / "p", "--mode", "vanilla", "--epochs", "3")[3:],
                *("--set", "model.layers=4", "--set", "comm.cache_input_halo=false"),
                *("--set", f"train.compute_rows={rows}"),
            ],
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        lines = (out / "metrics.jsonl").read_text().splitlines()
        losses[rows] = [json.loads(line)["train_loss"] for line in lines]
    assert len(losses["loss"]) == 3
    assert losses["loss"] == pytest.approx(losses["all"], rel=1e-5)


def test_single_process_run_with_overrides(tmp_path):
    out = tmp_path / "run"
    proc = run_command(
        [
            sys.executable,
            "-m",
            "adaqp.train",
            "--config",
            str(ROOT / "configs/cora-sage.toml"),
            "--epochs",
            "3",
            "--out",
            str(out),
            "--set",
            "model.layers=3",
            "--set",
            "model.hidden=32",
            "--set",
            "model.dropout=0",
            "--set",
            "train.lr=0.02",
            "--set",
            f"partition.dir={tmp_path / 'p'}",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["halo_bytes_per_epoch"] == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == {
        "name": "sage",
        "layers": 3,
        "hidden": 32,
        "dropout": 0.0,
        "layernorm": False,
        # GAT's keys at their defaults (config.json is the whole resolved config).
        "heads": 4,
        "output_heads": 1,
        "attn_dropout": 0.0,
    }
    assert config["train"]["lr"] == 0.02


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "model.hiden=3"], "model.hiden: unknown key"),
        (["--set", "train.lr=fast"], "train.lr"),
        (["--mode", "warp"], "comm.mode"),
    ],
)
def test_config_errors_exit_2_naming_the_key(tmp_path, args, message):
    proc = run_command([sys.executable, "-m", "adaqp.train", "--epochs", "1", *args], cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_missing_dataset_is_a_clear_error(tmp_path):
    proc = run_command(
        [
            sys.executable,
            "-m",
            "adaqp.train",
            "--epochs",
            "1",
            "--set",
            "data.dataset=npz",
            "--set",
            f"data.path={tmp_path / 'absent.npz'}",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 2  # a config error, refused before the run starts
    assert "absent.npz" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_world_size_must_match_partition(tmp_path):
    config = load_config(None, ["data.dataset=cora"])
    parts = tmp_path / "p2"
    make_partition(load_dataset("cora"), parts, num_parts=2, spec=config.data.spec())
    proc = run_command(
        [sys.executable, "-m", "adaqp.train", "--epochs", "1", "--set", f"partition.dir={parts}"],
        cwd=tmp_path,
    )
    assert proc.returncode == 2  # a usage error, refused before the run starts
    assert "has 2 parts but the world size is 1" in proc.stderr


def _dies_after_one_step(rank: int, world_size: int, init_method: str, part_dir: str):
    config = load_config(
        None, ["data.dataset=cora", f"partition.dir={part_dir}", "comm.timeout_s=30"]
    )
    world = init_distributed(config.comm, init_method, rank, world_size)
    meta = read_metadata(part_dir)
    trainer = Trainer(config, LocalGraph.from_part(load_part(part_dir, rank, meta)), meta, world)
    trainer.train_step(epoch=1)
    if rank == 1:
        os._exit(3)  # a peer dies without a word
    try:
        trainer.fit(NullWriter())
    finally:
        shutdown(barrier=False)


@pytest.mark.distributed
def test_dead_peer_fails_fast_naming_rank_and_epoch(tmp_path):
    config = load_config(None, ["data.dataset=cora"])
    parts = tmp_path / "p2"
    make_partition(load_dataset("cora"), parts, num_parts=2, spec=config.data.spec())
    tracebacks = expect_worker_failure(_dies_after_one_step, 2, tmp_path, str(parts), timeout=90)
    assert "rank 0" in tracebacks[0] and "epoch 1" in tracebacks[0], tracebacks[0]


def test_finished_out_is_refused_unless_overwrite(tmp_path):
    out, parts = tmp_path / "run", tmp_path / "p"
    no_checkpoints = ("--set", "checkpoint.every=0")
    assert (
        run_command(
            train_args(out, parts, "--epochs", "2", *no_checkpoints), cwd=tmp_path
        ).returncode
        == 0
    )
    first = (out / "summary.json").read_text()

    again = run_command(train_args(out, parts, "--epochs", "3"), cwd=tmp_path)
    assert again.returncode == 2, again.stderr  # refused before the run starts
    assert "holds a finished run" in again.stderr and "--overwrite" in again.stderr
    assert (out / "summary.json").read_text() == first
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2

    resume = run_command(train_args(out, parts, "--resume"), cwd=tmp_path)
    assert resume.returncode == 2
    assert "no checkpoint to resume from" in resume.stderr
    both = run_command(train_args(out, parts, "--resume", "--overwrite"), cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with" in both.stderr
    assert (out / "summary.json").read_text() == first

    fresh = run_command(train_args(out, parts, "--epochs", "3", "--overwrite"), cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads((out / "summary.json").read_text())["epochs"] == 3
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    assert json.loads((out / "status.json").read_text())["status"] == "complete"


def test_a_missing_data_file_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    args = train_args(out, tmp_path / "p", "--epochs", "1", "--set", "data.dataset=npz")
    proc = run_command([*args, "--set", f"data.path={tmp_path / 'absent.npz'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "absent.npz" in errors[0], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run folder, no partition


def test_second_run_into_a_running_out_is_refused_and_interrupt_is_recorded(tmp_path):
    out, parts = tmp_path / "run", tmp_path / "p"
    out.mkdir()
    (out / "summary.json").write_text('{"test_acc": 0.5}\n')  # an old, finished run
    first = subprocess.Popen(
        train_args(out, parts, "--epochs", "100000", "--overwrite"),
        cwd=tmp_path,
        env=command_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a background job of a script starts: with SIGINT ignored. Ctrl-C must still
        # interrupt the run.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        metrics = out / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, "the first run")
        assert not (out / "summary.json").exists()  # gone before training, not after

        second = run_command(train_args(out, parts, "--epochs", "3", "--overwrite"), cwd=tmp_path)
        assert second.returncode == 2, second.stderr  # refused before it starts
        assert "in use by another run" in second.stderr, second.stderr

        first.send_signal(signal.SIGINT)  # Ctrl-C
        _, stderr = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 130, stderr
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "interrupted", status
    assert not (out / "summary.json").exists()
    assert json.loads((out / "config.json").read_text())["train"]["epochs"] == 100000
    epochs = [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()]
    assert epochs == list(range(1, len(epochs) + 1))  # one writer only


@pytest.mark.distributed
@pytest.mark.parametrize("case", ["file", "finished"])
def test_refused_out_stops_every_rank_before_partitioning(tmp_path, case):
    """Rank 1 learns rank 0's verdict at once (not after the 600 s collective timeout)."""
    if case == "file":
        out = tmp_path / "a-file"
        out.write_text("")
        expected = "a-file exists and is not a directory"
    else:
        out = tmp_path / "run"
        out.mkdir()
        (out / "summary.json").write_text("{}\n")
        expected = "holds a finished run (summary.json)"
    parts = tmp_path / "p"
    args = train_args(out, parts, "--epochs", "3")[3:]  # the flags after "-m adaqp.train"
    started = time.monotonic()
    proc = run_command(_torchrun(2) + args, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0
    assert time.monotonic() - started < 300
    log = proc.stdout + proc.stderr
    # Both ranks stop on the verdict; rank 0 says it once, for both.
    errors = [ln for ln in log.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], log
    assert not parts.exists()  # refused before partitioning
