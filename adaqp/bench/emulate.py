"""An emulated multi-host cluster on one machine: real TCP over shaped links.

``python -m adaqp.cluster --hosts H --procs-per-host K --bandwidth 1gbit --latency 0.1ms
-- [adaqp.train flags]`` (root only) builds H network namespaces ("hosts"), each joined to
a switch namespace (a Linux bridge) by a veth pair whose both ends are shaped with ``tc``
(netem for latency and loss, tbf for the rate), then starts on every host::

    torchrun --nnodes H --node-rank i --nproc-per-node K --rdzv-backend c10d \\
             --rdzv-endpoint <host 0>:29400 -m adaqp.train [flags]

with ``GLOO_SOCKET_IFNAME`` set to the host's link: exactly the command a real multi-node
run uses, only the hosts and links are emulated. Hosts may differ: ``--bandwidth``,
``--latency`` and ``--loss`` take one value for every host or a comma-separated list with
exactly one value per host (``--bandwidth 300mbit,300mbit,300mbit,75mbit``). A host's rate
and delay apply to each direction of its link (full duplex); its K workers share that link,
and traffic between them stays on the host. Each job writes ``cluster.json`` (see
``EmulatedCluster.describe``) into its log directory and hands its path to the workers in
``ADAQP_CLUSTER_SPEC``, with the worker's host index in ``ADAQP_CLUSTER_HOST``.

Every namespace and link is removed on success, failure, timeout, Ctrl-C and SIGTERM, also
while the hosts are still being built: a namespace is recorded before it is made, veth
pairs are born inside the namespaces (never in the machine's own), a host job is recorded
in the same step that starts it, and teardown holds SIGINT and SIGTERM until it is done.
Addresses live only inside the namespaces this module creates (``10.213.<n>.0/24``); every
run is bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import IO, Any

logger = logging.getLogger(__name__)

RDZV_PORT = 29400
SPEC_ENV = "ADAQP_CLUSTER_SPEC"
"""Environment variable holding the path of the running job's ``cluster.json``."""
HOST_ENV = "ADAQP_CLUSTER_HOST"
"""Environment variable holding the index of the worker's host in ``cluster.json``."""
_GRACE_S = 10.0
"""After one host fails, how long the others get to fail on their own (their logs then
hold their own error, not a kill)."""
_TEARDOWN_S = 10.0
"""How long teardown keeps killing processes that are still inside the namespaces."""

# tc's units (tc/tc_util.c), matched case-insensitively as tc does; "bps" is bytes/s.
_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_PREFIXES |= {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_RATE_UNITS = {
    prefix + unit: scale * per_unit
    for unit, per_unit in (("bit", 1.0), ("bps", 8.0))
    for prefix, scale in _PREFIXES.items()
}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3}
_TIME_UNITS |= {"us": 1e-6, "usec": 1e-6, "usecs": 1e-6}
_NUMBER_UNIT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([a-z%]*)")


