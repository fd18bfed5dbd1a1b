"""Checkpoints: every rank's training state, written atomically and verified on load.

Layout (``<out>/checkpoints``, or ``<checkpoint.dir>/<out's name>``: the run's
``Placement.checkpoints``)::

    checkpoints/
        epoch-000010/
            rank-00000.npz   tensors of rank 0: model, optimizer, policy state
            rank-00001.npz   ... one shard per rank (numpy without pickle)
            manifest.json    written last, by rank 0, once every shard is on disk:
                             format, epoch, world size, config and partition fingerprints,
                             SHA-256 of every shard, and the run's history so far (JSON)
        epoch-000020/ ...

Every file is written to a temporary name, flushed to disk (fsync) and renamed, and the
directory is synced after the rename: a crash mid-write leaves the previous checkpoint
intact and the new one without a manifest, which never counts. Loading verifies the
manifest, the fingerprints (naming what differs) and each shard's SHA-256. After a new
checkpoint is complete the oldest are removed, keeping the newest ``checkpoint.keep``.

No generator state is saved: every random draw of training (dropout, attention dropout,
stochastic rounding) is keyed by the seed, the epoch, the layer and global ids
(``adaqp/quant/draws.py``), so a resumed run draws what the uninterrupted one would have.

The config fingerprint holds every setting that changes the numerics
(:mod:`adaqp.config.resume`); a resume may change only ``RESUMABLE``'s keys, and any
other difference is refused in one line naming the key. Earlier versions are refused
(``REFUSED_VERSIONS`` says why each).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaqp.config import RENAMED_KEYS, RESUMABLE
from adaqp.partitioning.store import sha256_file
from adaqp.process.atomic import write_atomic
from adaqp.quant import kernels as quant_kernels
from adaqp.run.ckptdir import MANIFEST, complete_epochs
from adaqp.run.ckptdir import epoch_of as _epoch_of
from adaqp.run.ckptdir import step_dir as _step_dir

logger = logging.getLogger(__name__)

FORMAT = "adaqp-checkpoint"
VERSION = 3
REFUSED_VERSIONS: dict[int, str] = {
    1: "it saved the generators' states; now every draw is keyed",
    2: "its fingerprint left out settings that change the numerics, such as "
    "train.lr_warmup_epochs and train.compute_rows, so a changed recipe cannot be told",
}
"""Earlier formats, each with why this AdaQP cannot resume it."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, damaged, or does not fit this run."""


def _shard_name(rank: int) -> str:
    return f"rank-{rank:05d}.npz"


def _to_numpy(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    arrays = {}
    for name, tensor in tensors.items():
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
            raise CheckpointError(f"{name}: bfloat16 tensors are not supported")
        arrays[name] = tensor.detach().cpu().numpy()
    return arrays


def write_shard(root: Path, epoch: int, rank: int, tensors: dict[str, torch.Tensor]) -> str:
    """Writes this rank's shard of the checkpoint at ``epoch``; returns its SHA-256."""
    step = _step_dir(root, epoch)
    step.mkdir(parents=True, exist_ok=True)
    path = step / _shard_name(rank)
    arrays = _to_numpy(tensors)
    write_atomic(path, lambda f: np.savez(f, **arrays))
    return sha256_file(path)


def write_manifest(
    root: Path,
    epoch: int,
    shard_sha256: list[str],
    fingerprint: dict[str, Any],
    history: dict[str, Any],
    keep: int,
) -> Path:
    """Rank 0, after every shard is written: completes the checkpoint, prunes old ones."""
    step = _step_dir(root, epoch)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "epoch": epoch,
        "world_size": len(shard_sha256),
        "fingerprint": fingerprint,
        "shards": {_shard_name(r): sha for r, sha in enumerate(shard_sha256)},
        "history": history,
    }
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    write_atomic(step / MANIFEST, lambda f: f.write(text))
    _prune(root, keep)
    return step


def _prune(root: Path, keep: int) -> None:
    complete = complete_epochs(root)
    for epoch in complete[:-keep] if keep > 0 else []:
        _remove_step(_step_dir(root, epoch))
    # Steps older than the newest complete one that never got a manifest are debris of
    # an interrupted write; newer ones may still be in progress elsewhere.
    newest = complete[-1] if complete else None
    for path in root.glob("epoch-*"):
        epoch = _epoch_of(path)
        stale = epoch is not None and newest is not None and epoch < newest
        if stale and not (path / MANIFEST).exists():
            _remove_step(path)


