"""One training job on one rank: claim the output, prepare the partition, train, summarize.

``run`` is what ``python -m adaqp.train`` does once its flags are parsed. Before anything
else rank 0 claims the output directory its ``Placement`` picks (``adaqp.run.rundir``: a
lock, and the placement's refusal if it holds a finished, unfinished or running run)
while the others check they could write it; all ranks agree on the outcome through one
all-reduce. Rank 0 then partitions the graph if the partition directory is missing while
the others wait; each rank then loads only its own part. Rank 0 writes ``status.json``,
``config.json``, ``metrics.jsonl`` and, once training is done, ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from adaqp.config import Config
from adaqp.exchange.transport import ExchangeError
from adaqp.graph.local import LocalGraph
from adaqp.partitioning.schema import PartitionError, check_matches, read_metadata
from adaqp.partitioning.store import load_part
from adaqp.run.checkpoint import Checkpointer, CheckpointError
from adaqp.run.metrics import EpochRecord, RunWriter
from adaqp.run.placement import Placement
from adaqp.run.preflight import partition_dir
from adaqp.run.progress import Progress, count, describe
from adaqp.run.rundir import RunDir
from adaqp.run.runfiles import SUMMARY_FILE, Problem, RunDirError, check_writable
from adaqp.run.summary import RunFacts, Summary
from adaqp.run.trainer import Trainer, TrainingError
from adaqp.run.watchdog import StallWatch
from adaqp.runtime import World, init_distributed, shutdown

logger = logging.getLogger("adaqp.train")

SHARED_ERRORS = (RunDirError, PartitionError, FileNotFoundError, ValueError)
"""Expected failures every rank meets alike (a verdict agreed through a collective, or
rank 0's partitioning): rank 0 reports them for all."""
RANK_ERRORS = (CheckpointError, TrainingError, ExchangeError)
"""Expected failures that may be one rank's own (a dead peer, a damaged shard): each
rank reports its own."""


@dataclass
class Placed:
    """Where a job writes: None until every rank agreed on rank 0's claim."""

    out: Path | None = None


def claim_output(placement: Placement, world: World) -> tuple[Path, RunDir | None]:
    """Rank 0 reserves the directory ``placement`` picks (``RunDir.reserve``: nothing
    changes there yet); the others check they could write ``placement.base``
    (``check_writable``).

    Every rank learns every verdict, and the version of ``base`` rank 0 took, from one
    all-reduce, before partitioning or any other collective work: all ranks then stop
    together with an error naming the problem, instead of waiting on rank 0 until the
    process-group timeout. Returns the directory, and the reservation on rank 0 (None
    elsewhere).
    """
    out = placement.base
    run_dir: RunDir | None = None
    error: RunDirError | None = None
    try:
        if world.is_main:
            run_dir = RunDir.reserve(placement, job=world.job)
        else:
            check_writable(out)
    except RunDirError as exc:  # re-raised below, once the others know
        error = exc
    problems = torch.zeros(world.world_size + 1, device=world.device)
    if error is not None:
        problems[world.rank] = float(error.problem)
    if run_dir is not None:
        problems[-1] = float(placement.version_of(run_dir.path))
    try:
        dist.all_reduce(problems)
        if error is not None:
            raise error
        failed = [(rank, int(code)) for rank, code in enumerate(problems[:-1].tolist()) if code]
        if failed:
            raise RunDirError(
                Problem(failed[0][1]),
                "; ".join(
                    f"{Problem(code).describe(out)} (found by rank {rank}; see its log)"
                    for rank, code in failed
                ),
            )
    except BaseException:
        if run_dir is not None:  # reserved, but the run will not start
            run_dir.close()
        raise
    taken = placement.versioned(int(problems[-1].item()))
    if run_dir is not None and (why := placement.why_elsewhere(taken, own=run_dir.own)):
        logger.info("%s", why)
    return taken, run_dir


def prepare_partition(config: Config, world: World, part_dir: Path) -> dict:
    """Rank 0 makes the partition if needed; every rank then checks it matches the run."""
    error: Exception | None = None
    if world.is_main:
        from adaqp.partitioning.build import ensure_partition

        try:
            ensure_partition(config.data, config.partition, world.world_size, part_dir)
        except Exception as exc:  # re-raised below, once the others know
            error = exc
    # The others wait here (bounded by the process-group timeout) while rank 0 works.
    failed = torch.tensor([float(error is not None)], device=world.device)
    dist.all_reduce(failed)
    if error is not None:
        raise error
    if failed.item():
        raise PartitionError(f"rank 0 could not prepare the partition at {part_dir}; see its log")
    meta = read_metadata(part_dir)
    check_matches(
        meta,
        part_dir,
        spec=config.data.spec(),
        num_parts=world.world_size,
        method=config.partition.method,
        seed=config.partition.seed,
        balance_train=config.partition.balance_train,
        objective=config.partition.objective,
    )
    return meta


def run(
    config: Config,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    placement: Placement | None = None,
    placed: Placed | None = None,
) -> Summary:
    """Runs one training job on this process's rank; returns its summary.

    ``placement`` says where the run goes and what to do with a run already there (the
    command line's flags); by default the config's without flags (``Placement.of``): a run
    in ``metrics.out`` is refused, one in the default directory passed over for its next
    free version. ``placed`` learns the directory the run took, once every rank agreed on it (a
    failure after that still has it).
    """
    world = init_distributed(config.comm, init_method, rank, world_size)
    run_dir: RunDir | None = None
    # A worker group that torchrun restarted (--max-restarts) continues its job's run,
    # from the newest checkpoint completed before the failure, if any.
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    try:
        placement = placement or Placement.of(config, world.world_size, restarted=restarts > 0)
        out, run_dir = claim_output(placement, world)
        if placed is not None:
            placed.out = out
        if _agree(world, run_dir is not None and run_dir.finished):
            # A restart after the run had finished (a worker failed on its way out).
            summary = _finished_summary(world, out)
            if run_dir is not None:
                run_dir.close()
            shutdown()
            return summary
        part_dir = partition_dir(config, world.world_size)
        meta = prepare_partition(config, world, part_dir)
        if run_dir is not None:
            run_dir.start()  # only now is the old run (if --overwrite) removed
        if world.is_main:
            describe(config, meta, world.world_size, out)
        graph = LocalGraph.from_part(load_part(part_dir, world.rank, meta), world.device)
        trainer = Trainer(config, graph, meta, world)
        checkpoints = Checkpointer.for_run(config, world, placement.checkpoints(out), meta)
        history, resumed_from, redone = None, 0, 0
        if _agree(world, run_dir is not None and run_dir.resume_from is not None):
            resumed_from, tensors, history = checkpoints.load_latest()
            if resumed_from > config.train.epochs:
                raise ValueError(
                    f"the checkpoint in {checkpoints.root} is at epoch {resumed_from}, past "
                    f"--epochs {config.train.epochs}: give at least that many epochs"
                )
            trainer.load_state_dict(tensors)
            if world.is_main:
                redone = _epochs_logged(out) - resumed_from
                logger.info(
                    "resuming %s from the checkpoint at epoch %d (%s to redo)",
                    out,
                    resumed_from,
                    count(max(redone, 0), "epoch"),
                )
        writer = RunWriter(out, enabled=world.is_main, history=history)
        writer.write_config(
            {**config.to_dict(), "world_size": world.world_size, "partition_dir": str(part_dir)}
        )
        bar = Progress(config, world, resumed_from + 1) if world.is_main else None
        watch = StallWatch(world.rank, config.comm.stall_warn_s, config.comm.timeout_s)
        watch.at(f"epoch {resumed_from + 1}")

        def on_epoch(record: EpochRecord) -> None:
            watch.at(f"epoch {record.epoch + 1}")
            if bar is not None:
                bar(record)

        try:
            facts = RunFacts(
                partition_dir=str(part_dir),
                restarts=restarts,
                resumed_from_epoch=resumed_from,
                epochs_redone=max(redone, 0),
                threads=torch.get_num_threads(),
            )
            summary = trainer.fit(
                writer, on_epoch=on_epoch, checkpoints=checkpoints, resume=history, facts=facts
            )
        finally:
            watch.close()
            writer.close()
            if bar is not None:
                bar.close()
        writer.write_summary(summary)
        if run_dir is not None:
            run_dir.end()
    except BaseException as exc:
        if run_dir is not None:
            run_dir.end(exc)  # "failed" or "interrupted": the partial output says so
            run_dir.close()
        shutdown(barrier=False)  # a failing rank must not wait for healthy peers
        raise
    del trainer, graph
    gc.collect()  # release collective buffers and handles before the group goes away
    shutdown()
    if run_dir is not None:
        run_dir.close()
    return summary


def _finished_summary(world: World, out: Path) -> Summary:
    """The summary of the finished run in ``out``, as rank 0 reads it, on every rank."""
    payload: list[dict | None] = [None]
    if world.is_main:
        with suppress(OSError, ValueError):  # unreadable: every rank raises below
            payload[0] = json.loads((out / SUMMARY_FILE).read_text())
    dist.broadcast_object_list(payload, src=0)
    names = {f.name for f in dataclasses.fields(Summary)}
    try:
        return Summary(**{k: v for k, v in (payload[0] or {}).items() if k in names})
    except TypeError:
        what = f"{out} holds this job's finished run, but its {SUMMARY_FILE} cannot be read"
        raise RunDirError(Problem.FINISHED, what) from None


def _agree(world: World, flag: bool) -> bool:
    """Rank 0's ``flag``, on every rank."""
    value = torch.tensor([float(flag)], device=world.device)
    dist.broadcast(value, src=0)
    return bool(value.item())


def _epochs_logged(out: Path) -> int:
    """The last epoch in ``out/metrics.jsonl`` (0 if none): how far the run had got."""
    last = 0
    try:
        with open(out / "metrics.jsonl") as f:
            for line in f:
                try:
                    last = max(last, int(json.loads(line)["epoch"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by the failure
    except OSError:
        return 0
    return last
