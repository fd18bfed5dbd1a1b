"""Faults tried as a user meets them: each bad input is a clear error before training
that leaves nothing looking valid; a lost or stopped worker ends the run promptly,
naming it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from adaqp.bench import torchrun_command
from adaqp.data import load_dataset
from adaqp.partitioning.build import make_partition
from tests.distributed import NullWriter, worker_pid

ROOT = Path(__file__).resolve().parent.parent
ARRAYS = ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _train(out: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "adaqp.train", "--out", str(out), *flags]
    cmd += ["--set", "metrics.progress=false"]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def bad_graphs(tmp_path_factory):
    """npz datasets with one defect each."""
    root = tmp_path_factory.mktemp("graphs")
    cora = load_dataset("cora")
    paths = {}

    def variant(name, **changes):
        # Written by hand: save_npz refuses to write an invalid graph.
        arrays = {key: getattr(cora, key) for key in ARRAYS}
        path = root / f"{name}.npz"
        np.savez(
            path,
            **{**arrays, **changes},
            num_classes=np.int64(cora.num_classes),
            multilabel=np.bool_(False),
            name=np.str_(name),
            info=np.str_("{}"),
        )
        paths[name] = path

    features = cora.features.copy()
    features[5, 3] = np.nan
    variant("nan-features", features=features)
    labels = cora.labels.copy()
    labels[np.flatnonzero(cora.train_mask)[0]] = 99
    variant("label-out-of-range", labels=labels)
    variant("short-mask", val_mask=cora.val_mask[:-3])
    variant("no-training-nodes", train_mask=np.zeros_like(cora.train_mask))
    return paths


CONFIG = ("--config", str(ROOT / "configs/cora-gcn.toml"), "--epochs", "3")

BAD_INPUTS = {
    # name: (flags, exit code, words the error must contain)
    "negative epochs": (("--epochs", "-1"), 2, "train.epochs"),
    "zero hidden size": (("--set", "model.hidden=0"), 2, "model.hidden"),
    "negative learning rate": (("--set", "train.lr=-0.1"), 2, "train.lr"),
    "infinite learning rate": (("--set", "train.lr=inf"), 2, "train.lr: must be a finite"),
    "unknown mode": (("--mode", "fast"), 2, "comm.mode"),
    "mistyped key": (("--set", "train.epoch=3"), 2, "train.epoch: unknown key"),
    "mistyped value": (("--set", "model.layers=two"), 2, "model.layers"),
    "diverging run": (("--set", "train.lr=1e30"), 1, "training loss is nan at epoch"),
    "NaN features": (("npz", "nan-features"), 1, "NaN or Inf"),
    "label out of range": (("npz", "label-out-of-range"), 1, "label"),
    "mask of the wrong length": (("npz", "short-mask"), 1, "val_mask"),
    "empty training set": (("npz", "no-training-nodes"), 1, "training"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_a_clear_error_leaving_nothing_valid(case, bad_graphs, tmp_path):
    flags, code, words = BAD_INPUTS[case]
    if flags[0] == "npz":
        path = bad_graphs[flags[1]]
        flags = ("--set", "data.dataset=npz", "--set", f"data.path={path}")
    out = tmp_path / "run"
    proc = _train(out, *CONFIG, "--set", f"partition.dir={tmp_path / 'parts'}", *flags)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert words.lower() in proc.stderr.lower(), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (out / "summary.json").exists()
    status = out / "status.json"
    if status.exists():  # the run had started: its output says it failed
        assert json.loads(status.read_text())["status"] == "failed"


def test_partition_of_another_graph_is_refused(tmp_path):
    parts = tmp_path / "parts"
    make_partition(load_dataset("cora"), parts, num_parts=1, spec={"name": "cora", "split_seed": 0})
    proc = _train(
        tmp_path / "run",
        *CONFIG,
        "--set",
        "data.dataset=citeseer",
        "--set",
        f"partition.dir={parts}",
    )
    assert proc.returncode == 2  # a usage error, refused before the run starts
    assert "cora" in proc.stderr and "citeseer" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # nothing was written


def _torchrun(out: Path, parts: Path, nproc: int, *flags: str) -> list[str]:
    train_args = [*CONFIG[:2], "--epochs", "100000", "--out", str(out)]
    for item in (f"partition.dir={parts}", "metrics.progress=false", "checkpoint.every=0"):
        train_args += ["--set", item]
    return torchrun_command(nproc, [*train_args, *flags])


def _start_and_hit(tmp_path: Path, nproc: int, sig: int, *flags: str):
    """Starts a long run, waits until it trains, sends ``sig`` to rank ``nproc - 1``;
    returns (exit code, output, seconds from the signal to the end)."""
    out, parts = tmp_path / "run", tmp_path / "parts"
    env = dict(ENV, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5")
    proc = subprocess.Popen(
        _torchrun(out, parts, nproc, *flags),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    victim = None
    try:
        deadline = time.monotonic() + 240
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "the run never started training"
            time.sleep(0.2)
        victim = worker_pid(out, nproc - 1)
        assert victim is not None
        os.kill(victim, sig)
        hit = time.monotonic()
        output, _ = proc.communicate(timeout=180)
        return proc.returncode, output.decode(errors="replace"), time.monotonic() - hit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if victim is not None and sig == signal.SIGSTOP:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)


@pytest.mark.distributed
@pytest.mark.slow
def test_lost_worker_without_restarts_ends_the_run_in_seconds(tmp_path):
    code, output, seconds = _start_and_hit(tmp_path, 3, signal.SIGKILL)
    assert code != 0
    assert seconds < 60, f"took {seconds:.0f}s to end after a worker was lost"
    assert "exitcode  : -9" in output and "rank      : 2" in output, output[-3000:]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] != "complete"


@pytest.mark.distributed
@pytest.mark.slow
def test_stopped_worker_ends_the_run_after_the_timeout_naming_it(tmp_path):
    # 20 s: the stall warning (after 3 s, or ten times the longest epoch) must come first,
    # also where a busy machine makes the first epoch take a second or more.
    timeout_s = 20
    code, output, seconds = _start_and_hit(
        tmp_path,
        3,
        signal.SIGSTOP,
        *("--set", f"comm.timeout_s={timeout_s}", "--set", "comm.stall_warn_s=3"),
    )
    assert code != 0
    # The timeout, the peers' grace to report (5 s) and torchrun's shutdown (5 s), with
    # room for a busy machine.
    assert seconds < timeout_s + 60, f"took {seconds:.0f}s to end after a worker stopped"
    assert "rank(s) 2 did not report the failure" in output, output[-4000:]
    # Before the timeout, the waiting ranks warned that their epoch stalled.
    assert re.search(r"rank [01]: epoch \d+ has run \d+ s", output), output[-4000:]
    # A gradient all-reduce that timed out numbers its step by the epoch the error names.
    for epoch, step in re.findall(r"failed at epoch (\d+): .* at step (\d+)", output):
        assert epoch == step, output[-4000:]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_run_killed_for_memory_ends_failed_saying_so(tmp_path):
    """Rank 0 killed with SIGKILL (as the kernel's out-of-memory killer kills) cannot
    record its end: the launcher does, instead of leaving status.json "running"."""
    out, parts = tmp_path / "run", tmp_path / "parts"
    cmd = [sys.executable, "-m", "adaqp.launcher", *CONFIG[:2], "--epochs", "100000"]
    cmd += ["--out", str(out)]
    for item in (f"partition.dir={parts}", "metrics.progress=false", "checkpoint.every=0"):
        cmd += ["--set", item]
    env = {k: v for k, v in ENV.items() if k not in ("RESTARTS", "NNODES")}
    env.update(NPROC="2", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5")
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        metrics, deadline = out / "metrics.jsonl", time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never started training"
            time.sleep(0.2)
        victim = worker_pid(out, 0)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, stderr[-3000:]
    assert "rank 0 ended with signal SIGKILL" in stderr, stderr[-3000:]
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed", status
    assert status["error"] == "rank 0 was killed (SIGKILL), likely out of memory"
    assert status["pid"] == victim and status["recorded_by"] == "launcher"


def _citeseer_worker(rank, world_size, init_method, part_dir: str):
    from adaqp.config import load_config
    from adaqp.graph.local import LocalGraph
    from adaqp.partitioning.schema import read_metadata
    from adaqp.partitioning.store import load_part
    from adaqp.run.trainer import Trainer
    from adaqp.runtime import init_distributed, shutdown

    config = load_config(
        str(ROOT / "configs/citeseer-gcn.toml"),
        ["data.split_seed=6", "train.epochs=3", f"partition.dir={part_dir}", "comm.timeout_s=60"],
    )
    world = init_distributed(config.comm, init_method, rank, world_size)
    try:
        meta = read_metadata(part_dir)
        graph = LocalGraph.from_part(load_part(part_dir, rank, meta))
        summary = Trainer(config, graph, meta, world).fit(NullWriter())
        return {"num_halo": np.array(graph.num_halo), "loss": np.array(summary.final_train_loss)}
    finally:
        shutdown()


@pytest.mark.distributed
def test_shipped_citeseer_config_with_a_halo_free_part_trains(tmp_path):
    """configs/citeseer-gcn.toml, split seed 6, 4 workers: METIS leaves one part without
    halo nodes; that rank used to skip the exchange while its peers waited for it."""
    from adaqp.config import load_config
    from tests.distributed import run_workers

    config = load_config(str(ROOT / "configs/citeseer-gcn.toml"), ["data.split_seed=6"])
    parts = tmp_path / "parts"
    make_partition(
        load_dataset("citeseer", split_seed=6), parts, num_parts=4, spec=config.data.spec()
    )
    results = run_workers(_citeseer_worker, 4, tmp_path, str(parts), timeout=240)
    assert min(int(r["num_halo"]) for r in results) == 0, "no halo-free part: case not reproduced"
    assert all(np.isfinite(float(r["loss"])) for r in results)
