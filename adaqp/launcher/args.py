"""The launcher's command line: its options, the train flags it passes on, its help."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from adaqp.cli.handoff import CALLER_CWD_ENV
from adaqp.cli.parser import set_item_problem

DEFAULT_CONFIG = "configs/cora-gcn.toml"
# adaqp.config's modes (this module imports no torch).
MODES = ("vanilla", "adaqp-q", "adaqp-p", "adaqp", "adaqp-s", "onebit", "nocomm")
# Launcher options: flag -> (field, environment variable, default).
OPTIONS = {
    "--nproc": ("nproc", "NPROC", "4"),
    "--nnodes": ("nnodes", "NNODES", "1"),
    "--node-rank": ("node_rank", "NODE_RANK", "0"),
    "--master-addr": ("master_addr", "MASTER_ADDR", "127.0.0.1"),
    "--master-port": ("master_port", "MASTER_PORT", "29500"),
    "--rdzv-id": ("rdzv_id", "RDZV_ID", "adaqp"),
    "--restarts": ("restarts", "RESTARTS", "0"),
}
ALIASES = {"--nproc-per-node": "--nproc"}
TRAIN_VALUE_FLAGS = {"--mode", "--epochs", "--seed", "--out", "--set"}
TRAIN_FLAGS = TRAIN_VALUE_FLAGS | {"--overwrite", "--resume", "--debug", "--check"}
"""adaqp.train's options besides --config and --help (suggested for a mistyped option)."""
LAUNCHER_FLAGS = {*OPTIONS, *ALIASES, "--config", "--debug", "--no-memory-check", "--help"}
"""The launcher's own options."""
PATH_KEYS = ("data.root", "data.path", "partition.dir", "checkpoint.dir", "metrics.out")
"""Config keys that name a file or folder: given with --set, relative to the user's folder."""

HELP = """\
usage: {prog} [CONFIG] [options] [train flags...]

Trains a GNN on the whole graph with NPROC workers per host under torchrun, without a
torchrun command line. Options and train flags may come in any order.

  CONFIG, --config FILE  TOML config file (default: {config})

launcher options (each defaults to an environment variable, then to a fixed value):
  --nproc N          worker processes on this host (NPROC, default 4)
  --nnodes N         hosts in the job (NNODES, default 1); above 1 the hosts meet through
                     c10d rendezvous on host 0, every host running the same command
  --node-rank R      this host's index, 0 to NNODES-1 (NODE_RANK, default 0)
  --master-addr A    host 0's address (MASTER_ADDR, default 127.0.0.1; several hosts)
  --master-port P    rendezvous port on host 0 (MASTER_PORT, default 29500; several hosts)
  --rdzv-id ID       rendezvous id, the same on every host (RDZV_ID, default adaqp)
  --restarts N       restart a lost worker group up to N times; it resumes from the last
                     checkpoint (RESTARTS, default 0)
  --no-memory-check  start even where the memory estimate (python -m adaqp.memory) says
                     this host's workers need more than its memory (its cgroup limit,
                     else the machine's); by default such a run is refused before it starts
  --debug            show all output (torchrun's own failure report and the tracebacks of
                     expected errors); also passed to the workers
  -h, --help         show this help and exit

train flags, passed to every worker (python -m adaqp.train --help describes them all):
  --mode MODE        {modes} (default: the config's)
  --epochs N         training epochs (default: the config's)
  --seed N           seed for weights and dropout (default: the config's)
  --out DIR          output directory (default: one under results/runs/ named after the
                     config, mode and worker count)
  --set SECTION.KEY=VALUE
                     config override, repeatable (e.g. --set model.hidden=256)
  --overwrite        start fresh over the run in the output directory, deleting it
  --resume           continue the run in the output directory from its newest checkpoint
  No run is deleted without --overwrite. Given no output directory (--out, --set
  metrics.out=..., or out in the config's [metrics]), a run whose default directory holds
  a run goes to the first free <dir>-v2, <dir>-v3, ...; --resume and --overwrite act on
  the newest of them. Paths on the command line (CONFIG, --out, --set of a path key) are
  relative to the folder the command is typed in; paths inside a config, to the checkout.

environment: OMP_NUM_THREADS threads per worker (default: this host's usable cores shared
among its workers; comm.threads wins over it); TORCH_ELASTIC_SHUTDOWN_TIMEOUT
(default 5) seconds a stopped worker gets before it is killed; GLOO_SOCKET_IFNAME the
network interface joining several hosts.

exit codes: 0 success, 1 a failed run, 2 a usage or config error, 130 interrupted

examples:
  bash launch/train.sh
  bash launch/train.sh configs/cora-sage.toml --mode adaqp --epochs 100
  NPROC=2 adaqp-train --config configs/citeseer-gcn.toml --set model.hidden=128
  bash launch/train.sh configs/cora-gcn.toml --resume      # continue after Ctrl-C
  NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 NPROC=1 GLOO_SOCKET_IFNAME=eth0 \\
      bash launch/train.sh configs/synthetic-gcn.toml --mode adaqp
"""


class UsageError(Exception):
    """A bad command line or environment: one line, exit code 2."""


