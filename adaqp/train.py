"""Entry point: ``torchrun --nproc-per-node P -m adaqp.train --config FILE [flags]``.

Flags: ``--config FILE``, ``--mode NAME``, ``--epochs N``, ``--seed N``, ``--out DIR``,
repeatable ``--set section.key=value``, and ``--overwrite`` or ``--resume``.

Before anything else rank 0 claims the output directory (``adaqp.run.rundir``: a lock, and a
refusal if it holds a finished or running run) while the others check they could write
it; all ranks agree on the outcome through one all-reduce. Rank 0 then partitions the
graph if the partition directory is missing while the others wait; each rank then loads
only its own part. Rank 0 writes ``status.json``, ``config.json``, ``metrics.jsonl`` and,
once training is done, ``summary.json`` to the output directory and prints a one-line
result. Exit codes: 0 success, 1 a failed run, 2 a usage or config error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from adaqp.config import Config, ConfigError, load_config
from adaqp.exchange.transport import ExchangeError
from adaqp.graph.local import LocalGraph
from adaqp.partitioning.format import PartitionError, check_matches, load_part, read_metadata
from adaqp.run.checkpoint import Checkpointer, CheckpointError, checkpoint_root
from adaqp.run.metrics import EpochRecord, RunWriter
from adaqp.run.rundir import Problem, RunDir, RunDirError, check_writable
from adaqp.run.summary import RunFacts, Summary
from adaqp.run.trainer import Trainer, TrainingError
from adaqp.runtime import World, init_distributed, shutdown

logger = logging.getLogger("adaqp.train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="adaqp.train", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="TOML config file (see configs/)")
    parser.add_argument("--mode", help="halo exchange mode (vanilla)")
    parser.add_argument("--epochs", type=int, help="training epochs")
    parser.add_argument("--seed", type=int, help="seed for weights and dropout")
    parser.add_argument("--out", help="output directory for config/metrics/summary")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument(
        "--overwrite",
        action="store_true",
        help="start fresh in an --out that holds a finished run (removes only its run files)",
    )
    existing.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its checkpoint",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override, repeatable (e.g. --set model.hidden=256)",
    )
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = list(args.set)
    for flag, key in (
        ("mode", "comm.mode"),
        ("epochs", "train.epochs"),
        ("seed", "train.seed"),
        ("out", "metrics.out"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    return load_config(args.config, overrides)


def partition_dir(config: Config, world_size: int) -> Path:
    if config.partition.dir:
        return Path(config.partition.dir)
    spec = json.dumps(config.data.spec(), sort_keys=True).encode()
    tag = hashlib.blake2b(spec, digest_size=4).hexdigest()
    name = f"{config.data.dataset}-{tag}-{config.partition.method}-p{world_size}"
    return Path("partitions") / name


def output_dir(config: Config, world_size: int) -> Path:
    if config.metrics.out:
        return Path(config.metrics.out)
    name = f"{config.data.dataset}-{config.model.name}-{config.comm.mode}-p{world_size}"
    return Path("results") / "runs" / name


def claim_output(
    out: Path, world: World, overwrite: bool, resume: bool | str, checkpoint_dir: Path
) -> RunDir | None:
    """Rank 0 claims ``out`` (``RunDir.claim``); the others check it (``check_writable``).

    Every rank learns every verdict from one all-reduce, before partitioning or any other
    collective work: all ranks then stop together with an error naming the problem,
    instead of waiting on rank 0 until the process-group timeout. Returns the claimed
    directory on rank 0, None elsewhere.
    """
    run_dir: RunDir | None = None
    error: RunDirError | None = None
    try:
        if world.is_main:
            run_dir = RunDir.claim(
                out, overwrite=overwrite, resume=resume, checkpoint_dir=checkpoint_dir
            )
        else:
            check_writable(out)
    except RunDirError as exc:  # re-raised below, once the others know
        error = exc
    problems = torch.zeros(world.world_size, device=world.device)
    if error is not None:
        problems[world.rank] = float(error.problem)
    try:
        dist.all_reduce(problems)
        if error is not None:
            raise error
        failed = [(rank, int(code)) for rank, code in enumerate(problems.tolist()) if code]
        if failed:
            raise RunDirError(
                Problem(failed[0][1]),
                "; ".join(
                    f"{Problem(code).describe(out)} (found by rank {rank}; see its log)"
                    for rank, code in failed
                ),
            )
    except BaseException as exc:
        if run_dir is not None:  # claimed, but the run will not start
            run_dir.end(exc)
            run_dir.close()
        raise
    return run_dir


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
    overwrite: bool = False,
    resume: bool = False,
) -> Summary:
    """Runs one training job on this process's rank; returns its summary.

    ``overwrite`` and ``resume`` say what to do with a finished run in the output
    directory (see ``adaqp.run.rundir``); without either it is refused.
    """
    world = init_distributed(config.comm, init_method, rank, world_size)
    run_dir: RunDir | None = None
    # A worker group that torchrun restarted (--max-restarts) continues from the newest
    # checkpoint, if one was completed before the failure.
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    if restarts and not overwrite and not resume:
        resume = "auto"
    try:
        out = output_dir(config, world.world_size)
        ckpt_dir = checkpoint_root(config, out)
        run_dir = claim_output(out, world, overwrite, resume, ckpt_dir)
        part_dir = partition_dir(config, world.world_size)
        meta = prepare_partition(config, world, part_dir)
        graph = LocalGraph.from_part(load_part(part_dir, world.rank, meta), world.device)
        trainer = Trainer(config, graph, meta, world)
        checkpoints = Checkpointer.for_run(config, world, out, meta)
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
                    "resuming from the checkpoint at epoch %d (%d epochs to redo)",
                    resumed_from,
                    redone,
                )
        writer = RunWriter(out, enabled=world.is_main, history=history)
        writer.write_config(
            {**config.to_dict(), "world_size": world.world_size, "partition_dir": str(part_dir)}
        )
        bar = _progress_bar(config, world, first_epoch=resumed_from + 1)
        try:
            facts = RunFacts(
                partition_dir=str(part_dir),
                restarts=restarts,
                resumed_from_epoch=resumed_from,
                epochs_redone=max(redone, 0),
            )
            summary = trainer.fit(
                writer, on_epoch=bar, checkpoints=checkpoints, resume=history, facts=facts
            )
        finally:
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


class _Progress:
    """tqdm on a terminal; otherwise a log line every tenth of the run."""

    def __init__(self, config: Config, world: World, first_epoch: int = 1):
        self.total = config.train.epochs
        self.bar = None
        if world.is_main and config.metrics.progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                initial=first_epoch - 1,
                desc="train",
                unit="epoch",
                dynamic_ncols=True,
            )
        self.every = max(1, self.total // 10)

    def __call__(self, record: EpochRecord) -> None:
        val = f"{record.val_acc:.4f}" if record.val_acc is not None else "-"
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{record.train_loss:.4f}",
                val=val,
                epoch_s=f"{record.epoch_time_s:.3f}",
                refresh=False,
            )
            self.bar.update(1)
        elif record.epoch % self.every == 0 or record.epoch == self.total:
            logger.info(
                "epoch %d/%d loss %.4f val %s epoch %.3fs comm %.3fs",
                record.epoch,
                self.total,
                record.train_loss,
                val,
                record.epoch_time_s,
                record.comm_time_s,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _progress_bar(config: Config, world: World, first_epoch: int = 1) -> _Progress | None:
    return _Progress(config, world, first_epoch) if world.is_main else None


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


def setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def _interrupt(signum: int, frame: object) -> None:
    # torchrun stops its workers with SIGTERM (on Ctrl-C too): unwind as Ctrl-C does, so
    # that the run's status says "interrupted".
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    setup_logging(int(os.environ.get("RANK", 0)))
    signal.signal(signal.SIGTERM, _interrupt)
    # Ctrl-C (SIGINT) interrupts even where it was inherited as ignored: a background job
    # of a non-interactive shell (a script, CI) starts with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run(config, overwrite=args.overwrite, resume=args.resume)
    except (
        RunDirError,
        CheckpointError,
        PartitionError,
        FileNotFoundError,
        ValueError,
        TrainingError,
        ExchangeError,
    ) as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt as exc:
        logger.error("interrupted (%s)", str(exc) or "SIGINT")
        return 130
    if int(os.environ.get("RANK", 0)) == 0:
        print(
            f"{summary.dataset} {summary.model} {summary.mode} P={summary.world_size}: "
            f"test acc {summary.test_acc_at_best_val:.4f} (best val "
            f"{summary.best_val_acc:.4f} at epoch {summary.best_epoch}), "
            f"final loss {summary.final_train_loss:.4f}, "
            f"epoch {summary.epoch_time_s * 1000:.1f} ms, comm {summary.comm_time_s * 1000:.1f} "
            f"ms, halo {summary.halo_bytes_per_epoch / 1e6:.2f} MB/epoch"
        )
    return 0


def exit_now(code: int) -> None:
    """Ends the process without the interpreter's final teardown.

    Once the process group is destroyed and every file is closed nothing is left to do,
    but gloo's transport threads can still abort the teardown (std::terminate) and turn
    a clean run into a failed one under torchrun.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
