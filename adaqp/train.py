"""Train a GNN on the whole graph across the ranks of a torchrun job.

``torchrun --nproc-per-node P -m adaqp.train --config FILE [flags]`` (or, without the
torchrun command line, ``bash launch/train.sh`` / ``adaqp-train``). This module is the
command line only: it parses the flags and the config without importing torch (``--help``
answers at once), then runs the job (``adaqp.run.job``) and turns its outcome into one
line and an exit code: 0 success, 1 a failed run, 2 a usage or config error, 130
interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from adaqp.cli.deps import require
from adaqp.cli.handoff import CALLER_CWD_ENV, COMMAND_ENV, STATUS_DIR_ENV
from adaqp.cli.parser import Parser

PROG = "python -m adaqp.train"

try:
    from adaqp.config import (
        MODES,
        QUANTIZED_MODES,
        STALE_MODES,
        Config,
        ConfigError,
        load_config,
    )
except ModuleNotFoundError:  # numpy, which the config's dataset defaults import
    require(PROG)
    raise
from adaqp.process.allocator import configure as configure_allocator  # noqa: E402
from adaqp.process.stop import request_stop, stop_requested  # noqa: E402 - after the check above
from adaqp.quant.bits import bits_text  # noqa: E402 - after the check above
from adaqp.run.placement import Placement  # noqa: E402 - after the check above

logger = logging.getLogger("adaqp.train")

MODE_HELP = {
    "vanilla": "float32, synchronous: the exact baseline",
    "adaqp-q": "halo messages between hosts quantized, all at quant.bits (0: the model's "
    "width, 1 for gcn), float32 within a host (quant.full_precision=never: every message); "
    "quant.scheme=adaptive: a solver's width per message group",
    "adaqp-p": "float32 with central/marginal overlap (exact)",
    "adaqp": "adaqp-q and adaqp-p together",
    "adaqp-s": "adaqp whose planner may also make an exchange stale where that hides a wait",
    "onebit": "one bit per value, exchanged asynchronously under bounded staleness",
    "nocomm": "benchmark only: skips the exchange (accuracy not meaningful)",
}
EXIT_CODES = "exit codes: 0 success, 1 a failed run, 2 a usage or config error, 130 interrupted"


def build_parser() -> Parser:
    """The command line: every flag, and the modes and exit codes in ``--help``."""
    modes = "\n".join(f"  {name:<8} {MODE_HELP[name]}" for name in MODES)
    parser = Parser(
        prog="adaqp.train",
        description=__doc__.split("\n\n")[0],
        epilog=f"modes:\n{modes}\n\n{EXIT_CODES}. Every config key: adaqp/config.py.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --epoch is a typo, not --epochs
    )
    parser.add_argument(
        "--config",
        help="TOML config file (see configs/); without one, every key takes its default",
    )
    parser.add_argument(
        "--mode",
        help=f"halo exchange mode: {', '.join(MODES)}, each below (default: the config's, "
        "else vanilla)",
    )
    parser.add_argument("--epochs", type=int, help="training epochs (default: the config's)")
    parser.add_argument(
        "--seed", type=int, help="seed for weights and dropout (default: the config's)"
    )
    parser.add_argument(
        "--out",
        help="output directory (default: results/runs/<config stem>-<mode>-p<P>, or its "
        "first free -v2, -v3, ... where it holds a run; --resume and --overwrite without "
        "--out act on the newest of them)",
    )
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument(
        "--overwrite",
        action="store_true",
        help="start fresh in an --out that holds a run, finished or not (removes its files "
        "and checkpoints)",
    )
    existing.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest checkpoint",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override, repeatable (e.g. --set model.hidden=256)",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks of expected errors too"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check the flags and the config: exit 0, or 2 with the error; starts "
        "nothing (the launcher asks this before it starts any worker)",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def config_from_args(args: argparse.Namespace) -> Config:
    overrides, flags = list(args.set), {}
    for flag, key in (
        ("mode", "comm.mode"),
        ("epochs", "train.epochs"),
        ("seed", "train.seed"),
        ("out", "metrics.out"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
            flags[key] = f"--{flag}"
    try:
        return load_config(args.config, overrides)
    except ConfigError as exc:  # "key: ..." from a flag's value names the flag too
        key, _, rest = str(exc).partition(": ")
        if key in flags:
            raise ConfigError(f"{flags[key]} ({key}): {rest}") from exc
        raise


def setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def format_bytes(n: float) -> str:
    """Bytes in the unit that keeps three significant digits: 13552 -> "13.6 kB"."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def result_line(summary, out: Path) -> str:
    """The line a finished run prints (rank 0): with its figures, the precision of its
    halo messages (32 bits for float32) and, for the stale modes, the staleness bound."""
    accuracy = f"test acc {summary.test_acc_at_best_val:.4f}"
    if summary.mode == "nocomm":
        accuracy += " (nocomm: not meaningful)"
    bits = ", no exchange" if summary.mode == "nocomm" else f", {bits_text(summary.avg_bits)}"
    if summary.mode in QUANTIZED_MODES and summary.avg_bits >= 32:
        one_host = len(set(getattr(summary, "host_of_rank", []))) <= 1
        why = "every message stays within one host" if one_host else "the start-up profile"
        bits += f' (float32: {why}; quant.full_precision = "never" quantizes)'
    if summary.mode in STALE_MODES:
        bits += f", staleness bound {summary.staleness_bound}"
    return (
        f"{summary.dataset} {summary.model} {summary.mode} P={summary.world_size}: "
        f"{accuracy} (best val {summary.best_val_acc:.4f} at epoch {summary.best_epoch}), "
        f"final test acc {summary.final_test_acc:.4f}, "
        f"final loss {summary.final_train_loss:.4f}, "
        f"epoch {summary.epoch_time_s * 1000:.1f} ms, comm {summary.comm_time_s * 1000:.1f} "
        f"ms, halo {format_bytes(summary.halo_bytes_per_epoch)}/epoch{bits}; written to {out}"
    )


