"""Writing a partition directory atomically, and loading one part with its checks.

Writing never removes what this format did not write: a directory is written only if
it is absent, empty, or holds a partition (our ``metadata.json``), and then only the
metadata and the part files it lists are replaced. Files are written to a hidden
sibling directory and fsync'd first; ``metadata.json`` is moved in last, so a crash
leaves no directory that looks complete.

Loading verifies a part file against its sha256 in the metadata before reading it (numpy
``.npz``, ``allow_pickle=False``), then checks its arrays against
:mod:`adaqp.partitioning.schema`, which defines the layout, fields and arrays.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from adaqp.partitioning.schema import (
    CHECKSUM_KEY,
    FORMAT,
    METADATA_FILE,
    PART_ARRAYS,
    PART_FILE_NAME,
    Part,
    PartitionError,
    check_part_arrays,
    metadata_checksum,
    part_file,
    read_metadata,
)
from adaqp.partitioning.scratch import STAGING, owned_name
from adaqp.process.atomic import fsync_dir, write_synced

_LEFTOVER = re.compile(rf"{PART_FILE_NAME.pattern}|\..*{STAGING}-.*")
"""Names a crashed write can leave behind (a staging directory, part files)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


# --- writing ------------------------------------------------------------------------


def _owned_files(out_dir: Path) -> list[Path] | None:
    """What writing to ``out_dir`` would replace: None if absent, [] if empty, else the
    metadata and the part files it lists.

    Raises:
        PartitionError: ``out_dir`` is not a directory, or holds files this format did
            not write (they are never removed).
    """
    if not out_dir.exists():
        if out_dir.is_symlink():
            raise PartitionError(f"{out_dir} is a dangling symbolic link; remove it first")
        return None
    if not out_dir.is_dir():
        raise PartitionError(
            f"cannot write a partition to {out_dir}: it exists and is not a directory"
        )
    try:
        names = sorted(entry.name for entry in out_dir.iterdir())
    except OSError as exc:
        raise PartitionError(f"cannot list {out_dir}: {exc}") from None
    if not names:
        return []
    meta = _peek_metadata(out_dir / METADATA_FILE)
    if meta is None:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        if all(_LEFTOVER.fullmatch(name) for name in names):
            why = "part files but no metadata (an interrupted write?)"
        else:
            why = "files that are not an AdaQP partition"
        raise PartitionError(
            f"refusing to write a partition to {out_dir}: it holds {why} ({shown}); "
            "nothing was removed. Choose a new or empty directory, or move those files away"
        )
    owned = [out_dir / METADATA_FILE]
    for entry in meta.get("parts", []):
        name = entry.get("file") if isinstance(entry, dict) else None
        # Only plain part files directly inside the directory: an edited list must not
        # reach outside it.
        if isinstance(name, str) and PART_FILE_NAME.fullmatch(name) and (out_dir / name).is_file():
            owned.append(out_dir / name)
    return owned