def _remove_step(path: Path) -> None:
    """Removes a checkpoint step: only the files this module writes, then the folder."""
    for child in path.iterdir():
        name = child.name
        ours = name == MANIFEST or name.startswith("rank-") and name.endswith(".npz")
        if ours or name.startswith(".") and ".tmp-" in name:  # incl. interrupted writes
            child.unlink(missing_ok=True)
    try:
        path.rmdir()
    except OSError:
        logger.warning("left %s in place: it holds files that are not a checkpoint's", path)


def read_manifest(root: Path, epoch: int) -> dict[str, Any]:
    path = _step_dir(root, epoch) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint manifest {path}: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an AdaQP checkpoint manifest")
    version = manifest.get("version")
    if version != VERSION:
        why = REFUSED_VERSIONS.get(version, "an unknown format")
        raise CheckpointError(
            f"{path} is a version-{version} checkpoint; this AdaQP reads version {VERSION} "
            f"({why}): start a new --out, or --overwrite"
        )
    return manifest


def check_fits(
    manifest: dict[str, Any], world_size: int, fingerprint: dict[str, Any], where: Path
) -> None:
    """Refuses a checkpoint that does not fit this run, in one line naming the first key
    that differs (the config's order: a changed mode before the settings only it reads)
    with both values, then how many more differ."""
    if manifest["world_size"] != world_size:
        written = manifest["world_size"]
        raise CheckpointError(
            f"checkpoint {where} was written by {written} worker{'s' * (written != 1)}, this "
            f"run has {world_size}; resume with the same number of workers"
        )
    # A key only the checkpoint has is a setting this run does not read (its mode ignores
    # it, Config.fingerprint): it cannot change the trajectory, so it is not compared. A
    # key written under its old name is compared under its new one.
    saved = {RENAMED_KEYS.get(k, k): v for k, v in manifest["fingerprint"].items()}
    changed = [k for k, v in fingerprint.items() if k in saved and saved[k] != v]
    missing = [k for k in fingerprint if k not in saved]
    differ = changed + missing
    if not differ:
        return
    key = differ[0]
    if key in saved:
        what = f"{key} was {saved[key]!r}, now {fingerprint[key]!r}"
    else:
        what = (
            f"{key} is not in the checkpoint (written before the setting existed), now "
            f"{fingerprint[key]!r}"
        )
    if more := differ[1:]:
        named = ", ".join(more[:3]) + (", ..." if len(more) > 3 else "")
        what += f", and {len(more)} more setting{'s' * (len(more) != 1)} differ ({named})"
    raise CheckpointError(
        f"cannot resume from {where}: {what}; a resume may change only "
        f"{', '.join(RESUMABLE)} (docs/checkpoints-and-faults.md): for any other change, "
        "start a new --out, or --overwrite"
    )


def read_shard(root: Path, epoch: int, rank: int, manifest: dict[str, Any]) -> dict:
    """This rank's tensors of the checkpoint at ``epoch``, verified against the manifest."""
    path = _step_dir(root, epoch) / _shard_name(rank)
    expected = manifest["shards"].get(_shard_name(rank))
    if not path.is_file():
        raise CheckpointError(f"checkpoint shard {path} is missing")
    if sha256_file(path) != expected:
        raise CheckpointError(f"checkpoint shard {path} does not match its SHA-256: damaged")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: torch.from_numpy(data[name].copy()) for name in data.files}
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint shard {path}: {exc}") from exc


def remove_all(root: Path) -> None:
    """Removes every checkpoint under ``root`` (files this module wrote only)."""
    if not root.is_dir():
        return
    for path in root.glob("epoch-*"):
        if _epoch_of(path) is not None and path.is_dir():
            _remove_step(path)
    with contextlib.suppress(OSError):  # it may hold the user's own files
        root.rmdir()


