"""``adaqp-train`` / ``bash launch/train.sh``: training without a torchrun command line.

Parses its own options (flags in any order, the config as first positional argument or
``--config``), passes the rest to ``adaqp.train`` on every worker, runs
``python -m torch.distributed.run`` as a child and ends with the workers' exit code (each
rank writes it to ``$ADAQP_STATUS_DIR/rank-<RANK>.code``): 0 success, 1 a failed run, 2 a
usage or config error, 130 interrupted. torchrun's own report of a failure (its
``ChildFailedError`` traceback and table, its log lines, its ``SignalException`` at
Ctrl-C) is left out of the output unless ``--debug``; workers' output passes unchanged,
with an ``error:`` line printed by several ranks shown once. Where rank 0 ended before it
could record how its run ended (killed: the kernel's out-of-memory killer sends SIGKILL),
the launcher records it in the run's ``status.json``. Imports only the standard library
(and, once torchrun has ended, ``adaqp.run.rundir``, which loads none): ``--help``
answers at once.

``args``: the command line and ``--help``; ``output``: the filter over torchrun's stderr and
the exit code; ``run``: the torchrun child, its environment and Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from adaqp.cli.configs import missing_config
from adaqp.cli.handoff import CALLER_CWD_ENV
from adaqp.cli.parser import UNRECOGNIZED, did_you_mean
from adaqp.launcher.args import (
    DEFAULT_CONFIG,
    HELP,
    LAUNCHER_FLAGS,
    MODES,
    TRAIN_FLAGS,
    Launch,
    UsageError,
    parse,
)
from adaqp.launcher.run import launch, memory_refused, refused

__all__ = ["Launch", "UsageError", "entry", "launch", "main", "parse"]


def main(argv: list[str] | None = None, prog: str = "python -m adaqp.launcher") -> int:
    """Runs the command line ``argv``; returns the exit code. ``prog``: how it was called
    (``launch/train.sh`` says so through ``ADAQP_LAUNCH_SCRIPT``), for help and the
    ``--resume`` hint."""
    argv = sys.argv[1:] if argv is None else list(argv)
    script = os.environ.get("ADAQP_LAUNCH_SCRIPT")
    words = ["bash", script] if script else shlex.split(prog)
    try:
        spec = parse(argv)
        if spec.help:
            print(
                HELP.format(prog=shlex.join(words), config=DEFAULT_CONFIG, modes=", ".join(MODES)),
                end="",
            )
            return 0
        if not Path(spec.config).is_file():
            # The configs the user could have meant, from the folder they typed it in.
            typed_in = os.environ.get(CALLER_CWD_ENV)
            raise UsageError(missing_config(spec.config, Path(typed_in) if typed_in else None))
        problem = _with_suggestion(refused(spec))
        problem = problem or (memory_refused(spec) if spec.memory_check else None)
        if problem is not None:
            raise UsageError(problem)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C during the check: nothing started
        print("interrupted before any worker started", file=sys.stderr)
        return 130
    return launch(spec, shlex.join([*words, *argv]))


def _with_suggestion(problem: str | None) -> str | None:
    """adaqp.train's refusal of options it does not know, with the closest among the
    launcher's options too (the workers know only their own: ``--nprocs`` is the
    launcher's ``--nproc``)."""
    if problem is None or not problem.startswith(UNRECOGNIZED):
        return problem
    words = problem.partition("; did you mean ")[0]
    return words + did_you_mean(words[len(UNRECOGNIZED) :].split(), LAUNCHER_FLAGS | TRAIN_FLAGS)


def entry() -> None:
    """The ``adaqp-train`` console script."""
    sys.exit(main(sys.argv[1:], prog=Path(sys.argv[0]).name))