@dataclass
class Launch:
    """What the command line asks for."""

    config: str
    config_given: bool = False
    """The command line named the config (else the default, in the checkout)."""
    nproc: int = 4
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    rdzv_id: str = "adaqp"
    restarts: int = 0
    debug: bool = False
    help: bool = False
    memory_check: bool = True
    """Refuse a run whose predicted memory exceeds this host's (``--no-memory-check``)."""
    train_args: list[str] = field(default_factory=list)

    def check(self, python: str = sys.executable) -> list[str]:
        """The command that checks the train flags and the config without starting
        anything (``adaqp.train --check``)."""
        return [python, "-m", "adaqp.train", "--config", self.config, *self.train_args, "--check"]

    def torchrun(self, python: str = sys.executable) -> list[str]:
        """The torchrun command line (as launch/train.sh always ran it)."""
        if self.nnodes == 1:
            rdzv = ["--standalone"]
        else:
            rdzv = [
                *("--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)),
                *("--rdzv-backend", "c10d", "--rdzv-id", self.rdzv_id),
                *("--rdzv-endpoint", f"{self.master_addr}:{self.master_port}"),
            ]
        return [
            *(python, "-m", "torch.distributed.run", *rdzv),
            *("--nproc-per-node", str(self.nproc), "--max-restarts", str(self.restarts)),
            *("-m", "adaqp.train", "--config", self.config, *self.train_args),
        ]


def _int(text: str, name: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
        raise UsageError(f"{name} must be {bound}, got {text!r}")
    return value


def default_config() -> str:
    """configs/cora-gcn.toml here, else beside the package (an editable checkout)."""
    if Path(DEFAULT_CONFIG).is_file():
        return DEFAULT_CONFIG
    beside = Path(__file__).resolve().parents[2] / DEFAULT_CONFIG
    return str(beside) if beside.is_file() else DEFAULT_CONFIG


def parse(argv: list[str], environ: dict[str, str] | None = None) -> Launch:
    """The launch ``argv`` and ``environ`` describe; raises ``UsageError``."""
    environ = os.environ if environ is None else environ
    problem = set_item_problem(argv)  # else the item's value would be taken for the config
    if problem is not None:
        raise UsageError(problem)
    values = {name: environ.get(env) or default for name, env, default in OPTIONS.values()}
    sources = {name: env for name, env, _ in OPTIONS.values()}
    config: str | None = None
    positional: str | None = None
    debug = help_ = False
    memory_check = True
    train: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        flag, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        flag = ALIASES.get(flag, flag)
        if arg == "--":
            train.extend(args)
            break
        if arg in ("-h", "--help"):
            help_ = True
        elif flag == "--config" or flag in OPTIONS:
            if not eq and not args:
                raise UsageError(f"{flag} needs a value")
            value = inline if eq else args.pop(0)
            if flag == "--config":
                if not value:
                    raise UsageError("--config needs a value")
                if config is not None:
                    raise UsageError(f"two configs given: {config} and {value}")
                config = value
            else:
                values[OPTIONS[flag][0]] = value
                sources[OPTIONS[flag][0]] = flag
        elif arg == "--debug":
            debug = True
            train.append(arg)
        elif arg == "--no-memory-check":
            memory_check = False
        elif flag in TRAIN_VALUE_FLAGS and not eq:
            if not args:
                raise UsageError(f"{flag} needs a value")
            train += [arg, args.pop(0)]
        elif arg.startswith("-"):
            train.append(arg)
            # An unknown flag keeps the word after it (its value, for adaqp.train to judge).
            if not eq and args and not args[0].startswith("-"):
                train.append(args.pop(0))
        elif positional is None and config is None:
            positional = arg
        else:
            raise UsageError(
                f"unexpected argument {arg!r}: give one config, as the first argument or "
                "with --config (see --help)"
            )
    if positional is not None:
        if config is not None:
            raise UsageError(f"two configs given: {positional} and {config}")
        config = positional
    given = config is not None
    config = default_config() if config is None else config
    launch = Launch(config=config, config_given=given, debug=debug, help=help_)
    launch.memory_check = memory_check
    if help_:
        return launch
    launch.nproc = _int(values["nproc"], sources["nproc"], 1)
    launch.nnodes = _int(values["nnodes"], sources["nnodes"], 1)
    launch.node_rank = _int(values["node_rank"], sources["node_rank"], 0, launch.nnodes - 1)
    launch.master_port = _int(values["master_port"], sources["master_port"], 1, 65535)
    launch.restarts = _int(values["restarts"], sources["restarts"], 0)
    launch.master_addr, launch.rdzv_id = values["master_addr"], values["rdzv_id"]
    launch.train_args = train
    resolve_paths(launch, environ.get(CALLER_CWD_ENV))
    return launch


def resolve_paths(launch: Launch, caller_cwd: str | None) -> None:
    """Makes the command line's relative paths (the config, ``--out``, ``--set`` of a
    ``PATH_KEYS`` key) absolute against ``caller_cwd``, the folder the user typed the
    command in, where that is not the folder the workers run in."""
    if not caller_cwd or Path(caller_cwd).resolve() == Path.cwd().resolve():
        return

    def absolute(path: str) -> str:
        return path if not path or Path(path).is_absolute() else str(Path(caller_cwd) / path)

    if launch.config_given:
        launch.config = absolute(launch.config)
    args = launch.train_args
    for i, arg in enumerate(args):
        if arg.startswith("--out="):
            args[i] = "--out=" + absolute(arg[len("--out=") :])
        elif arg.startswith("--set="):
            args[i] = "--set=" + _absolute_set(arg[len("--set=") :], absolute)
        elif i and args[i - 1] == "--out":
            args[i] = absolute(arg)
        elif i and args[i - 1] == "--set":
            args[i] = _absolute_set(arg, absolute)


def _absolute_set(item: str, absolute) -> str:
    key, eq, value = item.partition("=")
    if eq and key.strip() in PATH_KEYS:
        bare = value.strip().strip("'\"")
        return f"{key}={absolute(bare)}" if bare else item
    return item
