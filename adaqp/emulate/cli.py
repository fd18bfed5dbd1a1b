"""``python -m adaqp.cluster``: the emulated cluster's command line, ``main``.

Reads the hosts, the links and the time bound, builds an ``EmulatedCluster`` and runs
``adaqp.train`` on it with every argument after ``--``; exits 0 on success, 1 when the
cluster or its job failed, 2 on bad arguments or without root, and 130 when a signal
stopped the run (the hosts are torn down in every case).

Each job's logs go to a folder of their own, as runs do: by default the first of
``results/runs/cluster-logs``, ``-v2``, ``-v3``, ... that does not exist yet
(``log_dir_for``); a ``--log-dir`` that holds an earlier job's ``cluster.json`` is refused
unless ``--overwrite`` is given. A refused job (bad arguments, a memory estimate over a
host's budget, budgets the machine cannot enforce) writes nothing: the folder is made, and
an earlier job's logs removed, only once the hosts are about to start.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

from adaqp.cli.deps import require
from adaqp.cli.parser import HelpFormatter, Parser
from adaqp.emulate.cgroups import (
    Budget,
    CgroupError,
    default_cpus,
    enforce,
    host_budgets,
)
from adaqp.emulate.cluster import EmulatedCluster
from adaqp.emulate.links import host_links
from adaqp.emulate.netns import ClusterError
from adaqp.run.placement import newest_version, versioned

logger = logging.getLogger(__name__)

DEFAULT_LOG_DIR = Path("results/runs/cluster-logs")
"""Where a job's logs go without ``--log-dir``: this folder, or its first free ``-v2``, ..."""