def _peek_metadata(path: Path) -> dict[str, Any] | None:
    """Our metadata at ``path`` (any version, checksum unchecked), or None if not ours."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def check_target(out_dir: str | Path) -> None:
    """Raises ``PartitionError`` unless a partition could be written to ``out_dir``.

    Cheap (it creates and removes one empty directory where the files would be staged);
    meant to run before the expensive work so that a bad ``--out`` fails at once.
    """
    out_dir = Path(out_dir)
    where = out_dir if _owned_files(out_dir) is not None else out_dir.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    probe = where / owned_name(STAGING)
    try:
        probe.mkdir()
    except OSError as exc:
        raise PartitionError(
            f"cannot write a partition to {out_dir}: cannot create files in {where} "
            f"({exc.strerror or exc}); choose another --out / partition.dir"
        ) from None
    finally:  # also where a stop lands just after the probe was made
        with contextlib.suppress(OSError):
            probe.rmdir()


class PartitionExists(PartitionError):
    """Another process wrote a partition to the directory first (``exclusive`` writes)."""


def write_partition(
    out_dir: Path,
    metadata: dict[str, Any] | Callable[[], dict[str, Any]],
    parts: Iterable[dict[str, np.ndarray]],
    *,
    exclusive: bool = False,
) -> dict[str, Any]:
    """Writes a whole partition atomically (see the module docstring); returns the metadata.

    ``parts`` is consumed one part at a time, each written before the next is asked for,
    so a generator that builds each part on demand keeps one part resident. ``metadata``
    may be a function, called once every part is written: the metadata can then hold
    figures gathered while the parts were built.

    A new directory is staged as a hidden sibling and renamed into place. An existing
    one (empty, or holding a partition) gets the files staged inside it, on the same
    file system, then its old metadata and listed part files removed and the new ones
    moved in, metadata last. ``metadata["parts"][i]`` gains ``file`` and ``sha256``;
    ``metadata`` gains ``metadata_sha256``.

    With ``exclusive`` a partition already there (one that another run has just written,
    say) is left as it is: ``PartitionExists`` is raised instead, also when another
    process moves its own into place first.

    Raises:
        PartitionError: ``out_dir`` holds foreign files, is not a directory, or cannot
            be written; nothing existing is removed in those cases.
    """
    out_dir = Path(out_dir)
    owned = _owned_files(out_dir)
    if exclusive and (out_dir / METADATA_FILE).is_file():
        raise PartitionExists(f"{out_dir} already holds a partition")
    if owned is None:  # named for its owner: see adaqp.partitioning.scratch
        stage = out_dir.with_name(owned_name(STAGING, prefix=out_dir.name))
    else:
        stage = out_dir / owned_name(STAGING)
    created = False
    try:
        stage.parent.mkdir(parents=True, exist_ok=True)
        stage.mkdir()
        created = True
        written = []
        for rank, arrays in enumerate(parts):
            missing = set(PART_ARRAYS) - set(arrays)
            if missing:
                raise ValueError(f"part {rank} lacks arrays {sorted(missing)}")
            path = stage / part_file(rank)
            write_synced(path, lambda fh, a=arrays: np.savez(fh, **a))
            del arrays
            written.append({"file": path.name, "sha256": sha256_file(path)})
        if callable(metadata):
            metadata = metadata()
        if len(metadata["parts"]) != len(written):
            raise ValueError(
                f"the metadata lists {len(metadata['parts'])} parts, {len(written)} were written"
            )
        for entry, files in zip(metadata["parts"], written, strict=True):
            entry.update(files)
        metadata[CHECKSUM_KEY] = metadata_checksum(metadata)
        text = json.dumps(metadata, indent=2, sort_keys=True).encode()
        write_synced(stage / METADATA_FILE, lambda fh: fh.write(text))
        fsync_dir(stage)
        if owned is None:
            os.rename(stage, out_dir)
            created = False
            fsync_dir(out_dir.parent)
        else:
            # The old metadata goes first and the new one comes last: in between the
            # directory does not look like a partition. Files we did not write stay.
            for path in owned:
                path.unlink(missing_ok=True)
            for rank in range(len(written)):
                os.replace(stage / part_file(rank), out_dir / part_file(rank))
            fsync_dir(out_dir)
            os.replace(stage / METADATA_FILE, out_dir / METADATA_FILE)
            fsync_dir(out_dir)
    except OSError as exc:
        if owned is None and (out_dir / METADATA_FILE).is_file():
            # Another process renamed its partition into place between our check and ours.
            raise PartitionExists(f"{out_dir} already holds a partition") from None
        raise PartitionError(
            f"cannot write a partition to {out_dir}: {exc}; choose another --out / partition.dir"
        ) from None
    finally:
        if created:
            shutil.rmtree(stage, ignore_errors=True)
    return metadata


# --- reading ------------------------------------------------------------------------


def load_part(part_dir: Path, rank: int, meta: dict[str, Any] | None = None) -> Part:
    """Loads one part, verifying its checksum and the arrays' dtypes, shapes and ranges.

    Raises:
        PartitionError: the file is missing, tampered with, or inconsistent.
    """
    part_dir = Path(part_dir)
    meta = meta if meta is not None else read_metadata(part_dir)
    num_parts = meta["params"]["num_parts"]
    if not 0 <= rank < num_parts:
        raise PartitionError(f"rank {rank} has no part in {part_dir} ({num_parts} parts)")
    entry = meta["parts"][rank]
    path = part_dir / entry["file"]
    if not path.is_file():
        raise PartitionError(f"partition file {path} is missing")
    try:
        digest = sha256_file(path)
    except OSError as exc:
        raise PartitionError(f"cannot read {path}: {exc}") from None
    if digest != entry["sha256"]:
        raise PartitionError(
            f"partition file {path} does not match its checksum in {METADATA_FILE}; "
            "it was modified or truncated: re-create the partition"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise PartitionError(f"cannot read {path}: {exc}") from None
    check_part_arrays(arrays, path, meta, rank)
    return Part(rank=rank, num_parts=num_parts, arrays=arrays)
