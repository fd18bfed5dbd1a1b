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
from adaqp.partitioning.format import (
    METADATA_FILE,
    PartitionError,
    check_matches,
    check_target,
    read_metadata,
)
from adaqp.run.ckptdir import checkpoint_root
from adaqp.run.rundir import (
    SUMMARY_FILE,
    Problem,
    RunDirError,
    check_writable,
    free_versions,
    lock_held,
    newest_version,
    refuse_unfinished,
    require_checkpoint,
)


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
    output directory, ``resume`` and ``overwrite`` act on the newest version, as does a
    restarted worker group (``restarted``: its first attempt's run, which it continues
    unrefused)."""
    base = output_dir(config, world_size, name)
    named = bool(config.metrics.out)
    if restarted and not (resume or overwrite):
        out = base if named else newest_version(base)
        try:
            check_writable(out)
        except RunDirError as exc:
            raise Refusal(str(exc)) from None
        return out
    if not named and (resume or overwrite):
        out = newest_version(base)
    elif not named:
        out = next(free_versions(base))
    else:
        out = base
    checkpoints = checkpoint_root(config, out)
    try:
        check_writable(out)
        if lock_held(out):
            raise RunDirError(Problem.RUNNING, Problem.RUNNING.describe(out))
        if resume:
            require_checkpoint(out, checkpoints)
        elif not overwrite:
            if (out / SUMMARY_FILE).exists():
                raise RunDirError(Problem.FINISHED, Problem.FINISHED.describe(out))
            refuse_unfinished(out, checkpoints)
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
            if data.dataset == "npz" and not Path(data.path).is_file():
                raise Refusal(f"data.path: {data.path} is not a file (the npz dataset to load)")
    except PartitionError as exc:
        raise Refusal(str(exc)) from None
