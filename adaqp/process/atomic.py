"""Writing files so that a crash leaves either the old file or the new one, never half.

The one place the run directory, the checkpoints and the partition writer get their
fsync and rename from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def fsync_dir(path: Path) -> None:
    """Flushes a directory's entries (a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Creates ``path`` (it must not exist), writes through ``write(file)`` and fsyncs it."""
    with open(path, "xb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Writes through ``write(file)`` to a temporary sibling, fsyncs, renames into place
    and fsyncs the directory. An interrupted write leaves ``.<name>.tmp-<pid>`` behind."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Replaces ``path`` with indented, key-sorted JSON through ``<name>.tmp`` and a rename:
    readers (a user's ``cat``, a monitor polling ``status.json``) never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
