"""cgroup v2's "no internal processes" rule, met: this process's group is emptied into a
leaf before its children get the cpu and memory controllers, and restored afterwards.

In v2 a group (other than the root) may hand controllers to its children only while it
holds no process itself: writing ``+cpu`` to its ``cgroup.subtree_control`` fails with
EBUSY otherwise. The emulated cluster makes its host groups inside its own group (so that
limits set above it, a container's or a session's, still hold), and that group always
holds at least the cluster's own process: on a systemd host, a login or ``systemd-run``
scope with the user's shell beside it. ``enable_controllers`` therefore moves every
process of the group into a child ``adaqp-leaf`` first (moving a process between two
groups of one subtree changes none of the limits above it), then enables the
controllers; the host groups are made beside the leaf. ``Leaf.release`` undoes it once no
host group is left: the controllers off again, the processes back, the leaf removed; it
also runs at exit, should a caller not call it.

Both steps hold SIGINT and SIGTERM (blocked, then delivered), so that a Ctrl-C never
leaves the processes half moved.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from adaqp.emulate.netns import ClusterError

logger = logging.getLogger(__name__)

LEAF = "adaqp-leaf"
"""The child group that holds the processes of a group whose children use controllers."""
_MOVE_S = 5.0
"""How long moving a group's processes may take (a process may fork while we move)."""


class CgroupError(ClusterError):
    """This machine (or this user) cannot enforce per-host budgets, or a host's group could
    not be made; the message says why."""


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait (blocked) until the block is done, then arrive."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _pids(group: Path) -> list[str]:
    try:
        return (group / "cgroup.procs").read_text().split()
    except OSError:
        return []


def _children(group: Path) -> set[str]:
    return {p.name for p in group.iterdir() if p.is_dir()}


def move_processes(source: Path, target: Path, timeout_s: float = _MOVE_S) -> None:
    """Moves every process of group ``source`` into group ``target``, again until none is
    left (a process may fork while we move its siblings).

    Raises:
        OSError: a process could not be moved, or ``source`` did not empty in time.
    """
    deadline = time.monotonic() + timeout_s
    while pids := _pids(source):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                (target / "cgroup.procs").write_text(pid)
        if time.monotonic() > deadline:
            raise OSError(errno.EBUSY, f"processes {_pids(source)} are still in {source}")


@dataclass
class Leaf:
    """The leaf that holds the processes of ``base``, whose children use ``enabled``."""

    base: Path
    enabled: tuple[str, ...]
    """The controllers this step enabled (and ``release`` disables)."""
    children_before: frozenset[str]
    """The base's child groups before (any other found at release is another cluster's)."""

    @property
    def path(self) -> Path:
        return self.base / LEAF

    def release(self) -> bool:
        """Disables the controllers, moves the processes back into the base and removes
        the leaf; idempotent. Leaves everything as it is (a warning) while a group other
        than those the base had before is there: disabling the controllers would take
        the budgets of another cluster's hosts. Returns whether the base is as it was."""
        with _signals_held():
            if not self.path.exists():
                return True
            others = sorted(_children(self.base) - self.children_before - {LEAF})
            if others:
                logger.warning(
                    "left %s's processes in %s: the groups %s are still there",
                    self.base,
                    LEAF,
                    others,
                )
                return False
            try:
                off = " ".join(f"-{c}" for c in self.enabled)
                (self.base / "cgroup.subtree_control").write_text(off)
                move_processes(self.path, self.base)
                self.path.rmdir()
            except OSError as exc:
                logger.warning("could not give %s its processes back: %s", self.base, exc)
                return False
        atexit.unregister(self.release)
        return True


def enable_controllers(base: Path, controllers: tuple[str, ...]) -> Leaf | None:
    """Enables ``controllers`` for the children of group ``base``, where they are not yet.

    Tried as it is first (the root group, or one without processes, takes it); where the
    kernel refuses because ``base`` holds processes, they move into ``base/adaqp-leaf``
    and the request is made again.

    Returns:
        The leaf to release once the host groups are gone, or None where nothing moved.

    Raises:
        CgroupError: the controllers could not be enabled (all is moved back).
    """
    control = base / "cgroup.subtree_control"
    try:
        enabled = control.read_text().split()
    except OSError as exc:
        raise CgroupError(f"cannot read {control}: {exc.strerror}") from None
    missing = tuple(c for c in controllers if c not in enabled)
    if not missing:
        return None
    request = " ".join(f"+{c}" for c in missing)
    with _signals_held():
        try:
            control.write_text(request)
            return None
        except OSError as exc:
            if exc.errno != errno.EBUSY:  # EBUSY: it holds processes, moved just below
                raise CgroupError(
                    f"cannot write {request!r} to {control}: {exc.strerror}"
                ) from None
        leaf = Leaf(base, missing, frozenset(_children(base)))
        try:
            leaf.path.mkdir(exist_ok=True)  # one left by a run that was killed is reused
            move_processes(base, leaf.path)
            control.write_text(request)
        except OSError as exc:
            leaf.release()
            raise CgroupError(
                f"cannot enable {request!r} for {base}'s children: moving its processes into "
                f"{leaf.path} first failed: {exc.strerror or exc}"
            ) from None
    atexit.register(leaf.release)  # a caller that forgets still leaves the group as it was
    logger.info(
        "moved the processes of %s into %s/ so that its host groups can use %s (cgroup v2 "
        "allows no process in a group whose children use controllers); moved back at the end",
        base,
        LEAF,
        " and ".join(missing),
    )
    return leaf
