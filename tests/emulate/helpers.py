"""What the emulated cluster's tests share: the root check, unique tags, and looking
for (and removing) what a cluster left behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from adaqp.emulate.netns import run_ip

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the emulated cluster needs root and iproute2 (ip, tc); not available here",
)

# A job that would run for hours: only a signal or the timeout ends it.
ENDLESS = ["--epochs", "100000"]


def _tag(n: int) -> str:
    """A tag of this test process's own, so that concurrent test runs never share names."""
    return str(10000 + (os.getpid() % 8999) * 10 + n)


def _namespaces(tag: str) -> list[str]:
    out = run_ip("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"aq{tag}-")]


def _root_links(tag: str) -> list[str]:
    """Links named after the cluster in the machine's own namespace (there must be none)."""
    out = run_ip("ip", "-o", "link", "show", check=False).stdout
    return re.findall(rf"^\d+: (aq{tag}\w*)", out, flags=re.MULTILINE)


def _remove(tag: str) -> None:
    """Clean up after a failed test, so that one failure does not leak into the machine."""
    for ns in _namespaces(tag):
        for pid in run_ip("ip", "netns", "pids", ns, check=False).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        run_ip("ip", "netns", "del", ns, check=False)
    for path in _groups(tag):
        from adaqp.emulate.cgroups import HostGroup

        HostGroup([Path(path)], 2, made=[Path(path)]).remove(timeout_s=5)


def _qdiscs(ns: str, dev: str) -> str:
    return run_ip("tc", "qdisc", "show", "dev", dev, ns=ns).stdout


def _cgroup_tree():
    """This machine's control groups for host budgets, or None where it has none."""
    from adaqp.emulate.cgroups import CgroupError, find_cgroups

    try:
        return find_cgroups()
    except CgroupError:
        return None


def _cgroup_reason() -> str:
    from adaqp.emulate.cgroups import CgroupError, find_cgroups

    try:
        find_cgroups()
    except CgroupError as exc:
        return f"no control groups for host budgets here: {exc}"
    return ""


needs_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or _cgroup_tree() is None,
    reason=_cgroup_reason() if os.geteuid() == 0 else "host budgets need root",
)


def _groups(tag: str) -> list[str]:
    """The control groups a cluster with this tag left behind (there must be none)."""
    tree = _cgroup_tree()
    if tree is None:
        return []
    return sorted(str(p) for base in tree.bases for p in base.glob(f"aq{tag}-*"))
