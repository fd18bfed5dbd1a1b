"""Runs torchrun as a child: the environment it gets, Ctrl-C, the exit code."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from adaqp.cli.deps import refusal
from adaqp.cli.handoff import COMMAND_ENV, STATUS_DIR_ENV
from adaqp.launcher.args import Launch
from adaqp.launcher.output import (
    OutputFilter,
    Stream,
    copy_size,
    describe,
    exit_code,
    read_codes,
    stderr_pipe,
)
from adaqp.process.cores import usable_cores

STOP_GRACE_S = 30.0
"""After Ctrl-C, how long torchrun and the workers get to stop before they are killed."""


CHECK_TIMEOUT_S = 120.0
"""Bound on ``adaqp.train --check`` (it reads the config and the output and partition
directories' files; it loads no torch)."""


def refused(spec: Launch) -> str | None:
    """What ``adaqp.train --check`` refuses in the train flags, the config, the output
    directory or the partition directory, as one line without its ``error:``, or None.
    Asked before torchrun starts: the workers would say the same after torch has loaded
    on each of them. Where the check itself cannot run or
    fails otherwise, None: the workers judge, as they always do."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "ADAQP_LAUNCH_SCRIPT")}
    env["WORLD_SIZE"] = str(spec.nproc * spec.nnodes)  # the partition must have that many
    try:
        proc = subprocess.run(
            spec.check(),
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if proc.returncode != 2 or not lines:
        return None
    last = lines[-1]
    for prefix in ("adaqp.train: error: ", "error: "):  # argparse's, then the config's
        if last.startswith(prefix):
            return last[len(prefix) :]
    return None


def memory_refused(spec: Launch) -> str | None:
    """One line refusing the launch if this host's workers are predicted to need more
    than a run may take of the host's memory (``HostLimit.refuses``: a share of the
    smallest of its cgroup limits and the machine's), else None. The
    prediction runs as a child (``python -m adaqp.memory --json``); where it cannot be
    made, None: the workers judge."""
    from adaqp.memory.limits import host_limit, over_limit, train_overrides

    limit = host_limit()
    if limit is None:
        return None
    world = spec.nproc * spec.nnodes
    command = [sys.executable, "-m", "adaqp.memory", "--config", spec.config]
    command += ["--nproc", str(world), "--nproc-per-host", str(spec.nproc), "--json"]
    for override in train_overrides(spec.train_args):
        command += ["--set", override]
    try:
        proc = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
        peaks = (
            json.loads(proc.stdout)["peak_memory_bytes_per_worker"]
            if proc.returncode == 0
            else None
        )
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None
    if not peaks:
        return None
    mine = peaks[spec.node_rank * spec.nproc : (spec.node_rank + 1) * spec.nproc]
    if not limit.refuses(sum(mine)):
        return None
    return over_limit("this host", sum(mine), max(mine), len(mine), limit, spec.config, world)


def _kill_tree(pid: int) -> None:
    """SIGKILL to ``pid``'s process group and every descendant (the workers have their own
    sessions)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    for target in found:
        with contextlib.suppress(OSError):
            os.kill(target, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def _silent_failure(filter_: OutputFilter, codes: dict[int, int], torchrun_code: int) -> str:
    """What went wrong, where no rank said so in an ``error:`` line (it crashed, was killed,
    or was stopped before it could print)."""
    # The first rank that failed on its own: torchrun's root cause, else a written code.
    ended = [pair for pair in filter_.failures if pair[1] not in (130, -signal.SIGTERM)]
    ended += sorted((rank, code) for rank, code in codes.items() if code not in (0, 130))
    if not ended:
        return f"torchrun ended with {describe(torchrun_code)}; --debug shows all its output"
    rank, code = ended[0]
    if filter_.tracebacks:
        return f"rank {rank} failed with {describe(code)} (its traceback is above)"
    why = " (killed? out of memory?)" if code < 0 else ""
    return f"rank {rank} ended with {describe(code)} without a message{why}; --debug shows more"


def ended_by_signal(failures: list[tuple[int, int]]) -> str | None:
    """How the first rank that torchrun's report shows ended by a signal the launcher did
    not send ended (``rank 0 was killed (SIGKILL), likely out of memory``), or None.
    SIGKILL is what the kernel's out-of-memory killer sends, but not only it: "likely"."""
    for rank, code in failures:
        if code >= 0 or -code in (signal.SIGTERM, signal.SIGINT):  # torchrun's own stop
            continue
        if -code == signal.SIGKILL:
            return f"rank {rank} was killed (SIGKILL), likely out of memory"
        return f"rank {rank} was ended by {describe(code)}"
    return None


def record_end(
    status_dir: Path, failures: list[tuple[int, int]], torchrun_code: int, stopped: bool
) -> Path | None:
    """Where rank 0 ended before it could record how its run ended, says so in the run's
    ``status.json`` (``adaqp.run.rundir.record_lost_end``): "interrupted" after a stop
    (``stopped``), else "failed", naming the signal that ended a rank where torchrun's
    report (``failures``) shows one. Returns the run's directory where it changed it."""
    from adaqp.run.rundir import record_lost_end  # the standard library only, and small

    if stopped:
        why = "interrupted; rank 0 ended before it could record it"
        return record_lost_end(status_dir, "interrupted", why)
    killed = ended_by_signal(failures)
    if killed is None:
        why = f"rank 0 ended without recording how (torchrun: {describe(torchrun_code)})"
        return record_lost_end(status_dir, "failed", why)
    # A rank stopped by torchrun after another was killed was not interrupted by the user.
    return record_lost_end(status_dir, "failed", killed, replaces=("running", "interrupted"))


def worker_threads(nproc: int) -> int:
    """Threads per worker where the user set none: this host's usable cores shared among
    its ``nproc`` workers (what ``adaqp.runtime.thread_count`` chooses)."""
    return max(1, usable_cores() // nproc)


def launch(spec: Launch, command: str) -> int:
    """Runs torchrun for ``spec``; returns the exit code."""
    if (lacking := refusal()) is not None:  # each worker would fail on it, after torchrun
        print(f"error: {lacking}", file=sys.stderr)
        return 2
    status_dir = Path(tempfile.mkdtemp(prefix="adaqp-status-"))
    env = dict(os.environ)
    env.pop("ADAQP_LAUNCH_SCRIPT", None)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5")
    if not env.get("OMP_NUM_THREADS"):
        # torchrun, finding it unset, sets 1 for several workers and says so in a four-line
        # banner on every run; the launcher sets the workers' share itself (comm.threads
        # still wins over it).
        env["OMP_NUM_THREADS"] = str(worker_threads(spec.nproc))
    env.update({STATUS_DIR_ENV: str(status_dir), COMMAND_ENV: command})
    stopping: list[float] = []  # when the first stop signal came
    proc: subprocess.Popen | None = None
    stream: Stream | None = None

    def on_signal(signum: int, frame: object) -> None:
        if stopping:
            return
        stopping.append(time.monotonic())
        below = "\n" if stream is not None and stream.mid_line else ""
        print(f"{below}stopping the workers (at most {STOP_GRACE_S:.0f} s)...", file=sys.stderr)
        if proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGINT)

    def on_resize(signum: int, frame: object) -> None:
        if stream is not None and stream.is_alive():  # its terminal is still open
            copy_size(stream.fd)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    filter_ = OutputFilter()
    try:
        hosts = "1 host" if spec.nnodes == 1 else f"host {spec.node_rank} of {spec.nnodes}"
        print(
            f"starting {spec.nproc} worker{'s' * (spec.nproc > 1)} on {hosts}: {spec.config} "
            "(first output may take 10-30 s while torch loads)",
            file=sys.stderr,
            flush=True,
        )
        if spec.nnodes > 1:
            print(
                f"waiting for all {spec.nnodes} hosts at {spec.master_addr}:{spec.master_port} "
                f"(rendezvous {spec.rdzv_id}): run the same command on each, with its "
                "own --node-rank",
                file=sys.stderr,
                flush=True,
            )
        if spec.debug:
            print(shlex.join(spec.torchrun()), file=sys.stderr, flush=True)
        if stopping:
            return 130
        read_end, write_end = (None, None) if spec.debug else stderr_pipe()
        proc = subprocess.Popen(
            spec.torchrun(), env=env, stdin=subprocess.DEVNULL, stderr=write_end, process_group=0
        )
        if write_end is not None:
            os.close(write_end)
            stream = Stream(read_end, filter_)
            stream.start()
            if os.isatty(read_end):  # the workers' terminal follows ours when it is resized
                previous[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, on_resize)
        if stopping:  # a signal between the start and here
            os.killpg(proc.pid, signal.SIGINT)
        while True:
            try:
                torchrun_code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > STOP_GRACE_S:
                    print("the workers did not stop in time: killing them", file=sys.stderr)
                    _kill_tree(proc.pid)
                    stopping[0] = float("inf")  # once
        if stream is not None:
            stream.join(timeout=10)
            os.close(read_end)
        codes = read_codes(status_dir)
        written = dict(codes)
        for rank, code in filter_.failures:  # ranks that ended without writing a code
            codes.setdefault(rank, code if code > 0 else 1)
        result = exit_code(codes, torchrun_code, bool(stopping))
        if result != 0:
            record_end(status_dir, filter_.failures, torchrun_code, bool(stopping))
        leftovers = filter_.leftovers()
        for line in leftovers:
            sys.stderr.write(line)
        if result in (1, 2) and not (stopping or spec.debug or filter_.errors or leftovers):
            print(f"error: {_silent_failure(filter_, written, torchrun_code)}", file=sys.stderr)
        return result
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(status_dir, ignore_errors=True)