def resume_command(argv: list[str], out: Path | None = None) -> str:
    """The command that continues this run: the user's (``ADAQP_COMMAND``) or this
    process's, without a flag that starts fresh, with ``--resume``; and ``--out out``
    where the command named no output directory (its default may since have taken a
    later version)."""
    typed = os.environ.get(COMMAND_ENV)
    if typed:
        words = shlex.split(typed)
    else:
        nproc = os.environ.get("LOCAL_WORLD_SIZE", "1")
        words = ["torchrun", "--nproc-per-node", nproc, "-m", "adaqp.train", *argv]
    kept = [w for w in words if w not in ("--overwrite", "--resume")]
    names_out = any(
        w == "--out" or w.startswith("--out=") or "metrics.out=" in w.replace(" ", "") for w in kept
    )
    if out is not None and not names_out:
        # The launcher resolves a relative --out against where the user typed the command.
        typed_in = os.environ.get(CALLER_CWD_ENV)
        shown = out if typed_in in (None, os.getcwd()) else out.absolute()
        kept += ["--out", str(shown)]
    return shlex.join([*kept, "--resume"])


def _interrupted_hint(out: Path, checkpoint_dir: Path, argv: list[str]) -> str:
    from adaqp.run.ckptdir import complete_epochs

    epochs = complete_epochs(checkpoint_dir)
    if not epochs:
        return (
            f"no checkpoint was written to {checkpoint_dir}; the run in {out} can only start again"
        )
    command = resume_command(argv, out)
    return f"the newest checkpoint is at epoch {epochs[-1]}; continue with: {command}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank = int(os.environ.get("RANK", 0))
    setup_logging(rank)
    # torchrun stops its workers with SIGTERM (on Ctrl-C too): it unwinds as Ctrl-C does.
    # Ctrl-C (SIGINT) interrupts even where it was inherited as ignored: a background job
    # of a non-interactive shell (a script, CI) starts with SIGINT ignored.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, request_stop)
    args = parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:  # every rank reads the same config and fails alike
        _report_shared(rank, exc)
        return 2
    from adaqp.run import preflight

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    name = Path(args.config).stem if args.config else None
    # A worker group that torchrun restarted continues the run its first attempt began.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    flags = dict(overwrite=args.overwrite, resume=args.resume, restarted=restarted)
    placement = Placement.of(config, world_size, name, **flags)
    try:  # before torch loads and the group forms: a refusal costs a second, not a start
        # ``out`` is where the run will most likely land: given no directory, rank 0
        # takes the version itself, and a run starting alongside may take that one first.
        out = preflight.check(config, world_size, placement)
    except preflight.Refusal as exc:  # every rank sees the same files and refuses alike
        _report_shared(rank, exc)
        return 2
    if args.check:
        return 0
    require(PROG)  # torch and the rest, before the job imports them
    allocator = configure_allocator(config.train.allocator)  # before torch's first tensor
    logger.debug("%s", allocator.text())
    from adaqp.run import job

    placed = job.Placed()
    try:
        summary = job.run(config, placement=placement, placed=placed)
    except job.SHARED_ERRORS + job.RANK_ERRORS as exc:
        if args.debug:
            logger.exception("failed")
        if stopped := stop_requested():  # a peer stopped first and broke a collective
            return _interrupted(rank, stopped, placed.out or out, placement, argv)
        if isinstance(exc, job.RANK_ERRORS):
            print(f"error: {exc}", file=sys.stderr)
        else:
            _report_shared(rank, exc)
        return 1
    except KeyboardInterrupt as exc:
        return _interrupted(rank, str(exc) or "SIGINT", placed.out or out, placement, argv)
    if rank == 0:
        print(result_line(summary, placed.out or out))
    return 0


