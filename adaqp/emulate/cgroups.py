"""Per-host CPU and memory budgets: Linux control groups, version 1 or 2, behind one interface.

``host_budgets`` reads command-line values (one for every host or one per host) into
``Budget``s. ``find_cgroups`` finds where this process may make groups, ``CgroupV1`` (one
directory per controller: ``cpu``, ``cpuacct``, ``memory``) or ``CgroupV2`` (one unified
directory), or raises ``CgroupError`` saying why it cannot. ``CgroupTree.group(name)``
names one host's ``HostGroup``; ``create`` makes it with its limits, ``wrap`` turns a
command into one that enters the group before it runs (a shell writes its own pid into
every ``cgroup.procs``, then execs the command: torchrun and every worker it forks are
inside from their first instruction), ``kill`` ends every process inside (torchrun's
workers run in sessions of their own, out of reach of its process group), ``usage`` reads
what the group used and ``remove`` kills what is left inside and removes the group, bounded
in time.

Groups are made inside this process's own group of each hierarchy, not at its root, so
that limits set above this process (a container's, a session's) still hold. In v2 that
group's processes first move into a leaf beside the host groups
(``adaqp.emulate.cgroup_leaf``); ``CgroupTree.release`` moves them back.

CPU: a CFS quota of ``cpus * CFS_PERIOD_US`` per period of ``CFS_PERIOD_US`` = 10 ms. A
group that spends its quota early in a period waits, throttled, for the next one; under
the kernel's default period of 100 ms a host at 0.25 CPU could stall 75 ms at a time,
longer than an exchange on a fast link, and the stall would read as network time. A
10 ms period bounds one stall at 7.5 ms for the same mean share (the kernel allows 1 ms;
shorter periods cost more scheduler work).

Files read and written::

                     v1                                 v2
    CPU limit        cpu.cfs_period_us, cfs_quota_us    cpu.max ("quota period" | "max period")
    memory limit     memory.limit_in_bytes (+memsw)     memory.max (+ memory.swap.max = 0)
    CPU used         cpuacct.usage (ns)                 cpu.stat usage_usec
    peak memory      memory.max_usage_in_bytes          memory.peak
    OOM kills        memory.oom_control oom_kill        memory.events oom_kill
    kill all         SIGKILL to each in cgroup.procs    cgroup.kill (5.14+), else as v1

Out of memory is the kernel's own count of OOM kills, never a peak near the limit: the
peak counts page cache, which fills any limit. v1's ``memory.failcnt`` is not read: it
counts every time usage reached the limit, reclaiming page cache included.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from adaqp.emulate.cgroup_leaf import LEAF, CgroupError, Leaf, enable_controllers
from adaqp.emulate.hostvalues import per_host
from adaqp.memory.limits import parse_memory as parse_size
from adaqp.process.cores import usable_cores

logger = logging.getLogger(__name__)

CFS_PERIOD_US = 10_000
"""CFS period of every host's CPU quota (see the module docstring for why 10 ms)."""

# The shell every host's command starts through: it writes its own pid into each file
# before "--", then execs what follows, so the command and all its children are inside.
_ENTER = (
    'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 126; shift; done; shift; exec "$@"'
)


@dataclass(frozen=True)
class Budget:
    """One host's limits; None means unlimited."""

    cpus: float | None = None
    """CPU quota in cores (0.5: half a core's time per period, over all its threads)."""
    memory_bytes: int | None = None
    """Memory limit (resident and page cache, as the kernel charges it)."""
    period_us: int = CFS_PERIOD_US
    """The CPU quota's CFS period (the module docstring says why 10 ms; the quota check
    compares others)."""

    @property
    def limited(self) -> bool:
        return self.cpus is not None or self.memory_bytes is not None


def parse_memory(text: str) -> int | None:
    """``--memory-per-host``'s value: see :func:`adaqp.memory.limits.parse_memory`."""
    return parse_size(text, "memory-per-host")


