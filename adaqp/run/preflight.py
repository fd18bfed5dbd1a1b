"""What a run checks before any worker starts or anything on disk changes; no torch.

``check`` decides the run's output directory and refuses, with ``Refusal``, whatever
would stop the run before it trains: an output directory that holds a run the flags do
not allow replacing or continuing, a partition directory that holds another partition
or other files. The launcher asks it once (``adaqp.train --check``) before torchrun
starts; every rank asks it again before the process group forms, so that a plain torchrun
job refuses just as early. Both are usage or config errors (exit code 2).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from adaqp.config import Config
from adaqp.data.load import check_source
from adaqp.partitioning.format import (
    METADATA_FILE,
    PartitionError,
    check_matches,
    check_target,
    read_metadata,
)
from adaqp.run.ckptdir import run_checkpoints
from adaqp.run.placement import RunDirError, candidates, verdict


class Refusal(Exception):
    """The run cannot start as asked; the message says why and what to do."""


def output_dir(config: Config, world_size: int, name: str | None = None) -> Path:
    """``metrics.out``, or ``results/runs/<name>-<mode>-p<P>``: ``name`` is the config
    file's stem (``<dataset>-<model>`` without one), so two configs never share a folder.
    Later runs of the same command take ``-v2``, ``-v3``, ... (``adaqp.run.rundir``)."""
    if config.metrics.out:
        return Path(config.metrics.out)
    stem = name or f"{config.data.dataset}-{config.model.name}"
    return Path("results") / "runs" / f"{stem}-{config.comm.mode}-p{world_size}"


def partition_dir(config: Config, world_size: int) -> Path:
    """``partition.dir``, or ``partitions/<dataset>-<spec hash>-<method>-p<P>``."""
    if config.partition.dir:
        return Path(config.partition.dir)
    spec = json.dumps(config.data.spec(), sort_keys=True).encode()
    tag = hashlib.blake2b(spec, digest_size=4).hexdigest()
    name = f"{config.data.dataset}-{tag}-{config.partition.method}-p{world_size}"
    return Path("partitions") / name


def check(config: Config, world_size: int, name: str | None = None, **flags) -> Path:
    """The output directory this run will take (``plan_output``, with its keyword flags),
    and a partition directory that fits; raises ``Refusal``. Changes nothing."""
    out = plan_output(config, world_size, name, **flags)
    check_partition(config, world_size)
    return out


def plan_output(
    config: Config,
    world_size: int,
    name: str | None = None,
    *,
    overwrite: bool = False,
    resume: bool = False,
    restarted: bool = False,
) -> Path:
    """The output directory: ``metrics.out`` as given, checked; without one, the default
    directory, or its first free version (``-v2``, ...) where it holds a run. Given no
    output directory, ``resume`` and ``overwrite`` act on the newest version. The
    verdict is ``adaqp.run.placement``'s, the one rank 0's claim reaches under the lock.

    A restarted worker group (``restarted``) continues the directory its job's first
    attempt started, which only the job's identity tells (it lives in the rendezvous
    store, known once torch is up): the claim decides it, and this returns the default.
    """
    base = output_dir(config, world_size, name)
    if restarted:
        return base
    checkpoint_dir = config.checkpoint.dir or None
    options = dict(overwrite=overwrite, resume=resume)
    out, _ = next(
        candidates(base, named=bool(config.metrics.out), checkpoint_dir=checkpoint_dir, **options)
    )
    try:
        verdict(out, run_checkpoints(out, checkpoint_dir), **options)
    except RunDirError as exc:
        raise Refusal(str(exc)) from None
    return out


def check_partition(config: Config, world_size: int) -> None:
    """An existing partition directory must hold this run's partition (same graph,
    parameters and number of parts); a missing one must be makeable where it goes."""
    part_dir = partition_dir(config, world_size)
    try:
        if (part_dir / METADATA_FILE).is_file():
            check_matches(
                read_metadata(part_dir),
                part_dir,
                spec=config.data.spec(),
                num_parts=world_size,
                method=config.partition.method,
                seed=config.partition.seed,
                balance_train=config.partition.balance_train,
                objective=config.partition.objective,
            )
        else:
            check_target(part_dir)  # other files there, or not writable
            data = config.data
            check_source(data.dataset, root=data.root, path=data.path or None)
    except (PartitionError, ValueError, FileNotFoundError) as exc:
        raise Refusal(str(exc)) from None
