"""What a run checks before any worker starts or anything on disk changes; no torch.

``check`` refuses, with ``Refusal``, whatever would stop the run before it trains: an
output directory that holds a run the flags do not allow replacing or continuing (the
run's ``Placement`` decides, and says which directory the run will most likely take), a
partition directory that holds another partition or other files. The launcher asks it
once (``adaqp.train --check``) before torchrun starts; every rank asks it again before
the process group forms, so that a plain torchrun job refuses just as early. Both are
usage or config errors (exit code 2).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from adaqp.config import Config
from adaqp.data.load import check_source
from adaqp.partitioning.schema import METADATA_FILE, PartitionError, check_matches, read_metadata
from adaqp.partitioning.store import check_target
from adaqp.run.placement import Placement
from adaqp.run.runfiles import RunDirError


class Refusal(Exception):
    """The run cannot start as asked; the message says why and what to do."""


def partition_dir(config: Config, world_size: int) -> Path:
    """``partition.dir``, or ``partitions/<dataset>-<spec hash>-<method>-p<P>``."""
    if config.partition.dir:
        return Path(config.partition.dir)
    spec = json.dumps(config.data.spec(), sort_keys=True).encode()
    tag = hashlib.blake2b(spec, digest_size=4).hexdigest()
    name = f"{config.data.dataset}-{tag}-{config.partition.method}-p{world_size}"
    return Path("partitions") / name


def check(config: Config, world_size: int, placement: Placement) -> Path:
    """The output directory this run will most likely take (``placement.plan``), and a
    partition directory that fits; raises ``Refusal``. Changes nothing."""
    try:
        out = placement.plan()
    except RunDirError as exc:
        raise Refusal(str(exc)) from None
    check_partition(config, world_size)
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