def _interrupted(
    rank: int, signal_name: str, out: Path, placement: Placement, argv: list[str]
) -> int:
    """Rank 0 says how to go on after a stop signal; every rank's exit code is 130."""
    if rank == 0:
        hint = _interrupted_hint(out, placement.checkpoints(out), argv)
        print(f"interrupted ({signal_name}); {hint}", file=sys.stderr)
    return 130


def _report_shared(rank: int, exc: BaseException, wait_s: float = 10.0) -> None:
    """Prints an error every rank meets alike once, from rank 0.

    Another rank stays silent while rank 0 reports: it waits until rank 0 has ended
    (under the launcher, ``ADAQP_STATUS_DIR``, rank 0 records its exit; under plain
    torchrun, the agent stops this rank once rank 0 exits), and speaks for rank 0 if that
    has not happened within ``wait_s`` (rank 0 is slower, gone, or on another host). An
    early exit here would let torchrun stop rank 0 before it printed anything.
    """
    if rank != 0:
        status_dir = os.environ.get(STATUS_DIR_ENV)
        rank0 = Path(status_dir) / "rank-0.code" if status_dir else None
        deadline = time.monotonic() + wait_s
        try:
            while time.monotonic() < deadline:
                if rank0 is not None and rank0.exists():  # rank 0 has ended
                    return
                time.sleep(0.05)
        except KeyboardInterrupt:  # torchrun stops this rank: rank 0 has ended
            return
    print(f"error: {exc}", file=sys.stderr)


def _record_exit(code: int) -> None:
    """Tells the launcher (``ADAQP_STATUS_DIR``) how this rank ended."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir:
        try:
            path = Path(status_dir) / f"rank-{os.environ.get('RANK', 0)}.code"
            path.write_text(f"{code}\n")
        except OSError:
            pass  # the launcher then falls back to torchrun's own exit code


def exit_now(code: int) -> None:
    """Ends the process without the interpreter's final teardown.

    Once the process group is destroyed and every file is closed nothing is left to do,
    but gloo's transport threads can still abort the teardown (std::terminate) and turn
    a clean run into a failed one under torchrun.
    """
    _record_exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
        code = exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:  # stopped before the run began (torchrun stops the others
        code = 130  # when one rank fails): nothing to resume, and no traceback to show
    exit_now(code)
