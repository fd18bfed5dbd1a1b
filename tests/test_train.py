"""The command-line contract and its errors, through real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaqp.config import load_config
from adaqp.datasets import load_dataset
from adaqp.local_graph import LocalGraph
from adaqp.partition_format import load_part, read_metadata
from adaqp.runtime import init_distributed, shutdown
from adaqp.trainer import Trainer
from partition.build import make_partition
from tests.distributed import expect_worker_failure

ROOT = Path(__file__).resolve().parent.parent
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


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


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
def test_four_worker_cora_gcn_run_meets_accuracy_and_writes_outputs(tmp_path):
    out = tmp_path / "run"
    proc = _run(
        _torchrun(4)
        + [
            "--config",
            str(ROOT / "configs/cora-gcn.toml"),
            "--mode",
            "vanilla",
            "--epochs",
            "200",
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
    assert summary["test_acc"] >= 0.77, summary
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 200
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["hidden"] == 64 and config["world_size"] == 4
    assert "test acc" in proc.stdout


def test_single_process_run_with_overrides(tmp_path):
    out = tmp_path / "run"
    proc = _run(
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
    proc = _run([sys.executable, "-m", "adaqp.train", "--epochs", "1", *args], cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_missing_dataset_is_a_clear_error(tmp_path):
    proc = _run(
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
    assert proc.returncode == 1
    assert "absent.npz" in proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


def test_world_size_must_match_partition(tmp_path):
    config = load_config(None, ["data.dataset=cora"])
    parts = tmp_path / "p2"
    make_partition(load_dataset("cora"), parts, num_parts=2, spec=config.data.spec())
    proc = _run(
        [sys.executable, "-m", "adaqp.train", "--epochs", "1", "--set", f"partition.dir={parts}"],
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert "has 2 parts but the world size is 1" in proc.stderr


def _dies_after_one_step(rank: int, world_size: int, init_method: str, part_dir: str):
    config = load_config(
        None, ["data.dataset=cora", f"partition.dir={part_dir}", "comm.timeout_s=30"]
    )
    world = init_distributed(config.comm, init_method, rank, world_size)
    meta = read_metadata(part_dir)
    trainer = Trainer(config, LocalGraph.from_part(load_part(part_dir, rank, meta)), meta, world)
    trainer.train_step()
    if rank == 1:
        os._exit(3)  # a peer dies without a word
    try:
        trainer.fit(_NullWriter())
    finally:
        shutdown(barrier=False)


class _NullWriter:
    def log_epoch(self, record) -> None:
        pass


@pytest.mark.distributed
def test_dead_peer_fails_fast_naming_rank_and_epoch(tmp_path):
    config = load_config(None, ["data.dataset=cora"])
    parts = tmp_path / "p2"
    make_partition(load_dataset("cora"), parts, num_parts=2, spec=config.data.spec())
    tracebacks = expect_worker_failure(_dies_after_one_step, 2, tmp_path, str(parts), timeout=90)
    assert "rank 0" in tracebacks[0] and "epoch 1" in tracebacks[0], tracebacks[0]
