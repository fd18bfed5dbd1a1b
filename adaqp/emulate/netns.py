"""Network namespaces and the wires between them: ``ip`` commands, bridge and veth pairs.

``run_ip`` runs one ``ip`` or ``tc`` command, in the machine's own namespace or inside a
named one, and raises ``ClusterError`` when it fails; ``netns_names`` lists the machine's
namespaces. ``add_bridge`` makes the switch's bridge and ``join_to_switch`` wires one host
to it by a veth pair that is born inside the namespaces, never in the machine's own.
Recording which namespaces exist (for teardown) is the cluster's job
(``adaqp.emulate.cluster``); shaping the links is ``adaqp.emulate.links``'s.
"""

from __future__ import annotations

import subprocess


class ClusterError(RuntimeError):
    """The emulated cluster could not be built or its job failed."""


def run_ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Runs one ``ip`` or ``tc`` command (``args``), inside namespace ``ns`` when given.

    Returns:
        The finished process, its output captured as text.

    Raises:
        ClusterError: the command failed and ``check`` is True.
    """
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    # A session of its own: a Ctrl-C at the terminal must not kill a teardown step halfway.
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=30, check=False, start_new_session=True
    )
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def netns_names() -> list[str]:
    """The names of the machine's network namespaces (empty when ``ip`` cannot list them)."""
    out = run_ip("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def add_bridge(switch: str) -> None:
    """Makes the bridge ``br0`` inside the switch namespace and brings it up."""
    run_ip("ip", "link", "add", "br0", "type", "bridge", ns=switch)
    run_ip("ip", "link", "set", "br0", "up", ns=switch)


def join_to_switch(switch: str, ns: str, switch_end: str, address: str) -> None:
    """Joins host namespace ``ns`` (its end ``eth0`` at ``address``/24) to the switch's
    bridge through the veth end ``switch_end``, and brings every end up."""
    # Made inside the switch with its peer placed in the host in one request: no
    # link ever exists in the machine's own namespace, where teardown would miss it.
    run_ip(
        *("ip", "link", "add", switch_end, "type", "veth"),
        *("peer", "name", "eth0", "netns", ns),
        ns=switch,
    )
    run_ip("ip", "addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
    for dev in ("lo", "eth0"):
        run_ip("ip", "link", "set", dev, "up", ns=ns)
    run_ip("ip", "link", "set", switch_end, "master", "br0", ns=switch)
    run_ip("ip", "link", "set", switch_end, "up", ns=switch)