class ClusterError(RuntimeError):
    """The emulated cluster could not be built or its job failed."""


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    # A session of its own: a Ctrl-C at the terminal must not kill a teardown step halfway.
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=30, check=False, start_new_session=True
    )
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def _netns_names() -> list[str]:
    out = _ip("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _quantity(name: str, text: str, units: dict[str, float], example: str) -> float:
    match = _NUMBER_UNIT.fullmatch(text.strip().lower())
    if match is None or match[2] not in units:
        raise ValueError(f"{name}: cannot read {text!r}; expected {example}")
    return float(match[1]) * units[match[2]]


@dataclass
class LinkSpec:
    """Shaping of one host's link, applied to each direction; checked on construction."""

    bandwidth: str = "1gbit"
    """tc rate (e.g. 100mbit, 1gbit); empty for unshaped."""
    latency: str = ""
    """One-way delay added per link end (e.g. 0.1ms); empty for none."""
    loss: str = ""
    """Packet loss (e.g. 0.1%); empty for none."""

    def __post_init__(self) -> None:
        # Read every value once here, so that a typo fails before any namespace exists.
        if self.bandwidth and self.bits_per_s <= 0:
            raise ValueError(f"bandwidth: {self.bandwidth!r} must be above zero")
        _ = self.latency_s
        if not 0.0 <= self.loss_fraction <= 1.0:
            raise ValueError(f"loss: {self.loss!r} must lie between 0% and 100%")

    @property
    def bits_per_s(self) -> float | None:
        """The rate in bit/s, or None for an unshaped link."""
        if not self.bandwidth:
            return None
        return _quantity(
            "bandwidth", self.bandwidth, _RATE_UNITS, "a number and a unit, e.g. 300mbit or 1gbit"
        )

    @property
    def latency_s(self) -> float:
        if not self.latency:
            return 0.0
        return _quantity(
            "latency", self.latency, _TIME_UNITS, "a number and a unit, e.g. 0.1ms or 50us"
        )

    @property
    def loss_fraction(self) -> float:
        if not self.loss:
            return 0.0
        return _quantity("loss", self.loss, {"%": 0.01}, "a percentage, e.g. 0.1%")


def host_links(
    num_hosts: int, bandwidth: str = "1gbit", latency: str = "", loss: str = ""
) -> list[LinkSpec]:
    """One LinkSpec per host from command-line values.

    Each value is one setting for every host or a comma-separated list with exactly one
    setting per host (``"300mbit,300mbit,75mbit"``); an empty item means unshaped / none.

    Raises:
        ValueError: a list whose length is neither 1 nor ``num_hosts``, or a value tc
            would not read.
    """
    columns = []
    for name, text in (("bandwidth", bandwidth), ("latency", latency), ("loss", loss)):
        values = [item.strip() for item in text.split(",")]
        if len(values) == 1:
            values *= num_hosts
        elif len(values) != num_hosts:
            raise ValueError(
                f"{name} has {len(values)} values for {num_hosts} hosts: give one value "
                "for all hosts or exactly one per host"
            )
        columns.append(values)
    return [LinkSpec(b, d, s) for b, d, s in zip(*columns, strict=True)]


class _SignalGuard:
    """While installed (main thread only: Python runs signal handlers there), SIGINT and
    SIGTERM stop the run, except during steps that must not be cut in half.

    A signal runs the handler installed before (Python's Ctrl-C handler raises
    KeyboardInterrupt), or raises KeyboardInterrupt where that handler was the default
    action or "ignore": a background job of a non-interactive shell inherits SIGINT
    ignored, and a Ctrl-C sent to it would otherwise be lost while the hosts stay up.
    A signal that arrives inside ``hold()`` or while a function in ``held_code`` is on
    the interrupted stack is kept and delivered when the hold ends or the guard is
    uninstalled. The stack test also covers the instant between entering a teardown
    function and its first statement, which no flag set by that statement can.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, held_code: tuple[CodeType, ...]) -> None:
        self._held_code = held_code
        self._previous: dict[int, Any] = {}
        self._depth = 0
        self._pending: int | None = None

    def install(self) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        """Restores the previous handlers, then delivers a kept signal to them."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._deliver(previous)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._deliver(self._previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._depth or self._in_held_code(frame):
            self._pending = signum  # no logging here: the interrupted code may hold its lock
            return
        self._pending = None
        _dispatch(self._previous, signum, frame)

    def _in_held_code(self, frame: FrameType | None) -> bool:
        while frame is not None:
            if frame.f_code in self._held_code:
                return True
            frame = frame.f_back
        return False

    def _deliver(self, handlers: dict[int, Any]) -> None:
        if self._pending is not None:
            signum, self._pending = self._pending, None
            _dispatch(handlers, signum, None)


def _dispatch(handlers: dict[int, Any], signum: int, frame: FrameType | None) -> None:
    handler: Callable | Any = handlers.get(signum)
    if callable(handler):
        handler(signum, frame)
    else:
        raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class EmulatedCluster:
    """H hosts in network namespaces behind one bridge; a context manager that tears down.

    Args:
        hosts: number of hosts H.
        link: shaping of every host's link, in both directions, unless ``links`` is given.
        tag: unique suffix for namespace and link names (default: this process id).
        links: one LinkSpec per host (heterogeneous hosts); after construction it always
            holds H specs, copies of ``link`` when it was not given.
    """

    hosts: int
    link: LinkSpec = field(default_factory=LinkSpec)
    tag: str = ""
    namespaces: list[str] = field(default_factory=list)
    links: list[LinkSpec] = field(default_factory=list)
    _jobs: list[tuple[subprocess.Popen, IO[str]]] = field(
        default_factory=list, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {self.hosts}")
        if not self.links:
            self.links = [dataclasses.replace(self.link) for _ in range(self.hosts)]
        elif len(self.links) != self.hosts:
            raise ValueError(f"links: {len(self.links)} specs for {self.hosts} hosts")
        self.tag = self.tag or str(os.getpid() % 100000)
        self.subnet = f"10.213.{int(self.tag) % 250}"
        held = (EmulatedCluster.__exit__.__code__, EmulatedCluster.down.__code__)
        self._guard = _SignalGuard(held)

    @property
    def switch(self) -> str:
        return f"aq{self.tag}-sw"

    def host_ns(self, i: int) -> str:
        return f"aq{self.tag}-h{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def __enter__(self) -> EmulatedCluster:
        self._guard.install()
        try:
            self.up()
        except BaseException:
            try:
                self.down()
            finally:
                self._guard.uninstall()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._guard.uninstall()

    def _add_namespace(self, ns: str) -> None:
        # Recorded first: an interrupt while `ip netns add` runs must still remove it.
        self.namespaces.append(ns)
        _ip("ip", "netns", "add", ns)

    def up(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError("the emulated cluster needs root (network namespaces and tc)")
        taken = [ns for ns in _netns_names() if ns.startswith(f"aq{self.tag}-")]
        if taken:
            raise ClusterError(
                f"namespaces {taken} exist already: another cluster with tag {self.tag} is "
                "running, or one was killed; remove them with `ip netns del NAME`"
            )
        self._add_namespace(self.switch)
        _ip("ip", "link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("ip", "link", "set", "br0", "up", ns=self.switch)
        for i, spec in enumerate(self.links):
            ns, switch_end = self.host_ns(i), f"aq{self.tag}s{i}"
            self._add_namespace(ns)
            # Made inside the switch with its peer placed in the host in one request: no
            # link ever exists in the machine's own namespace, where teardown would miss it.
            _ip(
                *("ip", "link", "add", switch_end, "type", "veth"),
                *("peer", "name", "eth0", "netns", ns),
                ns=self.switch,
            )
            _ip("ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=ns)
            for dev in ("lo", "eth0"):
                _ip("ip", "link", "set", dev, "up", ns=ns)
            _ip("ip", "link", "set", switch_end, "master", "br0", ns=self.switch)
            _ip("ip", "link", "set", switch_end, "up", ns=self.switch)
            self._shape(ns, "eth0", spec)  # host -> switch
            self._shape(self.switch, switch_end, spec)  # switch -> host
            logger.info(
                "host %d at %s: %s, latency %s, loss %s",
                i,
                self.address(i),
                spec.bandwidth or "unshaped",
                spec.latency or "0",
                spec.loss or "0",
            )
        logger.info("emulated cluster: %d hosts behind one switch", self.hosts)

    @staticmethod
    def _shape(ns: str, dev: str, spec: LinkSpec) -> None:
        parent = ["root"]
        if spec.latency or spec.loss:
            netem = ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem"]
            if spec.latency:
                netem += ["delay", spec.latency]
            if spec.loss:
                netem += ["loss", spec.loss]
            try:
                _ip(*netem, ns=ns)
            except ClusterError as exc:
                raise ClusterError(
                    f"{exc}; latency and loss need the kernel's netem qdisc (sch_netem), "
                    "which this machine lacks: shape bandwidth only"
                ) from None
            parent = ["parent", "1:"]
        if spec.bandwidth:
            _ip(
                *("tc", "qdisc", "add", "dev", dev, *parent, "handle", "2:", "tbf"),
                *("rate", spec.bandwidth, "burst", "256kb", "latency", "400ms"),
                ns=ns,
            )

    def down(self) -> None:
        """Stops every job and deletes every namespace this cluster made (their links go
        with them). Idempotent; inside ``with``, signals wait until it is done."""
        self._stop_jobs()
        if not self.namespaces:
            return
        # Processes still inside would keep a namespace's network alive after its name is
        # gone; one may be forking while we look, so look again until none is left.
        deadline = time.monotonic() + _TEARDOWN_S
        while self.namespaces and time.monotonic() < deadline:
            pids = []
            for ns in self.namespaces:
                pids += _ip("ip", "netns", "pids", ns, check=False).stdout.split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.05)
        for ns in reversed(self.namespaces):
            _ip("ip", "netns", "del", ns, check=False)
        left = sorted(set(self.namespaces) & set(_netns_names()))
        if left:
            logger.error("could not delete namespaces %s; remove them with ip netns del", left)
        self.namespaces = []

    def _stop_jobs(self) -> None:
        """Kills the host jobs still running (torchrun and its workers) and reaps them."""
        while self._jobs:
            proc, log = self._jobs[-1]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    logger.error("host job %d survived SIGKILL for 10s", proc.pid)
            log.close()
            self._jobs.pop()

    def describe(self, procs_per_host: int = 1) -> dict[str, Any]:
        """The cluster as plain data, written as ``cluster.json`` by ``launch``::

            {"version": 1, "num_hosts": H, "procs_per_host": K, "world_size": H * K,
             "rendezvous": "10.213.n.1:29400",
             "hosts": [{"host": 0, "namespace": "aq<tag>-h0", "address": "10.213.n.1",
                        "interface": "eth0", "procs": K, "bandwidth": "300mbit",
                        "bandwidth_bits_per_s": 3e8, "latency": "0.1ms", "latency_s": 1e-4,
                        "loss": "", "loss_fraction": 0.0}, ...]}

        Rate and delay apply to each direction of a host's link; ``bandwidth_bits_per_s``
        is null for an unshaped link. torchrun's rendezvous decides which ranks land on
        which host: a worker finds its own host's entry through ``ADAQP_CLUSTER_HOST``.
        """
        hosts = [
            {
                "host": i,
                "namespace": self.host_ns(i),
                "address": self.address(i),
                "interface": "eth0",
                "procs": procs_per_host,
                "bandwidth": spec.bandwidth,
                "bandwidth_bits_per_s": spec.bits_per_s,
                "latency": spec.latency,
                "latency_s": spec.latency_s,
                "loss": spec.loss,
                "loss_fraction": spec.loss_fraction,
            }
            for i, spec in enumerate(self.links)
        ]
        return {
            "version": 1,
            "num_hosts": self.hosts,
            "procs_per_host": procs_per_host,
            "world_size": self.hosts * procs_per_host,
            "rendezvous": f"{self.address(0)}:{RDZV_PORT}",
            "hosts": hosts,
        }

    def launch(
        self, procs_per_host: int, train_args: list[str], log_dir: Path, timeout_s: float
    ) -> list[int]:
        """Runs the torchrun job on every host; returns the exit codes (host order).

        Writes ``log_dir/cluster.json`` (``describe``) and ``log_dir/host<i>.log``.

        Raises:
            ClusterError: a host's job failed or the whole job ran past ``timeout_s``.
        """
        if procs_per_host < 1:
            raise ValueError(f"procs_per_host must be at least 1, got {procs_per_host}")
        log_dir.mkdir(parents=True, exist_ok=True)
        spec_path = (log_dir / "cluster.json").resolve()
        tmp = spec_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.describe(procs_per_host), indent=2) + "\n")
        tmp.replace(spec_path)
        try:
            for i in range(self.hosts):
                self._start_host(i, procs_per_host, train_args, log_dir, spec_path)
            return self._wait(log_dir, timeout_s)
        finally:
            with self._guard.hold():
                self._stop_jobs()

    def _start_host(
        self, i: int, procs_per_host: int, train_args: list[str], log_dir: Path, spec: Path
    ) -> None:
        cmd = [
            *("ip", "netns", "exec", self.host_ns(i), "env", "GLOO_SOCKET_IFNAME=eth0"),
            *("OMP_NUM_THREADS=1", f"{SPEC_ENV}={spec}", f"{HOST_ENV}={i}"),
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=5",  # workers stop within a second of SIGTERM
            *(sys.executable, "-m", "torch.distributed.run"),
            *("--nnodes", str(self.hosts), "--node-rank", str(i)),
            *("--nproc-per-node", str(procs_per_host), "--rdzv-backend", "c10d"),
            *("--rdzv-endpoint", f"{self.address(0)}:{RDZV_PORT}", "--rdzv-id", f"aq{self.tag}"),
            *("--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", self.address(i)),
            *("-m", "adaqp.train", *train_args),
        ]
        # Started and recorded in one held step: a signal in between would leave a job that
        # no teardown knows of (it may not have entered its namespace yet).
        with self._guard.hold():
            log = open(log_dir / f"host{i}.log", "w")  # noqa: SIM115 - closed by _stop_jobs
            try:
                proc = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            except BaseException:
                log.close()
                raise
            self._jobs.append((proc, log))

    def _wait(self, log_dir: Path, timeout_s: float) -> list[int]:
        """Polls every host until all succeed, one fails (the others then get a short
        grace to fail on their own) or the time runs out."""
        deadline = time.monotonic() + timeout_s
        failed_at = None
        while True:
            codes = [proc.poll() for proc, _ in self._jobs]
            failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
            if failed and failed_at is None:
                failed_at = time.monotonic()
            if all(code is not None for code in codes) or (
                failed_at is not None and time.monotonic() > failed_at + _GRACE_S
            ):
                if not failed:
                    return [int(code) for code in codes if code is not None]
                first = failed[0]
                others = ", ".join(f"host {i}: {codes[i]}" for i in failed[1:])
                raise ClusterError(
                    f"host {first} exited with {codes[first]}"
                    + (f" ({others})" if others else "")
                    + f"; see {log_dir}/host{first}.log"
                )
            if time.monotonic() > deadline:
                raise ClusterError(f"the job ran past {timeout_s:.0f}s; stopped")
            time.sleep(0.1)


def _raise_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        # Also when SIGINT was inherited as ignored (a background job of a script): a
        # signal sent to this process must stop it and tear the hosts down.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise_on_sigterm)
    parser = argparse.ArgumentParser(
        prog="python -m adaqp.cluster",
        description="Run adaqp.train across emulated hosts joined by shaped links (root).",
        epilog="Everything after -- goes to adaqp.train unchanged. --bandwidth, --latency "
        "and --loss take one value for all hosts or a comma-separated list with exactly "
        "one per host.",
    )
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--procs-per-host", type=int, default=1, help="workers per host")
    parser.add_argument(
        "--bandwidth", default="1gbit", help="tc rate per link, e.g. 100mbit or 1gbit,1gbit,100mbit"
    )
    parser.add_argument("--latency", default="", help="added one-way delay, e.g. 0.1ms")
    parser.add_argument("--loss", default="", help="packet loss, e.g. 0.1%%")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the whole job")
    parser.add_argument("--log-dir", type=Path, default=Path("results/runs/cluster-logs"))
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    cluster: EmulatedCluster | None = None
    try:
        args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        if args.hosts < 1 or args.procs_per_host < 1:
            parser.error("--hosts and --procs-per-host must be at least 1")
        try:
            links = host_links(args.hosts, args.bandwidth, args.latency, args.loss)
        except ValueError as exc:
            parser.error(str(exc))
        if os.geteuid() != 0:
            logger.error(
                "the emulated cluster needs root (network namespaces and tc); on a real "
                "cluster run launch/train.sh on every host instead"
            )
            return 2
        cluster = EmulatedCluster(args.hosts, links[0], links=links)
        with cluster:
            cluster.launch(args.procs_per_host, train_args, args.log_dir, args.timeout)
    except ClusterError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        logger.error("interrupted: cluster torn down")
        return 130
    finally:
        if cluster is not None:
            # Nothing left to do after `with`; a safety net should a signal land between
            # __enter__ returning and the body starting.
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