class Checkpointer:
    """Saves and restores one run's checkpoints on every rank (collective calls).

    Args:
        root: the checkpoint directory.
        world: rank and world size.
        every: save every this many epochs (0: never), and after the last epoch.
        keep: complete checkpoints kept.
        fingerprint: what a checkpoint must agree on to be resumed (see
            ``Config.fingerprint``), plus the partition's identity.
    """

    def __init__(self, root: Path, world, every: int, keep: int, fingerprint: dict[str, Any]):
        self.root = Path(root)
        self.world = world
        self.every = every
        self.keep = keep
        self.fingerprint = fingerprint

    @classmethod
    def for_run(cls, config, world, root: Path, meta: dict[str, Any]) -> Checkpointer:
        """The checkpoints of a run in ``root`` (where its ``Placement`` keeps them),
        matched against the config's fingerprint, the partition's metadata checksum and the
        compiled quantizer's draws."""
        section = config.checkpoint
        fingerprint = {
            **config.fingerprint(),
            "partition.metadata_sha256": meta.get("metadata_sha256", ""),
            "quant.compiled_draws": quant_kernels.COMPILED_DRAWS,
        }
        return cls(root, world, section.every, section.keep, fingerprint)

    def due(self, epoch: int, last_epoch: int) -> bool:
        return bool(self.every) and (epoch % self.every == 0 or epoch == last_epoch)

    def save(self, epoch: int, tensors: dict[str, torch.Tensor], history: dict[str, Any]) -> None:
        """Every rank writes its shard; rank 0 completes the checkpoint once all are on disk."""
        import torch.distributed as dist

        error = None
        try:
            sha = write_shard(self.root, epoch, self.world.rank, tensors)
        except OSError as exc:
            error, sha = exc, "0" * 64
        device = self.world.device  # NCCL takes no CPU tensors
        digest = torch.tensor(list(bytes.fromhex(sha)), dtype=torch.uint8, device=device)
        gathered = [torch.zeros_like(digest) for _ in range(self.world.world_size)]
        failed = torch.tensor([float(error is not None)], device=device)
        dist.all_reduce(failed)
        if failed.item():
            # Every rank is done writing: the incomplete step goes, so that a full disk
            # gets back what this attempt took (it could never be resumed from).
            if self.world.is_main:
                with contextlib.suppress(OSError):
                    _remove_step(_step_dir(self.root, epoch))
            raise CheckpointError(
                f"rank {self.world.rank}: checkpoint at epoch {epoch} could not be written "
                f"to {self.root}" + (f": {error}" if error else " (a peer failed; see its log)")
            )
        dist.all_gather(gathered, digest)
        if self.world.is_main:
            shards = [bytes(g.tolist()).hex() for g in gathered]
            write_manifest(self.root, epoch, shards, self.fingerprint, history, self.keep)
            logger.debug("checkpoint at epoch %d written to %s", epoch, _step_dir(self.root, epoch))
        dist.barrier()  # the checkpoint is complete for everyone before training goes on

    def load_latest(self) -> tuple[int, dict[str, torch.Tensor], dict[str, Any]]:
        """The newest complete checkpoint that fits: (epoch, this rank's tensors, history).

        Every rank checks; if any rank finds a problem, all raise together.
        """
        import torch.distributed as dist

        epochs = complete_epochs(self.root)
        # Rank 0 picks the checkpoint, so that every rank resumes from the same epoch.
        choice = torch.tensor(
            [epochs[-1] if epochs else -1], dtype=torch.int64, device=self.world.device
        )
        dist.broadcast(choice, src=0)
        epoch = int(choice.item())
        error: Exception | None = None
        result = None
        try:
            if epoch < 0:
                raise CheckpointError(f"no complete checkpoint in {self.root} to resume from")
            manifest = read_manifest(self.root, epoch)
            where = _step_dir(self.root, epoch)
            check_fits(manifest, self.world.world_size, self.fingerprint, where)
            tensors = read_shard(self.root, epoch, self.world.rank, manifest)
            result = (epoch, tensors, manifest["history"])
        except CheckpointError as exc:
            error = exc
        failed = torch.tensor([float(error is not None)], device=self.world.device)
        dist.all_reduce(failed)
        if error is not None:
            raise error
        if failed.item():
            raise CheckpointError(
                f"rank {self.world.rank}: a peer could not load the checkpoint at epoch {epoch} "
                f"from {self.root}; see its log"
            )
        return result
