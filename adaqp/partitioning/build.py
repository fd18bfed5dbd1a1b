"""Makes a partition: loads the graph, cuts it, builds and writes its parts.

The stages: the dataset is loaded (or generated) and, for ``python -m partition``, taken
over lean (``adaqp.partitioning.source``: int32 ids, features spilled to disk); the cut
(``adaqp.partitioning.cut``) assigns nodes to parts; the halos of every part are found;
then each part is built (``adaqp.partitioning.parts``) and written before the next, so one
part is resident at a time. Each stage's time and peak resident memory are logged and
recorded in the metadata (``stages``; docs/partitions.md gives them at products scale).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from adaqp.config import DataConfig, PartitionConfig
from adaqp.data import GraphData
from adaqp.partitioning import schema, scratch, store
from adaqp.partitioning.cut import assign_parts
from adaqp.partitioning.parts import PartBuilder, part_stats, total_stats
from adaqp.partitioning.source import GraphSource
from adaqp.process.stages import StageLog
from adaqp.process.stop import stopping_on_signals

logger = logging.getLogger(__name__)


def build_parts(graph: GraphData, parts: np.ndarray) -> tuple[list[dict[str, np.ndarray]], int]:
    """Splits ``graph`` by ``parts`` (int64 [N]) into per-part arrays, all at once.

    Returns:
        (list of per-part array dicts in the partition format, edge cut).
    """
    arrays = list(PartBuilder(GraphSource.of(graph), parts))
    edge_cut = sum(int((a["indices"] >= len(a["global_ids"])).sum()) for a in arrays)
    return arrays, edge_cut


def _balance(values: list[int]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean else 1.0


def partition_stats(arrays: list[dict[str, np.ndarray]], num_edges: int) -> dict[str, Any]:
    """What the halo exchange will cost, per part and in total (``stats`` in the metadata;
    see ``adaqp.partitioning.parts.total_stats``)."""
    num_nodes = sum(len(a["global_ids"]) for a in arrays)
    return total_stats([part_stats(a) for a in arrays], num_nodes, num_edges)


def make_partition(
    graph: GraphData | GraphSource,
    out_dir: str | Path,
    *,
    num_parts: int,
    spec: dict[str, Any],
    method: str = "metis",
    seed: int = 0,
    balance_train: bool = True,
    objective: str = "cut",
    threads: int = 1,
    exclusive: bool = False,
) -> dict[str, Any]:
    """Partitions ``graph`` and writes it to ``out_dir``; returns the metadata written.

    A ``GraphData`` is read as it is; a lean ``GraphSource`` (``GraphSource.take``, as
    ``ensure_partition`` makes) keeps the peak memory down and is closed here. Parts are
    built and written one at a time. The time and peak resident memory of each stage
    (cut, halos, build and write) are logged and recorded in the metadata (``stages``).

    ``threads``: KaMinPar's (see ``assign_parts``); not a parameter of the partition.

    ``exclusive``: never replace a partition that is there at write time (raises
    ``PartitionExists``, see ``write_partition``).

    Raises:
        PartitionError: ``out_dir`` holds files that are not a partition, or cannot be
            written (see ``adaqp.partitioning.store.write_partition``).
    """
    return _make(
        graph,
        Path(out_dir),
        StageLog(),
        num_parts=num_parts,
        spec=spec,
        method=method,
        seed=seed,
        balance_train=balance_train,
        objective=objective,
        threads=threads,
        exclusive=exclusive,
    )


def _make(
    graph: GraphData | GraphSource,
    out_dir: Path,
    log: StageLog,
    *,
    num_parts: int,
    spec: dict[str, Any],
    method: str,
    seed: int,
    balance_train: bool,
    objective: str,
    threads: int,
    exclusive: bool,
) -> dict[str, Any]:
    start = time.perf_counter()
    source = graph if isinstance(graph, GraphSource) else GraphSource.of(graph)
    with source:
        store.check_target(out_dir)
        with log.stage("cut"):
            parts = assign_parts(
                source.indptr,
                source.indices,
                num_parts,
                method=method,
                seed=seed,
                train_mask=source.train_mask if balance_train else None,
                objective=objective,
                threads=threads,
                scratch=source.scratch,
            )
        with log.stage("halos"):
            builder = PartBuilder(source, parts)
        entries: list[dict[str, Any]] = []
        per_part: list[dict[str, Any]] = []

        def built() -> Iterator[dict[str, np.ndarray]]:
            for arrays in builder:
                entries.append(
                    {
                        "num_inner": len(arrays["global_ids"]),
                        "num_halo": len(arrays["halo_global_ids"]),
                        "num_edges": len(arrays["indices"]),
                        "num_train": int(arrays["train_mask"].sum()),
                        "num_send": len(arrays["send_idx"]),
                    }
                )
                per_part.append(part_stats(arrays))
                yield arrays

        def metadata() -> dict[str, Any]:
            log.end()  # every part is written: what is left is this file
            stats = total_stats(per_part, source.num_nodes, source.record["num_edges"])
            return {
                "format": schema.FORMAT,
                "format_version": schema.FORMAT_VERSION,
                "dataset": {"spec": spec, **source.record},
                "params": {
                    "method": method,
                    "num_parts": num_parts,
                    "seed": seed,
                    "balance_train": balance_train,
                    "objective": objective,
                },
                "edge_cut": stats["edge_cut"],
                "balance": {
                    key: _balance([e[key] for e in entries])
                    for key in ("num_inner", "num_edges", "num_train")
                },
                "parts": entries,
                "stats": stats,
                "partition_time_s": time.perf_counter() - start,
                "stages": log.as_json(),
            }

        with log.stage("build and write"):
            meta = store.write_partition(out_dir, metadata, built(), exclusive=exclusive)
    stats = meta["stats"]
    logger.info(
        "partitioned %s into %d parts with %s (%s): edge cut %d of %d (%.1f%%), halo rows "
        "%.3f per node, central %.1f%%, balance nodes %.3f edges %.3f train %.3f, %.1f s",
        spec.get("name"),
        num_parts,
        method,
        objective,
        meta["edge_cut"],
        meta["dataset"]["num_edges"],
        100.0 * stats["edge_cut_fraction"],
        stats["halo_rows_per_node"],
        100.0 * stats["central_fraction"],
        meta["balance"]["num_inner"],
        meta["balance"]["num_edges"],
        meta["balance"]["num_train"],
        meta["partition_time_s"],
    )
    return meta


def ensure_partition(
    data: DataConfig,
    part: PartitionConfig,
    num_parts: int,
    out_dir: str | Path,
    *,
    force: bool = False,
    tool: bool = False,
) -> dict[str, Any]:
    """Returns the metadata of a partition matching the config, making it if absent.

    An existing partition made from another dataset spec or other parameters, or in an
    older format version, is an error (``PartitionError``) unless ``force``, which
    re-creates it. A directory holding anything but a partition is never written to.
    ``tool``: the caller is ``python -m partition``, whose refusals name ``--force``
    (a training run's name ``partition.dir``; see ``check_matches``).

    SIGINT and SIGTERM stop it with KeyboardInterrupt naming the signal, once its scratch
    and partly written files are removed (``adaqp.process.stop.stopping_on_signals``); first,
    what killed partitionings left beside ``out_dir`` is removed
    (``adaqp.partitioning.scratch.remove_stale``).
    """
    out_dir = Path(out_dir)
    with stopping_on_signals():
        scratch.remove_stale(out_dir.absolute().parent, out_dir)
        return _ensure(data, part, num_parts, out_dir, force=force, tool=tool)


def _ensure(
    data: DataConfig,
    part: PartitionConfig,
    num_parts: int,
    out_dir: Path,
    *,
    force: bool,
    tool: bool,
) -> dict[str, Any]:
    if not force and (out_dir / schema.METADATA_FILE).is_file():
        return _reuse(data, part, num_parts, out_dir, tool)
    store.check_target(out_dir)  # before the dataset is loaded: a bad path fails at once
    log = StageLog(reset_peaks=tool)  # a training process reports its own lifetime peak
    with log.stage("load"):
        graph = data.load()
    source: GraphSource | None = None
    try:  # the source is closed here too: a stop before _make holds it must not leak it
        try:
            with log.stage("take over"):
                source = GraphSource.take(graph, out_dir.absolute().parent)
            del graph
        except OSError as exc:
            raise schema.PartitionError(
                f"cannot write scratch files beside {out_dir}: {exc}; free space there or "
                "choose another --out / partition.dir"
            ) from None
        return _make(
            source,
            out_dir,
            log,
            num_parts=num_parts,
            spec=data.spec(),
            method=part.method,
            seed=part.seed,
            balance_train=part.balance_train,
            objective=part.objective,
            threads=1,
            exclusive=not force,
        )
    except store.PartitionExists:
        # Two runs started together and the other one wrote it first: use its partition.
        logger.info("another process wrote %s first", out_dir)
        return _reuse(data, part, num_parts, out_dir, tool)
    finally:
        if source is not None:
            source.close()


def _reuse(
    data: DataConfig, part: PartitionConfig, num_parts: int, out_dir: Path, tool: bool
) -> dict[str, Any]:
    """The metadata of the partition in ``out_dir``, checked against the config."""
    meta = schema.read_metadata(out_dir)
    schema.check_matches(
        meta,
        out_dir,
        spec=data.spec(),
        num_parts=num_parts,
        method=part.method,
        seed=part.seed,
        balance_train=part.balance_train,
        objective=part.objective,
        tool=tool,
    )
    logger.info("reusing partition %s", out_dir)
    return meta
