"""The emulated cluster's lifecycle: ``EmulatedCluster`` builds its hosts, runs torchrun on
every one of them, and tears everything down again.

``up`` records each namespace before making it and joins every host to the switch
(``adaqp.emulate.netns``) over a shaped link (``adaqp.emulate.links``);
``down`` stops the host jobs, kills what is left inside the namespaces and deletes them.
Used as a context manager, SIGINT and SIGTERM wait while teardown runs
(``adaqp.emulate.signals``). ``launch`` writes ``cluster.json`` (``describe``) and
runs ``torchrun -m adaqp.train`` on every host, bounded in time; each host's processes run
in a control group of its own (``adaqp.emulate.cgroups``) that holds its CPU and
memory budget and measures what it used, made for the job and removed after it (and by
``down``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from adaqp.emulate.cgroups import Budget, CgroupTree, HostGroup, Usage
from adaqp.emulate.links import LinkSpec, shape
from adaqp.emulate.netns import ClusterError, add_bridge, join_to_switch, netns_names, run_ip
from adaqp.emulate.signals import SignalGuard
from adaqp.process.cores import usable_cores

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


@dataclass
class EmulatedCluster:
    """H hosts in network namespaces behind one bridge; a context manager that tears down.

    Args:
        hosts: number of hosts H.
        link: shaping of every host's link, in both directions, unless ``links`` is given.
        tag: unique suffix for namespace and link names (default: this process id).
        links: one LinkSpec per host (heterogeneous hosts); after construction it always
            holds H specs, copies of ``link`` when it was not given.
        budgets: one Budget per host (CPU quota, memory limit); default: unlimited.
        cgroups: where the hosts' control groups go (``cgroups.find_cgroups()``); None
            runs the hosts without groups, unmeasured, and then allows no budget.
    """

    hosts: int
    link: LinkSpec = field(default_factory=LinkSpec)
    tag: str = ""
    namespaces: list[str] = field(default_factory=list)
    links: list[LinkSpec] = field(default_factory=list)
    budgets: list[Budget] = field(default_factory=list)
    cgroups: CgroupTree | None = None
    _groups: list[HostGroup] = field(default_factory=list, init=False, repr=False)
    _jobs: list[tuple[subprocess.Popen, IO[str]]] = field(
        default_factory=list, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {self.hosts}")
        if not self.links:
            self.links = [dataclasses.replace(self.link) for _ in range(self.hosts)]
        elif len(self.links) != self.hosts:
            raise ValueError(
                f"links: {len(self.links)} specs for {self.hosts} host{'s' * (self.hosts != 1)}"
            )
        self.budgets = self.budgets or [Budget() for _ in range(self.hosts)]
        if len(self.budgets) != self.hosts:
            raise ValueError(
                f"budgets: {len(self.budgets)} for {self.hosts} host{'s' * (self.hosts != 1)}"
            )
        if self.cgroups is None and any(b.limited for b in self.budgets):
            raise ValueError("budgets need control groups (cgroups)")
        self.tag = self.tag or str(os.getpid() % 100000)
        self.subnet = f"10.213.{int(self.tag) % 250}"
        held = (
            EmulatedCluster.__exit__.__code__,
            EmulatedCluster.down.__code__,
            EmulatedCluster._remove_groups.__code__,
        )
        self._guard = SignalGuard(held)

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
        run_ip("ip", "netns", "add", ns)

    def up(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError("the emulated cluster needs root (network namespaces and tc)")
        taken = [ns for ns in netns_names() if ns.startswith(f"aq{self.tag}-")]
        if taken:
            raise ClusterError(
                f"namespaces {taken} exist already: another cluster with tag {self.tag} is "
                "running, or one was killed; remove them with `ip netns del NAME`"
            )
        self._add_namespace(self.switch)
        add_bridge(self.switch)
        for i, spec in enumerate(self.links):
            ns, switch_end = self.host_ns(i), f"aq{self.tag}s{i}"
            self._add_namespace(ns)
            join_to_switch(self.switch, ns, switch_end, self.address(i))
            shape(ns, "eth0", spec)  # host -> switch
            shape(self.switch, switch_end, spec)  # switch -> host
            logger.info(
                "host %d at %s: %s, latency %s, loss %s",
                i,
                self.address(i),
                spec.bandwidth or "unshaped",
                spec.latency or "0",
                spec.loss or "0",
            )
        logger.info(
            "emulated cluster: %d host%s behind one switch", self.hosts, "s" * (self.hosts != 1)
        )

    def down(self) -> None:
        """Stops every job, removes the hosts' control groups and deletes every namespace
        this cluster made (their links go with them). Idempotent; inside ``with``, signals
        wait until it is done."""
        self._stop_jobs()
        self._remove_groups()
        if not self.namespaces:
            return
        # Processes still inside would keep a namespace's network alive after its name is
        # gone; one may be forking while we look, so look again until none is left.
        deadline = time.monotonic() + _TEARDOWN_S
        while self.namespaces and time.monotonic() < deadline:
            pids = []
            for ns in self.namespaces:
                pids += run_ip("ip", "netns", "pids", ns, check=False).stdout.split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.05)
        for ns in reversed(self.namespaces):
            run_ip("ip", "netns", "del", ns, check=False)
        left = sorted(set(self.namespaces) & set(netns_names()))
        if left:
            logger.error("could not delete namespaces %s; remove them with ip netns del", left)
        self.namespaces = []

    def _stop_jobs(self) -> None:
        """Kills every process of every host and reaps the host jobs: each host's group
        whole first (torchrun starts its workers in sessions of their own, out of reach of
        its process group), then torchrun's group (the hosts without groups)."""
        for group in self._groups:
            group.kill(_TEARDOWN_S)
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

    def _remove_groups(self) -> None:
        """Kills what is left in the hosts' control groups and removes them (bounded)."""
        while self._groups:
            self._groups[-1].remove(_TEARDOWN_S)
            self._groups.pop()

    def describe(
        self,
        procs_per_host: int = 1,
        usage: list[Usage | None] | None = None,
        elapsed_s: float | None = None,
    ) -> dict[str, Any]:
        """The cluster as plain data, written as ``cluster.json`` by ``launch``::

            {"version": 1, "num_hosts": H, "procs_per_host": K, "world_size": H * K,
             "rendezvous": "10.213.n.1:29400", "elapsed_s": 41.2,
             "hosts": [{"host": 0, "namespace": "aq<tag>-h0", "address": "10.213.n.1",
                        "interface": "eth0", "procs": K, "bandwidth": "300mbit",
                        "bandwidth_bits_per_s": 3e8, "latency": "0.1ms", "latency_s": 1e-4,
                        "loss": "", "loss_fraction": 0.0,
                        "cpus": 0.5, "memory_limit_bytes": null,
                        "cpu_seconds": 19.8, "peak_memory_bytes": 612368384,
                        "oom_kills": 0}, ...]}

        Rate and delay apply to each direction of a host's link; ``bandwidth_bits_per_s``
        is null for an unshaped link. ``cpus`` (a CPU quota in cores) and
        ``memory_limit_bytes`` are the host's budget, null where unlimited.
        ``cpu_seconds``, ``peak_memory_bytes`` and ``oom_kills`` are what the host's
        control group used (all its processes together; the peak counts page cache as
        the kernel charges it) and ``elapsed_s`` the job's wall time: null until the job
        has ended, and where the hosts ran without groups. torchrun's rendezvous decides
        which ranks land on which host: a worker finds its own host's entry through
        ``ADAQP_CLUSTER_HOST``.
        """
        usage = usage or [None] * self.hosts
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
                "cpus": budget.cpus,
                "memory_limit_bytes": budget.memory_bytes,
                "cpu_seconds": used.cpu_seconds if used else None,
                "peak_memory_bytes": used.peak_memory_bytes if used else None,
                "oom_kills": used.oom_kills if used else None,
            }
            for i, (spec, budget, used) in enumerate(
                zip(self.links, self.budgets, usage, strict=True)
            )
        ]
        return {
            "version": 1,
            "num_hosts": self.hosts,
            "procs_per_host": procs_per_host,
            "world_size": self.hosts * procs_per_host,
            "rendezvous": f"{self.address(0)}:{RDZV_PORT}",
            "elapsed_s": elapsed_s,
            "hosts": hosts,
        }

    def launch(
        self, procs_per_host: int, train_args: list[str], log_dir: Path, timeout_s: float
    ) -> list[int]:
        """Runs the torchrun job on every host, each inside its own control group; returns
        the exit codes (host order).

        Writes ``log_dir/cluster.json`` (``describe``) before the job and again, with what
        each host used and the job's wall time, after it (also when it failed), and
        ``log_dir/host<i>.log``.

        Raises:
            ClusterError: a host's job failed, a host ran out of memory (the message names
                the host, its limit and its peak) or the whole job ran past ``timeout_s``.
        """
        if procs_per_host < 1:
            raise ValueError(f"procs_per_host must be at least 1, got {procs_per_host}")
        log_dir.mkdir(parents=True, exist_ok=True)
        spec_path = (log_dir / "cluster.json").resolve()
        _write_json(spec_path, self.describe(procs_per_host))
        started = time.monotonic()
        try:
            self._make_groups()
            for i in range(self.hosts):
                self._start_host(i, procs_per_host, train_args, log_dir, spec_path)
            return self._wait(log_dir, timeout_s)
        finally:
            elapsed = time.monotonic() - started
            with self._guard.hold():
                self._stop_jobs()
                # Read once every process of every host is gone: the counters are then final.
                usage: list[Usage | None] | None = [g.usage() for g in self._groups]
                self._remove_groups()
                if len(usage) != self.hosts:  # no groups, or not all of them were made
                    usage = None
                _write_json(spec_path, self.describe(procs_per_host, usage, elapsed))

    def _make_groups(self) -> None:
        if self.cgroups is None:
            return
        for i, budget in enumerate(self.budgets):
            group = self.cgroups.group(f"aq{self.tag}-h{i}")
            with self._guard.hold():  # recorded in the step that makes it
                self._groups.append(group)
                group.create(budget)

    def threads(self, i: int, procs_per_host: int) -> int:
        """Default intra-op threads of host ``i``'s workers: its CPU budget shared among
        them, rounded up; unbudgeted, the machine's cores shared among all workers."""
        cpus = self.budgets[i].cpus
        if cpus:
            return max(1, math.ceil(cpus / procs_per_host))
        return max(1, usable_cores() // (self.hosts * procs_per_host))

    def _start_host(
        self, i: int, procs_per_host: int, train_args: list[str], log_dir: Path, spec: Path
    ) -> None:
        # Every emulated host runs on this machine's cores; the user's OMP_NUM_THREADS,
        # where set, wins over the host's share of them.
        threads = os.environ.get("OMP_NUM_THREADS") or str(self.threads(i, procs_per_host))
        cmd = [
            *("ip", "netns", "exec", self.host_ns(i), "env", "GLOO_SOCKET_IFNAME=eth0"),
            *(f"OMP_NUM_THREADS={threads}", f"{SPEC_ENV}={spec}", f"{HOST_ENV}={i}"),
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=5",  # workers stop within a second of SIGTERM
            *(sys.executable, "-m", "torch.distributed.run"),
            *("--nnodes", str(self.hosts), "--node-rank", str(i)),
            *("--nproc-per-node", str(procs_per_host), "--rdzv-backend", "c10d"),
            *("--rdzv-endpoint", f"{self.address(0)}:{RDZV_PORT}", "--rdzv-id", f"aq{self.tag}"),
            *("--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", self.address(i)),
            *("-m", "adaqp.train", *train_args),
        ]
        if self._groups:
            cmd = self._groups[i].wrap(cmd)
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

    def _out_of_memory(self) -> str | None:
        """The one-line report of a host that ran out of memory: by the kernel's own count,
        its OOM killer killed one of the group's processes for the group's limit. A peak
        near the limit proves nothing: page cache fills any limit."""
        for i, group in enumerate(self._groups):
            limit = self.budgets[i].memory_bytes
            if not limit:
                continue
            used = group.usage()
            peak = used.peak_memory_bytes or 0
            if used.oom_kills:
                return (
                    f"host {i} ran out of memory: limit {_mib(limit)}, peak {_mib(peak)} "
                    f"(the kernel killed {used.oom_kills} of its processes); raise "
                    "--memory-per-host"
                )
        return None

    def _wait(self, log_dir: Path, timeout_s: float) -> list[int]:
        """Polls every host until all succeed, one runs out of memory (the job stops at
        once), one fails (the others then get a short grace to fail on their own) or the
        time runs out."""
        deadline = time.monotonic() + timeout_s
        failed_at = None
        while True:
            codes = [proc.poll() for proc, _ in self._jobs]
            oom = self._out_of_memory()
            if oom:
                raise ClusterError(f"{oom}; see {log_dir}/host<i>.log")
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


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.0f} MiB"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
