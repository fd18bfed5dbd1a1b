"""An emulated multi-host cluster on one machine: real TCP over shaped links.

``python -m adaqp.cluster --hosts H --procs-per-host K --bandwidth 1gbit --latency 0.1ms
-- [adaqp.train flags]`` (root only) builds H network namespaces ("hosts"), each joined to
a switch namespace (a Linux bridge) by a veth pair whose both ends are shaped with ``tc``
(netem for latency and loss, tbf for the rate), then starts on every host::

    torchrun --nnodes H --node-rank i --nproc-per-node K --rdzv-backend c10d \\
             --rdzv-endpoint <host 0>:29400 -m adaqp.train [flags]

with ``GLOO_SOCKET_IFNAME`` set to the host's link: exactly the command a real multi-node
run uses, only the hosts and links are emulated. Every namespace and link is removed on
success, failure, timeout, Ctrl-C and SIGTERM. Addresses live only inside the namespaces
this module creates (``10.213.<n>.0/24``); every run is bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

RDZV_PORT = 29400


class ClusterError(RuntimeError):
    """The emulated cluster could not be built or its job failed."""


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


@dataclass
class LinkSpec:
    bandwidth: str = "1gbit"
    """tc rate (e.g. 100mbit, 1gbit); empty for unshaped."""
    latency: str = ""
    """One-way delay added per link end (e.g. 0.1ms); empty for none."""
    loss: str = ""
    """Packet loss (e.g. 0.1%); empty for none."""


@dataclass
class EmulatedCluster:
    """H hosts in network namespaces behind one bridge; a context manager that tears down.

    Args:
        hosts: number of hosts H.
        link: shaping applied to every host link, in both directions.
        tag: unique suffix for namespace and link names (default: this process id).
    """

    hosts: int
    link: LinkSpec = field(default_factory=LinkSpec)
    tag: str = ""
    namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {self.hosts}")
        self.tag = self.tag or str(os.getpid() % 100000)
        self.subnet = f"10.213.{int(self.tag) % 250}"

    @property
    def switch(self) -> str:
        return f"aq{self.tag}-sw"

    def host_ns(self, i: int) -> str:
        return f"aq{self.tag}-h{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def __enter__(self) -> EmulatedCluster:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError("the emulated cluster needs root (network namespaces and tc)")
        _ip("ip", "netns", "add", self.switch)
        self.namespaces.append(self.switch)
        _ip("ip", "link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("ip", "link", "set", "br0", "up", ns=self.switch)
        for i in range(self.hosts):
            ns = self.host_ns(i)
            _ip("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            host_end, switch_end = f"aq{self.tag}h{i}", f"aq{self.tag}s{i}"
            _ip("ip", "link", "add", host_end, "type", "veth", "peer", "name", switch_end)
            _ip("ip", "link", "set", host_end, "netns", ns)
            _ip("ip", "link", "set", switch_end, "netns", self.switch)
            _ip("ip", "link", "set", host_end, "name", "eth0", ns=ns)
            _ip("ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=ns)
            for dev in ("lo", "eth0"):
                _ip("ip", "link", "set", dev, "up", ns=ns)
            _ip("ip", "link", "set", switch_end, "master", "br0", ns=self.switch)
            _ip("ip", "link", "set", switch_end, "up", ns=self.switch)
            self._shape(ns, "eth0")  # host -> switch
            self._shape(self.switch, switch_end)  # switch -> host
        logger.info(
            "emulated cluster: %d hosts %s..%s, links %s latency %s loss %s",
            self.hosts,
            self.address(0),
            self.address(self.hosts - 1),
            self.link.bandwidth or "unshaped",
            self.link.latency or "0",
            self.link.loss or "0",
        )

    def _shape(self, ns: str, dev: str) -> None:
        parent = ["root"]
        if self.link.latency or self.link.loss:
            netem = ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem"]
            if self.link.latency:
                netem += ["delay", self.link.latency]
            if self.link.loss:
                netem += ["loss", self.link.loss]
            try:
                _ip(*netem, ns=ns)
            except ClusterError as exc:
                raise ClusterError(
                    f"{exc}; latency and loss need the kernel's netem qdisc (sch_netem), "
                    "which this machine lacks: shape bandwidth only"
                ) from None
            parent = ["parent", "1:"]
        if self.link.bandwidth:
            _ip(
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                *parent,
                "handle",
                "2:",
                "tbf",
                "rate",
                self.link.bandwidth,
                "burst",
                "256kb",
                "latency",
                "400ms",
                ns=ns,
            )

    def down(self) -> None:
        """Deletes every namespace this cluster made (their links go with them)."""
        for ns in reversed(self.namespaces):
            # Processes still inside would keep the namespace's network alive.
            pids = _ip("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("ip", "netns", "del", ns, check=False)
        self.namespaces = []

    def launch(
        self, procs_per_host: int, train_args: list[str], log_dir: Path, timeout_s: float
    ) -> list[int]:
        """Runs the torchrun job on every host; returns the exit codes (host order).

        Raises:
            ClusterError: a host's job failed or the whole job ran past ``timeout_s``.
        """
        log_dir.mkdir(parents=True, exist_ok=True)
        procs = []
        for i in range(self.hosts):
            cmd = [
                "ip",
                "netns",
                "exec",
                self.host_ns(i),
                "env",
                "GLOO_SOCKET_IFNAME=eth0",
                "OMP_NUM_THREADS=1",
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(self.hosts),
                "--node-rank",
                str(i),
                "--nproc-per-node",
                str(procs_per_host),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{self.address(0)}:{RDZV_PORT}",
                "--rdzv-id",
                f"aq{self.tag}",
                "--rdzv-conf",
                f"is_host={int(i == 0)}",
                "--local-addr",
                self.address(i),
                "-m",
                "adaqp.train",
                *train_args,
            ]
            log = open(log_dir / f"host{i}.log", "w")  # noqa: SIM115 - closed below
            procs.append(
                (
                    subprocess.Popen(
                        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    ),
                    log,
                )
            )
        deadline = time.monotonic() + timeout_s
        try:
            codes = []
            for proc, _ in procs:
                remaining = max(0.0, deadline - time.monotonic())
                try:
                    codes.append(proc.wait(timeout=remaining))
                except subprocess.TimeoutExpired:
                    raise ClusterError(f"the job ran past {timeout_s:.0f}s; stopped") from None
                if codes[-1] != 0:
                    raise ClusterError(
                        f"host {len(codes) - 1} exited with {codes[-1]}; "
                        f"see {log_dir}/host{len(codes) - 1}.log"
                    )
            return codes
        finally:
            for proc, log in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                log.close()


def _raise_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m adaqp.cluster",
        description="Run adaqp.train across emulated hosts joined by shaped links (root).",
        epilog="Everything after -- goes to adaqp.train unchanged.",
    )
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--procs-per-host", type=int, default=1)
    parser.add_argument("--bandwidth", default="1gbit", help="tc rate per link, e.g. 100mbit")
    parser.add_argument("--latency", default="", help="added one-way delay, e.g. 0.1ms")
    parser.add_argument("--loss", default="", help="packet loss, e.g. 0.1%%")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the whole job")
    parser.add_argument("--log-dir", type=Path, default=Path("results/runs/cluster-logs"))
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        print(
            "error: the emulated cluster needs root (network namespaces and tc); on a real "
            "cluster run launch/train.sh on every host instead",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    cluster = EmulatedCluster(args.hosts, LinkSpec(args.bandwidth, args.latency, args.loss))
    try:
        with cluster:
            cluster.launch(args.procs_per_host, train_args, args.log_dir, args.timeout)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: cluster torn down", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