def _raise_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def build_parser() -> argparse.ArgumentParser:
    """The command line before ``--`` (what follows goes to ``adaqp.train``)."""
    parser = Parser(
        prog="python -m adaqp.cluster",
        usage="%(prog)s [options] -- [adaqp.train arguments]",
        description=textwrap.fill(
            "Run adaqp.train across emulated hosts joined by shaped links (root). Each host "
            "is a network namespace running one torchrun node; the hosts are torn down on "
            "success, failure, timeout and signals. Exit codes: 0 done, 1 the cluster or "
            "its job failed, 2 bad arguments or not root, 130 stopped by a signal."
        ),
        epilog=textwrap.fill(
            "Everything after -- goes to adaqp.train unchanged, e.g. -- --config "
            "configs/cora-gcn.toml --mode adaqp. --bandwidth, --latency, --loss, "
            "--cpus-per-host and --memory-per-host take one value for all hosts or a "
            "comma-separated list with exactly one per host. A host's budget holds all its "
            "processes (a control group each); what each host used is written to "
            "cluster.json."
        ),
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # a prefix is a typo, not the option it starts
    )
    parser.add_argument(
        "--hosts", type=int, default=4, help="emulated hosts, each a network namespace"
    )
    parser.add_argument(
        "--procs-per-host",
        type=int,
        default=1,
        help="workers per host (torchrun --nproc-per-node); they share the host's link",
    )
    parser.add_argument(
        "--bandwidth",
        default="1gbit",
        help='tc rate per host link, e.g. 100mbit or 1gbit,1gbit,100mbit ("" leaves the '
        "links unshaped)",
    )
    parser.add_argument(
        "--latency", default="", help="added one-way delay, e.g. 0.1ms (default: none)"
    )
    parser.add_argument("--loss", default="", help="packet loss, e.g. 0.1%% (default: none)")
    add_budget_arguments(parser)
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds for the whole job, then it is stopped"
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="where each host's torchrun output (host<i>.log) and the cluster's description "
        "(cluster.json) are written; one that holds an earlier job's cluster.json is refused "
        f"(default: {DEFAULT_LOG_DIR}, or its first free -v2, -v3, ...: a folder per job)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a --log-dir that holds an earlier job's logs (its cluster.json and "
        "host<i>.log are removed first); without --log-dir, the newest default folder",
    )
    return parser


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cpus-per-host`` and ``--memory-per-host`` (also ``python -m adaqp.bench cluster``'s)."""
    parser.add_argument(
        "--cpus-per-host",
        default=None,
        help="CPU quota of each host in cores, e.g. 0.5 or 1,1,0.5, 0 for no limit; its "
        "workers' threads follow it, rounded up (default: the usable cores shared among the "
        "hosts)",
    )
    parser.add_argument(
        "--memory-per-host",
        default="",
        help="memory limit of each host, e.g. 3g or 200m,3g, 0 for no limit; a host that "
        "runs out fails the job (exit 1), and a job whose memory estimate (python -m "
        "adaqp.memory) exceeds a host's limit is refused before it starts (exit 2) "
        "(default: none)",
    )
    parser.add_argument(
        "--no-memory-check",
        action="store_true",
        help="start even where the memory estimate exceeds a host's --memory-per-host "
        "(default: refuse such a job)",
    )


def budgets_from(args: argparse.Namespace) -> list[Budget]:
    """The hosts' budgets from ``args`` (ValueError on a value that cannot be read)."""
    cpus = default_cpus(args.hosts) if args.cpus_per_host is None else args.cpus_per_host
    return host_budgets(args.hosts, cpus, args.memory_per_host)


def _memory_refusal(args: argparse.Namespace, budgets: list[Budget], train_args: list[str]):
    """The refusal of a job whose predicted memory exceeds a host's ``--memory-per-host``
    (``adaqp.memory.check``), or None; hosts without a limit are not checked."""
    from adaqp.memory.check import refusal
    from adaqp.memory.limits import HostLimit, config_in

    k = args.procs_per_host
    hosts = [
        (range(i * k, (i + 1) * k), HostLimit(b.memory_bytes, "--memory-per-host"))
        for i, b in enumerate(budgets)
        if b.memory_bytes
    ]
    if not hosts:
        return None
    config = config_in(train_args, default="configs/cora-gcn.toml")  # the launcher's default
    return refusal(config, train_args, args.hosts * k, hosts)


def check_log_dir(given: Path | None, overwrite: bool = False) -> None:
    """Refuses a ``--log-dir`` that ``log_dir_for`` would refuse, touching nothing.

    Raises:
        ValueError: ``given`` holds an earlier job's logs and ``overwrite`` is False.
    """
    if given is not None and not overwrite and (given / "cluster.json").exists():
        raise ValueError(
            f"--log-dir {given} holds an earlier job's logs (cluster.json): name another "
            "folder, leave --log-dir out for a fresh one, or add --overwrite"
        )


def log_dir_for(given: Path | None, overwrite: bool = False) -> Path:
    """The folder this job's logs go to, made here (once the job is about to start: a
    refused job leaves no folder behind).

    ``given`` (``--log-dir``) as it is, unless it holds an earlier job's ``cluster.json``;
    else the first of ``DEFAULT_LOG_DIR``, ``-v2``, ... that does not exist yet, claimed by
    making it (two jobs started together never share one). ``overwrite``: ``given``, or
    the newest default folder, with the earlier job's ``cluster.json`` and ``host<i>.log``
    removed (a job on fewer hosts would leave the others' logs beside its own).

    Raises:
        ValueError: ``given`` holds an earlier job's logs and ``overwrite`` is False.
    """
    if given is None and not overwrite:
        for path in (versioned(DEFAULT_LOG_DIR, v) for v in itertools.count(1)):
            try:
                path.mkdir(parents=True)
            except FileExistsError:
                continue
            return path
    path = given if given is not None else newest_version(DEFAULT_LOG_DIR)
    check_log_dir(path, overwrite)
    if (path / "cluster.json").exists():  # and overwrite: the check let it through
        for old in [path / "cluster.json", *path.glob("host*.log")]:
            old.unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _log_lines(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError:  # the host never started
        return []


def _result_line(log: Path) -> str:
    """The training job's one result line (rank 0's, ``...; written to DIR``), if any."""
    return next((line for line in reversed(_log_lines(log)) if "; written to " in line), "")


def _worker_errors(log_dir: Path, hosts: int, most: int = 5) -> list[str]:
    """The workers' own one-line errors (``error: ...``) in this run's host logs, each once."""
    seen: dict[str, None] = {}
    for i in range(hosts):
        for line in _log_lines(log_dir / f"host{i}.log"):
            if line.startswith("error: "):
                seen.setdefault(line)
    return list(seen)[:most]


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        # Also when SIGINT was inherited as ignored (a background job of a script): a
        # signal sent to this process must stop it and tear the hosts down.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise_on_sigterm)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    cluster: EmulatedCluster | None = None
    cgroups = log_dir = None
    try:
        args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        if args.hosts < 1 or args.procs_per_host < 1:
            parser.error("--hosts and --procs-per-host must be at least 1")
        try:
            links = host_links(args.hosts, args.bandwidth, args.latency, args.loss)
            budgets = budgets_from(args)
        except ValueError as exc:
            parser.error(str(exc))
        require("python -m adaqp.cluster")  # every host's workers would fail alike
        if not args.no_memory_check:
            refused = _memory_refusal(args, budgets, train_args)
            if refused:
                logger.error("%s", refused)
                return 2
        if os.geteuid() != 0:
            logger.error(
                "the emulated cluster needs root (network namespaces and tc); on a real "
                "cluster run launch/train.sh on every host instead"
            )
            return 2
        try:
            check_log_dir(args.log_dir, args.overwrite)
        except ValueError as exc:
            logger.error("%s", exc)
            return 2
        try:
            budgets, cgroups = enforce(budgets, cpus_asked=args.cpus_per_host is not None)
        except CgroupError as exc:
            logger.error("%s", exc)
            return 2
        cluster = EmulatedCluster(
            args.hosts, links[0], links=links, budgets=budgets, cgroups=cgroups
        )
        try:  # only now: a job refused above leaves no folder (nor removes old logs)
            log_dir = log_dir_for(args.log_dir, args.overwrite)
        except ValueError as exc:  # another job wrote its logs there since the check
            logger.error("%s", exc)
            return 2
        logger.info("this job's logs go to %s/ (rank 0's output: host0.log)", log_dir)
        with cluster:
            cluster.launch(args.procs_per_host, train_args, log_dir, args.timeout)
        result = _result_line(log_dir / "host0.log")
        if result:
            print(result, flush=True)
    except ClusterError as exc:
        logger.error("%s", exc)
        for line in _worker_errors(log_dir, args.hosts) if log_dir else []:
            print(line, file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        logger.error("interrupted: cluster torn down")
        return 130
    finally:
        if cluster is not None:
            # Nothing left to do after `with`; a safety net should a signal land between
            # __enter__ returning and the body starting.
            cluster.down()
        if cgroups is not None:
            cgroups.release()  # v2: this process's group as it was (after the host groups)
    return 0
