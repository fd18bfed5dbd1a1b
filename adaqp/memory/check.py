"""The refusal of a run whose predicted memory exceeds a host's, before anything starts.

The launcher (``launch/train.sh``, ``adaqp-train``) asks it for the host it runs on,
against the host's cgroup limit or memory; the emulated cluster (``python -m
adaqp.cluster``) for each emulated host, against ``--memory-per-host``. A host's need is
the sum of the predicted peaks of the workers it runs (``adaqp.memory.estimate``), refused
above ``USABLE_FRACTION`` of its memory (``adaqp.memory.limits``: the rest is headroom for
what the prediction does not count). Both take ``--no-memory-check`` to run anyway. Where
the prediction cannot be made (a config the workers will refuse with their own message, a
dataset whose sizes are unknown until it is loaded) there is no refusal: the run goes on
and the workers judge.
"""

from __future__ import annotations

import logging

from adaqp.memory.limits import HostLimit, over_limit, train_overrides

logger = logging.getLogger(__name__)


def refusal(
    config_path: str,
    train_args: list[str],
    world_size: int,
    hosts: list[tuple[range, HostLimit]],
) -> str | None:
    """One line refusing the run if a host's predicted need exceeds the share of its limit
    a run may take (:meth:`HostLimit.refuses`), else None.

    Args:
        config_path: the run's config file.
        train_args: the flags passed to every worker (``--mode``, ``--set`` are read).
        world_size: workers on all hosts.
        hosts: each host to check: the ranks it runs, and its memory.
    """
    from adaqp.config import ConfigError, load_config
    from adaqp.memory.estimate import predict
    from adaqp.partitioning.schema import PartitionError

    try:
        config = load_config(config_path, train_overrides(train_args))
        per_host = max(len(ranks) for ranks, _ in hosts)
        prediction = predict(config, world_size, config_path=config_path, workers_per_host=per_host)
    except (ConfigError, PartitionError, ValueError, OSError) as exc:
        logger.info("no memory estimate before launch: %s", exc)
        return None
    needs = [
        (prediction.host_bytes(ranks), index, ranks, limit)
        for index, (ranks, limit) in enumerate(hosts)
    ]
    over = [n for n in needs if n[3].refuses(n[0])]
    if not over:
        return None
    need, index, ranks, limit = max(over, key=lambda n: n[0] - n[3].usable_bytes)  # furthest over
    largest = max(prediction.workers[r].peak_memory_bytes for r in ranks)
    host = f"host {index}" if len(hosts) > 1 else "this host"
    return over_limit(host, need, largest, len(ranks), limit, config_path, world_size)
