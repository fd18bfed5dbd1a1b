"""A worker group that torchrun restarts keeps to its own job's output directory.

Given no ``--out``, a job whose first attempt failed before it started its run is a new
run (the next free version); one whose first attempt started continues that run. Every
other run's files stay byte-identical either way, however alike their checkpoints are.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTY = Path(__file__).with_name("faulty_train.py")


def _job(cwd: Path, fault: str, epochs: int) -> subprocess.CompletedProcess:
    """A two-worker torchrun job with no --out, the planted ``fault`` in its first attempt."""
    program = ["-m", "adaqp.train"] if not fault else [str(FAULTY)]
    cmd = [
        sys.executable,
        *("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
        *("--max-restarts", "1" if fault else "0"),
        *program,
        *("--config", str(ROOT / "configs/cora-gcn.toml"), "--epochs", str(epochs)),
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
