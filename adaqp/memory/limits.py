"""How much memory this host gives a job, and the line that refuses a run predicted to
need more than a run may take of it.

Standard library only: the launcher asks before torchrun starts (and runs the prediction,
``python -m adaqp.memory``, as a child). A host's memory is the smallest of the machine's
``MemTotal`` and the limit of every control group from this process's own up to the
hierarchy's root: a group's limit can exceed the machine (a container given 64 GiB on an
8 GiB machine) and a parent's limit binds every group below it. Limits are cgroup v2's
``memory.max`` (``max``: none) and v1's ``memory.limit_in_bytes`` (a huge value: none);
where each hierarchy is mounted, and which of its groups the mount shows, comes from
``/proc/self/mountinfo``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

OVERRIDE_FLAG = "--no-memory-check"
"""What lets a refused run go anyway (the launcher's and the emulated cluster's flag)."""

_MEMORY_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_MEMORY = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?")

USABLE_FRACTION = 0.9
"""The share of a host's memory a run's predicted need may take; a run predicted above it
is refused. The rest is headroom the prediction does not count: the kernel, the page cache
that a control group is charged for, the launcher's and torchrun's interpreters beside the
workers, and the prediction's own error (below the measured peak for some runs; GAT's is a
lower bound: docs/memory.md). The launcher and the emulated cluster both refuse by it
(:meth:`HostLimit.refuses`)."""

_V1_UNLIMITED = 1 << 60
"""cgroup v1 reports "no limit" as a page-rounded ``LONG_MAX``; anything above is none."""

_V2, _V1 = "memory.max", "memory.limit_in_bytes"
"""The limit's file in a cgroup v2 group and in a v1 memory-controller group."""


def parse_memory(text: str, flag: str = "memory") -> int | None:
    """``3g``, ``200m``, ``512k``, ``1.5GiB`` or plain bytes (binary multiples, as docker
    reads them); ``""`` or ``0``: None (unlimited). ``flag`` names the option in errors."""
    match = _MEMORY.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{flag}: cannot read {text!r}; expected e.g. 200m or 3g")
    value = int(float(match[1]) * _MEMORY_UNITS[match[2]])
    return value or None


@dataclass(frozen=True)
class HostLimit:
    """A host's memory and where the figure comes from (said in refusals)."""

    bytes: int
    source: str

    @property
    def usable_bytes(self) -> int:
        """What a run's predicted need may take: ``USABLE_FRACTION`` of ``bytes``."""
        return int(self.bytes * USABLE_FRACTION)

    def refuses(self, need: int) -> bool:
        """Whether a predicted ``need`` (bytes) is more than a run may take of this host."""
        return need > self.usable_bytes


@dataclass(frozen=True)
class _Mount:
    """Where a cgroup hierarchy is mounted: ``point``, showing its group ``root``."""

    root: str
    point: Path


def host_limit(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")
) -> HostLimit | None:
    """This host's memory for a job started here: the smallest of ``MemTotal`` and every
    control-group limit above this process; None where nothing can be read.

    Args:
        cgroup_root: where the hierarchies are looked for when ``proc``'s mountinfo names
            none (v2 at the root, v1's memory controller in ``memory/``).
        proc: the procfs to read (``self/cgroup``, ``self/mountinfo``, ``meminfo``).
    """
    found = _cgroup_limits(cgroup_root, proc)
    total = _mem_total(proc)
    if total is not None:
        found.append(HostLimit(total, "the machine's memory (MemTotal)"))
    return min(found, key=lambda limit: limit.bytes, default=None)