def parse_cpus(text: str) -> float | None:
    """A CPU quota in cores (``0.5``, ``2``); ``0``: None (unlimited)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"cpus-per-host: cannot read {text!r}; expected e.g. 0.5 or 2") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"cpus-per-host: {text!r} must be a non-negative number of cores")
    if 0 < value * CFS_PERIOD_US < 1000:  # the kernel's least quota is 1 ms per period
        raise ValueError(f"cpus-per-host: {text!r} is below the least quota, 0.1 cores")
    return value or None


def host_budgets(num_hosts: int, cpus: str, memory: str = "") -> list[Budget]:
    """One Budget per host from ``--cpus-per-host`` and ``--memory-per-host``: each one
    value for every host or a comma-separated list with exactly one per host.

    Raises:
        ValueError: a list of the wrong length or a value that cannot be read.
    """
    columns = [
        [parse(v) if v else None for v in per_host(name, text, num_hosts)]
        for name, text, parse in (
            ("cpus-per-host", cpus, parse_cpus),
            ("memory-per-host", memory, parse_memory),
        )
    ]
    return [Budget(c, m) for c, m in zip(*columns, strict=True)]


@dataclass(frozen=True)
class Usage:
    """What a host's group used; None where the kernel does not report it."""

    cpu_seconds: float | None
    peak_memory_bytes: int | None
    oom_kills: int


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    """The value of ``key`` in a ``key value`` per line file (cpu.stat, memory.events)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror}") from None


@dataclass
class HostGroup:
    """One host's group: a directory per hierarchy (v1) or one (v2), made by ``create``."""

    dirs: list[Path]
    version: int
    made: list[Path] = field(default_factory=list)
    """The directories created so far (what ``remove`` removes)."""

    def _dir(self, controller: str) -> Path:
        if self.version == 2:
            return self.dirs[0]
        return self.dirs[("cpu", "cpuacct", "memory").index(controller)]

    def create(self, budget: Budget) -> None:
        """Makes the directories and writes the limits (unlimited ones too, so that the
        group's usage is measured either way).

        Raises:
            CgroupError: a directory exists already or a limit was refused.
        """
        for d in dict.fromkeys(self.dirs):  # v1's cpu and cpuacct may share one hierarchy
            self.made.append(d)  # recorded first: teardown removes what a failed step left
            try:
                d.mkdir()
            except FileExistsError:
                self.made.pop()
                raise CgroupError(f"{d} exists already: remove it with rmdir") from None
            except OSError as exc:
                self.made.pop()
                raise CgroupError(f"cannot make {d}: {exc.strerror}") from None
        if self.version == 1:
            cpu, memory = self._dir("cpu"), self._dir("memory")
            _write(cpu / "cpu.cfs_period_us", str(budget.period_us))
            quota = round(budget.cpus * budget.period_us) if budget.cpus else -1
            _write(cpu / "cpu.cfs_quota_us", str(quota))
            if budget.memory_bytes:
                _write(memory / "memory.limit_in_bytes", str(budget.memory_bytes))
                if (memory / "memory.memsw.limit_in_bytes").exists():  # no way out into swap
                    _write(memory / "memory.memsw.limit_in_bytes", str(budget.memory_bytes))
        else:
            quota = str(round(budget.cpus * budget.period_us)) if budget.cpus else "max"
            _write(self.dirs[0] / "cpu.max", f"{quota} {budget.period_us}")
            if budget.memory_bytes:
                _write(self.dirs[0] / "memory.max", str(budget.memory_bytes))
                if (self.dirs[0] / "memory.swap.max").exists():
                    _write(self.dirs[0] / "memory.swap.max", "0")

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in dict.fromkeys(self.dirs)]

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` started inside this group (with all the processes it forks)."""
        return ["sh", "-c", _ENTER, "sh", *map(str, self.procs_files), "--", *cmd]

    def pids(self) -> set[int]:
        """The processes inside the group (in any of its hierarchies)."""
        found: set[int] = set()
        for path in self.procs_files:
            found.update(int(p) for p in (_read(path) or "").split())
        return found

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer has killed in this group for its limit."""
        if self.version == 1:
            return _keyed(_read(self._dir("memory") / "memory.oom_control"), "oom_kill") or 0
        return _keyed(_read(self.dirs[0] / "memory.events"), "oom_kill") or 0

    def usage(self) -> Usage:
        if self.version == 1:
            ns = _read(self._dir("cpuacct") / "cpuacct.usage")
            peak = _read(self._dir("memory") / "memory.max_usage_in_bytes")
            cpu = int(ns) / 1e9 if ns else None
        else:
            usec = _keyed(_read(self.dirs[0] / "cpu.stat"), "usage_usec")
            peak = _read(self.dirs[0] / "memory.peak")  # kernel 5.19 and later
            cpu = usec / 1e6 if usec is not None else None
        return Usage(cpu, int(peak) if peak else None, self.oom_kills())

    def _kill_once(self) -> set[int]:
        """Sends every process inside SIGKILL (v2: ``cgroup.kill`` where the kernel has
        it, which also reaches one forked meanwhile); returns those that were there."""
        pids = self.pids()
        kill_file = self.dirs[0] / "cgroup.kill"
        if pids and self.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def kill(self, timeout_s: float = 10.0) -> bool:
        """Kills every process inside and waits until the kernel lists none (then the
        counters ``usage`` reads are final), bounded; returns whether none is left."""
        deadline = time.monotonic() + timeout_s
        while self._kill_once():
            if time.monotonic() > deadline:
                logger.error("processes %s survived SIGKILL in %s", sorted(self.pids()), self.dirs)
                return False
            time.sleep(0.02)
        return True

    def remove(self, timeout_s: float = 10.0) -> bool:
        """Kills what is left inside, then removes the directories (a group can only go
        once empty; a dying process may hold it a moment). Idempotent; returns whether
        every directory is gone, logging the ones that are not."""
        deadline = time.monotonic() + timeout_s
        while self.made and time.monotonic() < deadline:
            self._kill_once()
            for d in reversed(self.made):
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:  # EBUSY, ENOTEMPTY: not empty yet; anything else: logged below
                    continue
                self.made.remove(d)
            if self.made:
                time.sleep(0.05)
        if self.made:
            logger.error("could not remove control groups %s; remove them with rmdir", self.made)
            return False
        return True


@dataclass(frozen=True)
class CgroupTree:
    """Where host groups are made: ``bases`` are this process's own groups, one per
    controller (v1: cpu, cpuacct, memory) or one (v2). A context manager: ``release``
    on leaving."""

    version: int
    bases: tuple[Path, ...]
    leaf: Leaf | None = field(default=None, compare=False)
    """v2: where the base's processes went for its children to use controllers (None
    where none had to move)."""

    def group(self, name: str) -> HostGroup:
        """Names a group (nothing is made until ``HostGroup.create``)."""
        return HostGroup([base / name for base in self.bases], self.version)

    def release(self) -> None:
        """Once the host groups are gone, gives the base back as it was (v2: the leaf's
        processes back, the controllers this process enabled off); idempotent, and also
        done at exit."""
        if self.leaf is not None:
            self.leaf.release()

    def __enter__(self) -> CgroupTree:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def CgroupV1(cpu: Path, cpuacct: Path, memory: Path) -> CgroupTree:  # noqa: N802
    return CgroupTree(1, (Path(cpu), Path(cpuacct), Path(memory)))


def CgroupV2(base: Path) -> CgroupTree:  # noqa: N802
    """Enables the cpu and memory controllers for ``base``'s children where they are not,
    moving ``base``'s own processes into a leaf first where the kernel asks for it
    (``adaqp.emulate.cgroup_leaf``); the tree's ``release`` undoes that.

    Raises:
        CgroupError: ``base`` does not offer them (not delegated), or they could not be
            enabled.
    """
    base = Path(base)
    offered = (_read(base / "cgroup.controllers") or "").split()
    if not {"cpu", "memory"} <= set(offered):
        raise CgroupError(f"{base} offers controllers {offered}, not cpu and memory")
    return CgroupTree(2, (base,), enable_controllers(base, ("cpu", "memory")))


def find_cgroups(mounts: str = "/proc/self/mounts", own: str = "/proc/self/cgroup") -> CgroupTree:
    """This process's groups that host groups can go under: v1 where its ``cpu``,
    ``cpuacct`` and ``memory`` controllers are mounted, else v2 with ``cpu`` and
    ``memory`` (a process already in an ``adaqp-leaf``, moved there by an earlier cluster,
    takes the leaf's parent). Release the tree (``with find_cgroups() as tree``) once its
    host groups are gone.

    Raises:
        CgroupError: neither, or this process may not make groups there.
    """
    if os.geteuid() != 0:
        raise CgroupError("per-host budgets need root (control groups)")
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in (_read(Path(mounts)) or "").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2":
            v2 = Path(fields[1])
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                v1.setdefault(option, Path(fields[1]))
    paths: dict[str, str] = {}
    for line in (_read(Path(own)) or "").splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path.lstrip("/")
    if all(c in v1 and c in paths for c in ("cpu", "cpuacct", "memory")):
        bases = [v1[c] / paths[c] for c in ("cpu", "cpuacct", "memory")]
    elif v2 is not None and "" in paths:
        base = v2 / paths[""]
        bases = [base.parent if base.name == LEAF else base]
    else:
        raise CgroupError("this machine mounts no cpu and memory control groups (v1 or v2)")
    for base in bases:
        if not os.access(base, os.W_OK):
            raise CgroupError(f"cannot make control groups under {base}")
    return CgroupV1(*bases) if len(bases) == 3 else CgroupV2(bases[0])


def default_cpus(num_hosts: int) -> str:
    """``--cpus-per-host``'s default: the usable cores shared among the hosts (no less
    than the kernel's least quota)."""
    return f"{max(usable_cores() / num_hosts, 0.1):.3g}"


def enforce(budgets: list[Budget], cpus_asked: bool) -> tuple[list[Budget], CgroupTree | None]:
    """The budgets to run with and where their groups go.

    Without control groups a budget asked for raises, while the default CPU share
    (``cpus_asked`` False) is dropped with a warning and the hosts run unmeasured.

    Raises:
        CgroupError: a budget was asked for and this machine cannot enforce it.
    """
    try:
        return budgets, find_cgroups()
    except CgroupError as exc:
        if (cpus_asked and any(b.cpus for b in budgets)) or any(b.memory_bytes for b in budgets):
            raise CgroupError(f"cannot enforce the per-host budgets: {exc}") from None
        logger.warning("hosts run without CPU budgets and unmeasured: %s", exc)
        return [Budget() for _ in budgets], None
