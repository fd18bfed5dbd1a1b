"""The emulated cluster's lifecycle: ``EmulatedCluster`` builds its hosts, runs torchrun on
every one of them, and tears everything down again.

``up`` records each namespace before making it and joins every host to the switch
(``adaqp.bench.emulate.netns``) over a shaped link (``adaqp.bench.emulate.links``);
``down`` stops the host jobs, kills what is left inside the namespaces and deletes them.
Used as a context manager, SIGINT and SIGTERM wait while teardown runs
(``adaqp.bench.emulate.signals``). ``launch`` writes ``cluster.json`` (``describe``) and
runs ``torchrun -m adaqp.train`` on every host, bounded in time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from adaqp.bench.emulate.links import LinkSpec, shape
from adaqp.bench.emulate.netns import ClusterError, add_bridge, join_to_switch, netns_names, run_ip
from adaqp.bench.emulate.signals import SignalGuard
from adaqp.cores import usable_cores

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
        logger.info("emulated cluster: %d hosts behind one switch", self.hosts)

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
        # Every emulated host runs on this machine's cores: they are shared among all the
        # workers of all hosts, unless the user's OMP_NUM_THREADS says otherwise.
        workers = self.hosts * procs_per_host
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, usable_cores() // workers))
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
