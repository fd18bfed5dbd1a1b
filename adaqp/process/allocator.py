"""How a worker's freed tensors go back to the system (``train.allocator``).

torch takes a CPU tensor's memory from glibc's ``malloc``. glibc serves a request from its
heap unless the request exceeds its mmap threshold, which it raises to the size of any
mapped block that is freed, up to 32 MiB. A worker of a large part allocates tensors of
hundreds of MiB (mapped, given back when freed); once a graph is split over hosts its
tensors shrink to a few MiB each, come from the heap, and stay there, fragmented, when
freed: on the 200k-node workload a worker at 4 hosts kept 250-370 MiB of free heap at its
peak against 40-60 MiB at one host (results/bench/memory/phases/), and its peak fell to
0.64-0.69x of one host's where the data falls to 0.25x.

``"release"`` (the default) fixes the threshold at ``MMAP_THRESHOLD_BYTES``: every tensor
above it is mapped on its own and unmapped when freed, so what a worker holds is what it
uses. Mapping afresh costs page faults on every step; where the kernel offers transparent
huge pages (``/sys/kernel/mm/transparent_hugepage/enabled`` not ``never``), torch is asked
to back its large tensors with them (``THP_MEM_ALLOC_ENABLE``), which takes 512 times
fewer faults. Without huge pages ``"release"`` keeps the threshold and pays the faults
(measured there: 21-52% of the epoch on 4 workers of the 200k workload); ``"glibc"``
leaves glibc's and torch's defaults as they are (the larger peak, no faults).

It must run before torch is imported (torch reads its setting once, at its first
allocation): ``python -m adaqp.train`` applies it after reading the config. A setting the
user made in the environment (``MALLOC_MMAP_THRESHOLD_``, ``THP_MEM_ALLOC_ENABLE``) is
kept. Standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from pathlib import Path

ALLOCATORS = ("release", "glibc")
"""``train.allocator``'s choices (see the module docstring)."""

MMAP_THRESHOLD_BYTES = 1 << 20
"""Under ``"release"``, glibc maps every block above this on its own (``M_MMAP_THRESHOLD``)."""

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number for the threshold (glibc's ``malloc.h``)."""

THP_ENV = "THP_MEM_ALLOC_ENABLE"
"""torch's switch for backing large CPU tensors with transparent huge pages."""

THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
"""glibc's own environment variable for the threshold (read when a process starts)."""

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class AllocatorSetting:
    """What :func:`configure` did, for the run's log and the memory prediction."""

    allocator: str
    threshold_bytes: int | None
    """The fixed mmap threshold in force, or None where glibc's sliding one is."""
    huge_pages: bool
    """Whether torch backs its large tensors with transparent huge pages."""

    def text(self) -> str:
        if self.threshold_bytes is None:
            return f"allocator {self.allocator}: glibc's defaults (freed memory kept for reuse)"
        pages = "huge pages" if self.huge_pages else "4 KiB pages (no huge pages here)"
        return (
            f"allocator {self.allocator}: tensors over {self.threshold_bytes >> 20} MiB mapped "
            f"on their own and given back when freed, {pages}"
        )


def huge_pages_offered(setting: Path = THP_SETTING) -> bool:
    """Whether the kernel backs a region with transparent huge pages when asked (its mode,
    the bracketed word, is ``always`` or ``madvise``)."""
    try:
        text = setting.read_text()
    except OSError:
        return False
    start, end = text.find("["), text.find("]")
    return start >= 0 and end > start and text[start + 1 : end] in ("always", "madvise")


def planned(allocator: str, environ: dict[str, str] | None = None) -> AllocatorSetting:
    """What :func:`configure` would set in a process started with ``environ`` (default: this
    one's), without setting anything: the memory prediction reads it."""
    env = os.environ if environ is None else environ
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {allocator!r}")
    user_threshold = env.get(THRESHOLD_ENV, "")
    if allocator == "glibc":
        threshold = int(user_threshold) if user_threshold.isdigit() else None
        return AllocatorSetting(allocator, threshold, env.get(THP_ENV) == "1")
    threshold = int(user_threshold) if user_threshold.isdigit() else MMAP_THRESHOLD_BYTES
    huge = env.get(THP_ENV, "1" if huge_pages_offered() else "0") == "1"
    return AllocatorSetting(allocator, threshold, huge)


def configure(allocator: str) -> AllocatorSetting:
    """Applies ``allocator`` to this process (see the module docstring) and says what it
    set. Call before torch is imported; glibc's threshold applies from the next request."""
    setting = planned(allocator)
    if allocator == "glibc":
        return setting
    if setting.huge_pages:
        os.environ.setdefault(THP_ENV, "1")
    if THRESHOLD_ENV not in os.environ and not _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        return AllocatorSetting(allocator, None, setting.huge_pages)  # not glibc: its own way
    return setting


def _mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt``; False where the C library has none (not glibc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(param, value) == 1
