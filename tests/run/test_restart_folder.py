"""A worker group that torchrun restarts keeps to its own job's output directory.

Given no ``--out``, a job whose first attempt failed before it started its run is a new
run (the next free version); one whose first attempt started continues that run, and one
whose run had finished leaves it as it is. Every other run's files stay byte-identical
either way, however alike their checkpoints are. ``--resume`` without ``--out`` says
which run it continues.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adaqp.config import load_config
from tests.distributed import run_workers

ROOT = Path(__file__).resolve().parents[2]
CORA = ROOT / "configs/cora-gcn.toml"
FAULTY = Path(__file__).with_name("faulty_train.py")


def _job(cwd: Path, fault: str, epochs: int) -> subprocess.CompletedProcess:
    """A two-worker torchrun job with no --out, the planted ``fault`` in its first attempt."""
    program = ["-m", "adaqp.train"] if not fault else [str(FAULTY)]
    cmd = [
        sys.executable,
        *("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
        *("--max-restarts", "1" if fault else "0"),
        *program,
        *("--config", str(CORA), "--epochs", str(epochs)),
        *("--set", "checkpoint.every=2", "--set", "metrics.progress=false"),
        *("--set", f"partition.dir={cwd / 'parts'}"),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", ADAQP_TEST_FAULT=fault)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


def _files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and its SHA-256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.distributed
@pytest.mark.slow
def test_a_restarted_job_never_takes_over_another_run(tmp_path):
    first = _job(tmp_path, "", 4)
    assert first.returncode == 0, first.stderr[-3000:]
    (older,) = (tmp_path / "results/runs").iterdir()
    assert (older / "checkpoints").is_dir()  # a checkpoint the restart could have resumed
    kept = _files(older)

    # Rank 1 dies while rank 0 partitions: the restart is a new run, in a new version.
    before = _job(tmp_path, "before-start", 4)
    assert before.returncode == 0, before.stderr[-3000:]
    assert "planted fault before-start" in before.stderr
    assert _files(older) == kept
    fresh = older.with_name(f"{older.name}-v2")
    assert _summary(fresh)["restarts"] == 1
    assert _summary(fresh)["resumed_from_epoch"] == 0
    kept_fresh = _files(fresh)

    # Rank 1 dies after the checkpoint of epoch 2: the restart continues its own run.
    after = _job(tmp_path, "after-start", 6)
    assert after.returncode == 0, after.stderr[-3000:]
    assert "planted fault after-start" in after.stderr
    assert _files(older) == kept and _files(fresh) == kept_fresh
    own = older.with_name(f"{older.name}-v3")
    assert _summary(own)["restarts"] == 1
    assert _summary(own)["resumed_from_epoch"] == 2
    assert _summary(own)["epochs"] == 6
    lines = (own / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(1, 7))
    assert sorted(p.name for p in tmp_path.joinpath("results/runs").iterdir()) == sorted(
        [older.name, fresh.name, own.name]
    )


def _restart_worker(rank: int, world_size: int, init_method: str, out: str, restarts: int):
    """``adaqp.run.job.run`` as the attempt ``restarts`` of one torchrun job would run it."""
    import adaqp.runtime
    from adaqp.run.job import run

    adaqp.runtime._process_identity = lambda: "job-a"  # every attempt: one job's identity
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(restarts)
    overrides = ["train.epochs=2", "checkpoint.every=1", "metrics.progress=false"]
    overrides += [f"partition.dir={Path(out).parent / 'parts'}", f"metrics.out={out}"]
    summary = run(load_config(CORA, overrides), init_method, rank, world_size)
    return {"restarts": np.array(summary.restarts), "loss": np.array(summary.final_train_loss)}


@pytest.mark.distributed
def test_a_restart_after_the_run_finished_changes_nothing_and_succeeds(tmp_path):
    """A worker failed on its way out of a finished run (torchrun then restarts the group):
    the restart returns the finished run's summary and leaves its files as they were (it
    used to resume from the last checkpoint and write them again)."""
    out = tmp_path / "run"
    first = run_workers(_restart_worker, 2, tmp_path, str(out), 0)[0]
    kept = _files(out)
    assert _summary(out)["restarts"] == 0 and (out / "checkpoints").is_dir()
    restart = run_workers(_restart_worker, 2, tmp_path, str(out), 1)
    assert _files(out) == kept
    for rank in restart:  # every rank has the finished run's summary
        assert int(rank["restarts"]) == 0 and float(rank["loss"]) == float(first["loss"])


@pytest.mark.distributed
@pytest.mark.slow
def test_a_worker_failing_on_its_way_out_leaves_the_finished_run(tmp_path):
    """The same through torchrun: rank 1 exits 1 after the run finished, the restarted
    group finds it finished and exits 0, its files as the first attempt wrote them."""
    job = _job(tmp_path, "at-exit", 4)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "planted fault at-exit" in job.stderr
    (own,) = (tmp_path / "results/runs").iterdir()
    assert "had already finished" in job.stderr, job.stderr[-3000:]
    summary = _summary(own)
    assert summary["restarts"] == 0 and summary["resumed_from_epoch"] == 0
    lines = (own / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3, 4]
    assert json.loads((own / "status.json").read_text())["status"] == "complete"


def _train(cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    """One process, no torchrun, no --out."""
    cmd = [sys.executable, "-m", "adaqp.train", "--config", str(CORA), *flags]
    cmd += ["--set", "metrics.progress=false", "--set", f"partition.dir={cwd / 'parts'}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_resume_without_out_says_which_run_it_continues(tmp_path):
    """It used to say that the default folder "holds another run: this one goes to" the
    -v2 it resumed."""
    for _ in range(2):
        done = _train(tmp_path, "--epochs", "2", "--set", "checkpoint.every=1")
        assert done.returncode == 0, done.stderr[-3000:]
    resumed = _train(tmp_path, "--epochs", "3", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    newest = Path("results/runs/cora-gcn-vanilla-p1-v2")
    assert f"resuming {newest} from the checkpoint at epoch 2 (0 epochs to redo)" in (
        resumed.stderr
    ), resumed.stderr[-3000:]
    assert "holds another run" not in resumed.stderr
    assert _summary(tmp_path / newest)["resumed_from_epoch"] == 2
