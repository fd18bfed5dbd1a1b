"""The files partitioning keeps beside a partition while it runs: their names, which say
whose they are, and removing those whose process is gone.

Two kinds: the lean source's spilled features (``.adaqp-scratch-*``, a directory beside
the partition: see ``source``) and the directory the parts are staged in before they are
moved into place (``.<out>.adaqp-tmp-*`` beside it, or ``<out>/.adaqp-tmp-*`` inside an
existing one: see ``store``). Partitioning removes its own when it ends, on an error or a
stop signal too; a process killed outright (SIGKILL, a crash, a power cut) cannot. Each
name therefore carries its owner, ``<kind>-<host>-<pid namespace>-<pid>-<token>``, and the
next partitioning beside the same directory removes what processes that no longer exist
left (:func:`remove_stale`). A process id means something only on its host and in its
process-id namespace (a container has its own), so names from elsewhere are left, as are
names of a process still running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import socket
from pathlib import Path

logger = logging.getLogger(__name__)

SCRATCH = "adaqp-scratch"
"""The kind of the source's spill directory."""
STAGING = "adaqp-tmp"
"""The kind of the directory parts are written to before they are moved into place."""

_OWNED = re.compile(
    rf"\.(?:.+\.)?(?:{SCRATCH}|{STAGING})-(?P<scope>.+)-(?P<pid>\d+)-(?P<token>[0-9a-f]{{8}})"
)
"""A name :func:`owned_name` makes (``.[<prefix>.]<kind>-<scope>-<pid>-<token>``)."""
_OURS = re.compile(rf"\.(?:.+\.)?(?:{SCRATCH}|{STAGING})-.*")
"""Any name of these kinds, also one without an owner (made before names carried one)."""


def scope() -> str:
    """Where this process's id means something: ``<host>-<pid namespace>``."""
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "host"
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no procfs: one namespace as far as we can tell
        namespace = 0
    return f"{host}-{namespace}"


def owned_name(kind: str, prefix: str = "") -> str:
    """A new hidden name of ``kind`` owned by this process, e.g.
    ``.adaqp-scratch-node1-4026531836-4242-9f3c01ab``; ``prefix`` goes first
    (``.<prefix>.<kind>-...``: the staging directory names the partition it will become)."""
    lead = f"{prefix}." if prefix else ""
    return f".{lead}{kind}-{scope()}-{os.getpid()}-{secrets.token_hex(4)}"


def make_owned_dir(parent: Path, kind: str) -> Path:
    """Creates a new private directory of ``kind`` in ``parent`` (which must exist)."""
    path = parent / owned_name(kind)
    path.mkdir(mode=0o700)
    return path


def owner(name: str) -> tuple[str, int] | None:
    """``(scope, pid)`` of the process that made ``name``; None for any other name."""
    match = _OWNED.fullmatch(name)
    return (match["scope"], int(match["pid"])) if match else None


def is_running(pid: int) -> bool:
    """Whether a process ``pid`` exists here (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(*directories: Path) -> list[Path]:
    """Removes from each directory what processes that no longer exist left; returns it.

    Only directories named by :func:`owned_name` in this process's scope whose process
    is gone are removed, each with a log line. Names of a running process, of another
    host or namespace, or without an owner (made before names carried one) are left;
    the last three are logged, since nothing here can tell whether they are in use.
    Errors are logged, never raised: cleaning up must not stop a run.
    """
    here = scope()
    removed = []
    for directory in directories:
        try:
            entries = sorted(directory.iterdir()) if directory.is_dir() else []
        except OSError as exc:
            logger.warning("cannot look for stale scratch in %s: %s", directory, exc)
            continue
        for path in entries:
            if not _OURS.fullmatch(path.name) or path.is_symlink() or not path.is_dir():
                continue
            found = owner(path.name)
            if found is None or found[0] != here:
                logger.info(
                    "left %s: partitioning scratch whose owner this host cannot check (%s); "
                    "remove it if no partitioning that could have made it is running",
                    path,
                    "another host or container" if found else "no owner in its name",
                )
            elif found[1] != os.getpid() and not is_running(found[1]):
                shutil.rmtree(path, ignore_errors=True)
                if path.exists():
                    logger.warning("cannot remove stale scratch %s; remove it by hand", path)
                else:
                    logger.info("removed %s, left by process %d, which has ended", path, found[1])
                    removed.append(path)
    return removed


def own_leftovers(*directories: Path) -> list[Path]:
    """What this process still owns in ``directories`` (after a stop, it should be
    nothing)."""
    mine = (scope(), os.getpid())
    found = []
    for directory in directories:
        try:
            entries = sorted(directory.iterdir()) if directory.is_dir() else []
        except OSError:
            continue
        found.extend(path for path in entries if owner(path.name) == mine)
    return found


def remove_own_leftovers(*directories: Path) -> list[Path]:
    """Removes what this process still owns in ``directories`` and returns what could not
    be removed. After a stop: a signal can land between making a directory and handing it
    to the code that would remove it (the write check's probe, a scratch folder being
    made), and what this process made is this process's to remove."""
    for path in own_leftovers(*directories):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return own_leftovers(*directories)
