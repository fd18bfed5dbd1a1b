"""How much memory this host gives a job (its cgroup's limit, else the machine's), and
the line that refuses a run predicted to need more.

Standard library only: the launcher asks before torchrun starts (and runs the prediction,
``python -m adaqp.memory``, as a child). cgroup v2 limits
(``memory.max``) are read for this process's group and every group above it, the
smallest counting; cgroup v1 reads ``memory.limit_in_bytes`` (a huge value means none).
Without a limit the machine's ``MemTotal`` is the host's memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OVERRIDE_FLAG = "--no-memory-check"
"""What lets a refused run go anyway (the launcher's and the emulated cluster's flag)."""

_V1_UNLIMITED = 1 << 60
"""cgroup v1 reports "no limit" as a page-rounded ``LONG_MAX``; anything above is none."""


@dataclass(frozen=True)
class HostLimit:
    """A host's memory and where the figure comes from (said in refusals)."""

    bytes: int
    source: str


def host_limit(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")
) -> HostLimit | None:
    """This host's memory for a job started here; None where nothing can be read."""
    limit = _cgroup_limit(cgroup_root, proc)
    if limit is not None:
        return limit
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return HostLimit(int(line.split()[1]) * 1024, "the machine's memory (MemTotal)")
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_limit(root: Path, proc: Path) -> HostLimit | None:
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2: walk up to the root
            best = None
            group = root / path.lstrip("/")
            while True:
                value = _read_int(group / "memory.max")
                if value is not None and (best is None or value < best[0]):
                    best = (value, group)
                if group == root or root not in group.parents:
                    break
                group = group.parent
            if best is not None:
                return HostLimit(best[0], f"the cgroup limit ({best[1] / 'memory.max'})")
        elif "memory" in controllers.split(","):  # v1
            for base in (root / "memory" / path.lstrip("/"), root / "memory"):
                value = _read_int(base / "memory.limit_in_bytes")
                if value is not None and value < _V1_UNLIMITED:
                    return HostLimit(value, f"the cgroup limit ({base / 'memory.limit_in_bytes'})")
    return None


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
    """The refusal's one line: what ``host`` needs for its ``count`` workers, and its limit."""
    return (
        f"{host} needs {need / 2**30:.1f} GiB by the memory estimate ({count} "
        f"worker{'s' if count != 1 else ''}, the largest {largest / 2**30:.2f} GiB; "
        f"python -m adaqp.memory --config {config} --nproc {world_size} says more), over "
        f"its {limit.bytes / 2**30:.1f} GiB ({limit.source}); pass {OVERRIDE_FLAG} to run "
        "anyway"
    )
