"""How many CPU cores this process may use; no torch, so that commands that only start
workers (the emulated cluster) can share the cores out without loading it."""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """Cores this process may run on: its affinity mask where the OS has one, less where a
    cgroup v2 CPU quota (``cpu.max``, e.g. a container's ``--cpus``) allows fewer."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError, ZeroDivisionError):  # no cgroup v2 quota, or a garbled one
        pass
    return cores
