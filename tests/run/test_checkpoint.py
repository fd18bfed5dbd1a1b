"""Checkpoints: a resumed run is the uninterrupted run, damaged or unfitting checkpoints
are refused, and an interrupted write leaves the previous checkpoint usable."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from adaqp.assign import LinkModel
from adaqp.bench import torchrun_command
from adaqp.config import load_config
from adaqp.data import load_dataset
from adaqp.graph.local import LocalGraph
from adaqp.partitioning.build import make_partition
from adaqp.partitioning.schema import read_metadata
from adaqp.partitioning.store import load_part
from adaqp.quant import kernels as quant_kernels
from adaqp.run.checkpoint import (
    Checkpointer,
    CheckpointError,
    check_fits,
    complete_epochs,
    read_manifest,
    read_shard,
    write_manifest,
    write_shard,
)
from adaqp.run.placement import Placement
from adaqp.run.trainer import Trainer
from adaqp.runtime import init_distributed, shutdown
from tests.distributed import QUANTIZED, RecordingWriter, run_workers, worker_pid


def _pin_timings() -> None:
    """This worker's planner gets fixed link and (de)quantization figures instead of timing
    them: two runs compared bit for bit must not part at a width chosen from a busy moment."""
    import adaqp.exchange.planner as planner

    def links(world, *args, **kwargs):
        p = world.world_size
        return LinkModel(np.full((p, p), 20e-6), np.full((p, p), 1e9))

    def quantization(widths, *args, **kwargs):
        return dict.fromkeys(widths, 1e-9), dict.fromkeys(widths, 1e-9), None

    planner.profile_links = links
    planner.time_quantization = quantization
    planner.profile_fabric = lambda *args, **kwargs: math.inf


def _worker(rank, world_size, init_method, part_dir, ckpt_dir, overrides, stop_at, total):
    """Trains to ``stop_at`` (checkpointing there), then a fresh trainer resumes to
    ``total``; with ``stop_at == 0`` trains to ``total`` in one go. Timings that steer the
    planner are pinned and its solver is the greedy (no time limit): runs repeat bitwise."""
    _pin_timings()
    base = [
        "data.dataset=cora",
        "model.hidden=16",
        "model.dropout=0.5",
        "quant.solver=greedy",
        f"partition.dir={part_dir}",
        f"checkpoint.dir={ckpt_dir}",
        *overrides,
    ]
    result = {}
    for stage, epochs in enumerate([stop_at, total] if stop_at else [total]):
        config = load_config(None, [*base, f"train.epochs={epochs}"])
        world = init_distributed(config.comm, f"{init_method}-{stage}", rank, world_size)
        try:
            meta = read_metadata(part_dir)
            graph = LocalGraph.from_part(load_part(part_dir, rank, meta))
            trainer = Trainer(config, graph, meta, world)
            # checkpoint.dir keeps each run's checkpoints under the run's folder name.
            root = Placement.of(config, world_size).checkpoints(Path("run"))
            ckpt = Checkpointer.for_run(config, world, root, meta)
            history = None
            if stage == 1:
                epoch, tensors, history = ckpt.load_latest()
                trainer.load_state_dict(tensors)
                result["resumed_at"] = np.array(epoch)
            records = RecordingWriter()
            summary = trainer.fit(records, checkpoints=ckpt, resume=history)
            result["loss"] = np.array(summary.final_train_loss)
            result["epochs_run"] = np.array([r.epoch for r in records.records])
            result["weights"] = (
                torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
                .numpy()
                .copy()
            )
            result["avg_bits"] = np.array(summary.avg_bits)
        finally:
            shutdown()
    return result


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    part_dir = tmp_path_factory.mktemp("cora") / "parts"
    make_partition(load_dataset("cora"), part_dir, num_parts=2, spec={"name": "cora"})
    return str(part_dir)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "overrides",
    [
        ("comm.mode=vanilla", "checkpoint.every=5"),
        (
            "comm.mode=adaqp",
            *QUANTIZED,
            "quant.assign_cycle=3",
            "checkpoint.every=4",
        ),
        (
            "comm.mode=adaqp",
            *QUANTIZED,
            "quant.assign_cycle=3",
            "checkpoint.every=4",
            "model.name=gat",
            "model.attn_dropout=0.5",
        ),
        (
            "comm.mode=onebit",
            "staleness.landing=fixed",
            "staleness.smoothing=0.9",
            "checkpoint.every=4",
        ),
        (
            # Stale from epoch 2 on (no wait needed): a resume that forgot the choice
            # would train fresh. The checkpoint at 8 is mid-cycle.
            "comm.mode=adaqp-s",
            "quant.assign_cycle=3",
            "staleness.choose_every=6",
            "staleness.min_hidden_fraction=0",
            "staleness.max_drift=1e9",
            "staleness.landing=fixed",
            "staleness.smoothing=0.9",
            "checkpoint.every=4",
        ),
    ],
    ids=["vanilla", "adaqp", "adaqp-gat", "onebit-smoothed", "adaqp-s"],
)
def test_resume_equals_uninterrupted(overrides, parts, tmp_path):
    """Stopped after a checkpoint and resumed to 10 epochs: bitwise the same weights and
    final loss as one 10-epoch run (Adam state, bit-width plans and traces, stale buffers
    and their moving averages, adaqp-s's choice and its cycle's row sums all restored; the
    masks of dropout and GAT's attention dropout and the stochastic rounding drawn again
    from their keys, with no generator state saved)."""
    stop = 5 if "vanilla" in overrides[0] else 8
    whole = run_workers(_worker, 2, tmp_path, parts, str(tmp_path / "a"), overrides, 0, 10)
    split = run_workers(_worker, 2, tmp_path, parts, str(tmp_path / "b"), overrides, stop, 10)
    for w, s in zip(whole, split, strict=True):
        assert int(s["resumed_at"]) == stop
        assert s["epochs_run"].tolist() == list(range(stop + 1, 11))
        np.testing.assert_array_equal(s["weights"], w["weights"])
        assert float(s["loss"]) == float(w["loss"])
    if "adaqp" in overrides[0]:  # the plans were solved (not the first cycle's 8 bits)
        assert float(whole[0]["avg_bits"]) < 8
    # Only the newest checkpoints are kept.
    assert complete_epochs(tmp_path / "a" / "run") == ([8, 10] if stop == 8 else [5, 10])


def _changed_resume_worker(rank, world_size, init_method, part_dir, ckpt_dir, changes):
    """Trains a onebit run for 4 epochs (a checkpoint at 4), then asks to resume it under
    each of ``changes`` in turn; returns what each resume said, in ``said<i>``."""
    base = [
        "data.dataset=cora",
        "model.hidden=16",
        "comm.mode=onebit",
        "staleness.landing=fixed",
        "train.epochs=4",
        "checkpoint.every=4",
        f"partition.dir={part_dir}",
        f"checkpoint.dir={ckpt_dir}",
    ]
    result = {}
    for stage, change in enumerate([None, *changes]):
        config = load_config(None, [*base, *([change] if change else [])])
        world = init_distributed(config.comm, f"{init_method}-{stage}", rank, world_size)
        try:
            meta = read_metadata(part_dir)
            root = Placement.of(config, world_size).checkpoints(Path("run"))
            ckpt = Checkpointer.for_run(config, world, root, meta)
            if change is None:
                graph = LocalGraph.from_part(load_part(part_dir, rank, meta))
                Trainer(config, graph, meta, world).fit(RecordingWriter(), checkpoints=ckpt)
                continue
            try:
                said = f"loaded epoch {ckpt.load_latest()[0]}"
            except CheckpointError as exc:
                said = str(exc)
            result[f"said{stage - 1}"] = np.array(said)
        finally:
            shutdown()
    return result


@pytest.mark.distributed
def test_a_resume_under_a_changed_recipe_is_refused_naming_the_key(parts, tmp_path):
    """Issue 59: a onebit checkpoint resumed with every row computed failed at the next
    epoch (its stale buffers hold the loss's rows), and another learning-rate warm-up
    changed the trajectory unseen. Both are refused on every rank in one line naming the
    key; a change a resume may make (the evaluation's cadence) loads."""
    changes = ("train.compute_rows=all", "train.lr_warmup_epochs=3", "train.eval_every=2")
    ckpt_dir = str(tmp_path / "ckpt")
    results = run_workers(_changed_resume_worker, 2, tmp_path, parts, ckpt_dir, changes)
    for result in results:
        rows, warmup, cadence = (str(result[f"said{i}"]) for i in range(3))
        assert rows.startswith("cannot resume from ") and "\n" not in rows, rows
        assert "epoch-000004: train.compute_rows was 'loss', now 'all';" in rows, rows
        assert "epoch-000004: train.lr_warmup_epochs was 0, now 3;" in warmup, warmup
        assert cadence == "loaded epoch 4"


def test_unfitting_or_damaged_checkpoints_are_refused(tmp_path):
    tensors = {"model/w": torch.arange(6.0).view(2, 3), "rng/torch": torch.get_rng_state()}
    sha = write_shard(tmp_path, 3, 0, tensors)
    fingerprint = {"model.hidden": 16, "data.name": "cora"}
    write_manifest(tmp_path, 3, [sha], fingerprint, {"records": []}, keep=2)
    manifest = read_manifest(tmp_path, 3)
    loaded = read_shard(tmp_path, 3, 0, manifest)
    assert torch.equal(loaded["model/w"], tensors["model/w"])
    check_fits(manifest, 1, fingerprint, tmp_path)

    with pytest.raises(CheckpointError, match="model.hidden was 16, now 32;"):
        check_fits(manifest, 1, {**fingerprint, "model.hidden": 32}, tmp_path)
    with pytest.raises(CheckpointError, match="written by 1 worker, this run has 2"):
        check_fits(manifest, 2, fingerprint, tmp_path)
    newer = {**fingerprint, "quant.first_cycle": 5}  # a setting added after the checkpoint
    with pytest.raises(CheckpointError, match="quant.first_cycle is not in the checkpoint"):
        check_fits(manifest, 1, newer, tmp_path)

    # The compiled quantizer's draws are part of what a run resumes with.
    ckpt = Checkpointer.for_run(load_config(None, []), None, tmp_path, {"metadata_sha256": "x"})
    assert ckpt.fingerprint["quant.compiled_draws"] == quant_kernels.COMPILED_DRAWS
    other = {**ckpt.fingerprint, "quant.compiled_draws": "splitmix64 words"}
    with pytest.raises(CheckpointError, match="quant.compiled_draws was 'splitmix64"):
        check_fits({**manifest, "fingerprint": other}, 1, ckpt.fingerprint, tmp_path)

    # Checkpoints of earlier formats are refused, saying why: version 1 saved generator
    # states, version 2's fingerprint held only part of the recipe.
    path = tmp_path / "epoch-000003" / "manifest.json"
    text = path.read_text()
    for version, why in [(1, "generators' states"), (2, "train.lr_warmup_epochs")]:
        path.write_text(text.replace('"version": 3', f'"version": {version}'))
        expected = f"version-{version} checkpoint; this AdaQP reads version 3 \\(.*{why}"
        with pytest.raises(CheckpointError, match=expected):
            read_manifest(tmp_path, 3)
    path.write_text(text)

    shard = tmp_path / "epoch-000003" / "rank-00000.npz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        read_shard(tmp_path, 3, 0, manifest)
    shard.write_bytes(bytes(data[:100]))
    with pytest.raises(CheckpointError, match="SHA-256"):
        read_shard(tmp_path, 3, 0, manifest)


def test_interrupted_write_keeps_the_previous_checkpoint(tmp_path):
    """Killed between the shards and the manifest: the step without a manifest never
    counts, the previous one is still complete, and the debris goes once a newer
    checkpoint completes."""
    tensors = {"x": torch.ones(3)}
    write_manifest(tmp_path, 2, [write_shard(tmp_path, 2, 0, tensors)], {}, {}, keep=2)
    write_shard(tmp_path, 4, 0, {"x": torch.zeros(3)})  # ... and no manifest: killed here
    assert complete_epochs(tmp_path) == [2]
    manifest = read_manifest(tmp_path, 2)
    assert torch.equal(read_shard(tmp_path, 2, 0, manifest)["x"], tensors["x"])
    for epoch in (6, 8):
        write_manifest(tmp_path, epoch, [write_shard(tmp_path, epoch, 0, tensors)], {}, {}, 2)
    assert complete_epochs(tmp_path) == [6, 8]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-000006", "epoch-000008"]


def _full_disk_worker(rank, world_size, init_method, root: str):
    """Saves epoch 2, then epoch 4 with rank 1's disk full; returns what each rank saw."""
    from adaqp.run import checkpoint

    world = init_distributed(load_config(None, []).comm, init_method, rank, world_size)
    try:
        saver = Checkpointer(Path(root), world, every=2, keep=2, fingerprint={})
        saver.save(2, {"x": torch.ones(4)}, {})
        write = checkpoint.write_shard

        def full(root, epoch, rank, tensors):
            if rank == 1:
                write(root, epoch, rank, tensors)  # the shard lands, then the disk is full
                raise OSError(28, "No space left on device")
            return write(root, epoch, rank, tensors)

        checkpoint.write_shard = full
        try:
            saver.save(4, {"x": torch.zeros(4)}, {})
        except CheckpointError as exc:
            return {"error": np.array(str(exc))}
        return {"error": np.array("")}
    finally:
        shutdown()


@pytest.mark.distributed
def test_a_full_disk_fails_the_checkpoint_on_every_rank_and_frees_its_step(tmp_path):
    root = tmp_path / "checkpoints"
    results = run_workers(_full_disk_worker, 2, tmp_path, str(root))
    errors = [str(r["error"]) for r in results]
    assert "No space left on device" in errors[1], errors
    assert "a peer failed; see its log" in errors[0], errors
    # The incomplete step is gone (space back); the previous checkpoint is whole.
    assert sorted(p.name for p in root.iterdir()) == ["epoch-000002"]
    assert complete_epochs(root) == [2]


def test_pruning_never_removes_foreign_files(tmp_path):
    tensors = {"x": torch.ones(1)}
    for epoch in (1, 2):
        write_manifest(tmp_path, epoch, [write_shard(tmp_path, epoch, 0, tensors)], {}, {}, 5)
    (tmp_path / "epoch-000001" / "notes.txt").write_text("mine")
    write_manifest(tmp_path, 3, [write_shard(tmp_path, 3, 0, tensors)], {}, {}, keep=1)
    assert (tmp_path / "epoch-000001" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "epoch-000001" / "manifest.json").exists()
    assert not (tmp_path / "epoch-000002").exists()
    assert complete_epochs(tmp_path) == [3]


ROOT = Path(__file__).resolve().parents[2]


def _torchrun(out: Path, parts: Path, *flags: str, nproc: int = 2) -> list[str]:
    train_args = ["--config", str(ROOT / "configs/cora-gcn.toml"), "--out", str(out)]
    train_args += ["--set", f"partition.dir={parts}", "--set", "metrics.progress=false"]
    return torchrun_command(nproc, train_args, flags)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


@pytest.mark.distributed
@pytest.mark.slow
def test_killed_worker_is_restarted_and_the_run_resumes(tmp_path):
    """SIGKILL of one worker mid-run under torchrun --max-restarts 1: the group restarts,
    resumes from the last checkpoint and finishes; the summary counts the restart and
    the epochs redone, and metrics.jsonl holds every epoch once."""
    out, parts = tmp_path / "run", tmp_path / "parts"
    epochs = 200  # the kill lands soon after epoch 10, far from the end
    cmd = _torchrun(out, parts, "--max-restarts", "1")
    cmd += ["--epochs", str(epochs), "--set", "checkpoint.every=10"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: complete_epochs(out / "checkpoints"), 240, "a first checkpoint")
        pid = worker_pid(out, 1)
        assert pid is not None, "rank 1's worker not found"
        os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["restarts"] == 1
    assert summary["resumed_from_epoch"] >= 10
    assert summary["epochs"] == epochs
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == list(range(1, epochs + 1))
    assert summary["epochs_redone"] >= 0


@pytest.mark.distributed
def test_resume_from_the_command_line_extends_the_run(tmp_path):
    """Stopped at 6 epochs, --resume --epochs 10 continues: the same final loss as one
    10-epoch run; a changed recipe is refused in one line naming the key."""
    parts = tmp_path / "parts"
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def train(out: Path, *flags: str) -> subprocess.CompletedProcess:
        cmd = [*_torchrun(out, parts), "--set", "checkpoint.every=3", *flags]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    first = train(tmp_path / "a", "--epochs", "6")
    assert first.returncode == 0, first.stderr[-3000:]
    refused = train(tmp_path / "a", "--epochs", "10", "--resume", "--set", "train.compute_rows=all")
    assert refused.returncode != 0
    said = [line for line in refused.stderr.splitlines() if "cannot resume" in line]
    assert said, refused.stderr[-3000:]
    assert all("train.compute_rows was 'loss', now 'all';" in line for line in said), said
    resumed = train(tmp_path / "a", "--epochs", "10", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = train(tmp_path / "b", "--epochs", "10")
    assert whole.returncode == 0, whole.stderr[-3000:]
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert a["final_train_loss"] == b["final_train_loss"]
    assert a["resumed_from_epoch"] == 6 and b["resumed_from_epoch"] == 0


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["vanilla", "adaqp"])
def test_same_seed_gives_the_same_run_twice(mode, parts, tmp_path):
    """Determinism: two runs with one seed and world size end bitwise equal (adaqp's
    widths too: its re-solve at epoch 3 sees the same traces). The reference width is 2
    bits: at GCN's 1 bit the variance budget leaves the solver nothing to mix."""
    overrides = (f"comm.mode={mode}", *QUANTIZED, "quant.assign_cycle=3", "quant.bits=2")
    overrides = (*overrides, "checkpoint.every=0")
    runs = [
        run_workers(_worker, 2, tmp_path, parts, str(tmp_path / f"c{i}"), overrides, 0, 6)
        for i in range(2)
    ]
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a["weights"], b["weights"])
        assert float(a["loss"]) == float(b["loss"])
    if mode == "adaqp":  # the widths were solved and quantized
        assert 1 < float(runs[0][0]["avg_bits"]) < 8