def _mem_total(proc: Path) -> int | None:
    """The machine's memory in bytes (``meminfo``'s ``MemTotal``); None if unreadable."""
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_limits(cgroup_root: Path, proc: Path) -> list[HostLimit]:
    """Every limit set on this process's groups and their ancestors, v2 and v1."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    v2, v1 = _mounts(proc)
    found = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            mount, name = v2 or _Mount("/", cgroup_root), _V2
        elif "memory" in controllers.split(","):
            mount, name = v1 or _Mount("/", cgroup_root / "memory"), _V1
        else:
            continue
        for group in _ancestry(mount, path):
            value = _read_int(group / name)
            if value is not None and not (name == _V1 and value >= _V1_UNLIMITED):
                found.append(HostLimit(value, f"the cgroup limit ({group / name})"))
    return found


def _mounts(proc: Path) -> tuple[_Mount | None, _Mount | None]:
    """The cgroup v2 mount and the v1 memory controller's, from ``self/mountinfo``."""
    v2 = v1 = None
    try:
        lines = (proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        # ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        tail = fields[fields.index("-", 6) + 1 :]
        mount = _Mount(_unescape(fields[3]), Path(_unescape(fields[4])))
        if tail[:1] == ["cgroup2"]:
            v2 = v2 or mount
        elif tail[:1] == ["cgroup"] and len(tail) > 2 and "memory" in tail[2].split(","):
            v1 = v1 or mount
    return v2, v1


def _unescape(field: str) -> str:
    """mountinfo's field with its octal escapes (``\\040`` for a space) read back."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _ancestry(mount: _Mount, path: str) -> list[Path]:
    """The folders of the group at ``path`` (as ``/proc/self/cgroup`` names it) and of
    every group above it that ``mount`` shows, the lowest first. A mount of a group below
    the root (a container's) shows that group at its mount point, not the path above it."""
    inside, shown = PurePosixPath(path), PurePosixPath(mount.root)
    if inside.is_relative_to(shown):
        relative = inside.relative_to(shown)
    else:  # a cgroup namespace's view: the path is already relative to what is shown
        relative = inside.relative_to(inside.anchor) if inside.anchor else inside
    leaf = mount.point / relative
    return [leaf, *(p for p in leaf.parents if p.is_relative_to(mount.point))]


def _read_int(path: Path) -> int | None:
    """An integer file's value; None if absent, unreadable or ``max``."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def config_in(train_args: list[str], default: str) -> str:
    """The config a launch command line names (``--config F`` or its first positional
    word), else ``default``."""
    args = list(train_args)
    while args:
        arg = args.pop(0)
        flag, eq, value = arg.partition("=")
        if flag == "--config":
            return value if eq else (args.pop(0) if args else default)
        if arg.startswith("-"):
            if not eq and args and not args[0].startswith("-"):
                args.pop(0)  # the flag's value
            continue
        return arg
    return default


def train_overrides(train_args: list[str]) -> list[str]:
    """The config overrides in training flags: ``--set K=V`` and ``--mode M``."""
    found, args = [], list(train_args)
    while args:
        arg = args.pop(0)
        flag, eq, value = arg.partition("=")
        if flag in ("--set", "--mode"):
            if not eq:
                if not args:
                    break
                value = args.pop(0)
            found.append(value if flag == "--set" else f"comm.mode={value}")
    return found


def over_limit(
    host: str,
    need: int,
    largest: int,
    count: int,
    limit: HostLimit,
    config: str,
    world_size: int,
) -> str:
    """The refusal's one line: what ``host`` needs for its ``count`` workers, and the
    share of its limit a run may take (``USABLE_FRACTION``)."""
    return (
        f"{host} needs {need / 2**30:.2f} GiB by the memory estimate ({count} "
        f"worker{'s' if count != 1 else ''}, the largest {largest / 2**30:.2f} GiB; "
        f"python -m adaqp.memory --config {config} --nproc {world_size} --nproc-per-host "
        f"{count} says more), over "
        f"the {limit.usable_bytes / 2**30:.2f} GiB a run may take: {USABLE_FRACTION:.0%} of "
        f"its {limit.bytes / 2**30:.1f} GiB ({limit.source}); pass {OVERRIDE_FLAG} to run "
        "anyway"
    )
