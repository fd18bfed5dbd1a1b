"""The ``.npy`` members of an ``.npz`` archive, read mapped or in blocks and written in blocks.

``np.load`` reads an ``.npz`` member whole, and ``np.savez`` writes whole arrays: for
OGB's binary layout (``ogbn-papers100M``'s ``raw/data.npz`` holds 28 GB of features and
26 GB of edges) either would hold a second copy of what the caller fills. An ``.npz``
is a zip of ``.npy`` files, so a member stored uncompressed (``ZIP_STORED``, what
``np.savez`` writes) is the ``.npy`` bytes at a fixed offset of the archive and can be
mapped there (:meth:`NpzMember.mapped`) or read there a block at a time
(:meth:`NpzMember.blocks`); a compressed one (``np.savez_compressed``) is streamed
through zipfile's decompressor a block at a time. Nothing is unpickled: a member whose
dtype holds Python objects is refused.

:class:`NpzWriter` writes members block by block, stored, with each member's data
aligned to 64 bytes in the file (a padding record in the zip header), so that the
arrays the reader maps are aligned; ``np.load`` reads the result like any ``.npz``.
"""

from __future__ import annotations

import contextlib
import io
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import IO, Any

import numpy as np

_LOCAL_HEADER = struct.Struct("<4s22xHH")
"""A zip local file header: signature, 22 bytes we skip, name length, extra length."""
_ALIGN = 64
"""Byte alignment of the array data the writer places (numpy aligns its headers so)."""
_PAD_RECORD = 0xA1A9
"""The zip extra-field id of the writer's padding record (any id readers do not know)."""
_ZIP64_EXTRA = 20
"""Bytes zipfile adds to a local header's extra field for a zip64 member."""
_DATE = (1980, 1, 1, 0, 0, 0)
"""Every member's time stamp: the same arrays give the same bytes."""

_READ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error)
"""What reading a damaged archive raises; each becomes a ValueError naming the file."""


@dataclass(frozen=True)
class NpzMember:
    """One ``key.npy`` member of the archive at ``path``: its array's type and where it is.

    Attributes:
        path: The archive.
        key: The member's name without ``.npy`` (the key ``np.load`` gives it).
        dtype, shape, fortran_order: The ``.npy`` header's fields.
        stored: Whether the member is stored uncompressed, hence mappable.
        data_offset: Where the array's bytes begin: in the file when ``stored``, else in
            the member's decompressed stream.
    """

    path: Path
    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    stored: bool
    data_offset: int

    @property
    def size(self) -> int:
        return prod(self.shape)

    def describe(self) -> str:
        return f"{self.path}: {self.key!r} ({self.dtype} {list(self.shape)})"

    def mapped(self) -> np.ndarray:
        """The array mapped from the file, copy-on-write: writes to it stay in this process
        and never reach the file. Only for a ``stored`` member."""
        if not self.stored:
            raise ValueError(f"{self.describe()} is compressed and cannot be mapped")
        if self.size == 0:
            return np.empty(self.shape, dtype=self.dtype)
        order = "F" if self.fortran_order else "C"
        return np.memmap(self.path, self.dtype, "c", self.data_offset, self.shape, order)

    def blocks(self, start: int, stop: int, block_values: int) -> Iterator[np.ndarray]:
        """Yields the values ``[start, stop)`` of the array in its storage order (row-major,
        or column-major when ``fortran_order``), flat, at most ``block_values`` at a time.

        Both kinds of member are read, not mapped: a stored one from the file at its
        offset, a compressed one from one decompressing stream, which the blocks walk in
        order. So a pass over a large member leaves nothing of it resident.

        Raises:
            ValueError: naming the archive and the member, where it cannot be read.
        """
        block_values = max(1, block_values)
        itemsize = self.dtype.itemsize
        try:
            with contextlib.ExitStack() as stack:
                if self.stored:
                    fh = stack.enter_context(open(self.path, "rb"))
                else:
                    archive = stack.enter_context(zipfile.ZipFile(self.path))
                    fh = stack.enter_context(archive.open(f"{self.key}.npy"))
                fh.seek(self.data_offset + start * itemsize)
                for lo in range(start, stop, block_values):
                    count = min(block_values, stop - lo)
                    out = np.empty(count, dtype=self.dtype)
                    if fh.readinto(out.view(np.uint8)) != count * itemsize:
                        raise EOFError("the member ends early")
                    yield out
        except _READ_ERRORS as exc:
            raise ValueError(f"cannot read {self.describe()}: {exc}") from exc

    def read(self, block_values: int = 1 << 22, dtype: np.dtype | None = None) -> np.ndarray:
        """The whole array in memory, filled block by block (one copy, C order), in
        ``dtype`` (None: the stored one; each block converted as it is copied in).

        Raises:
            ValueError: the member is in Fortran order and not one-dimensional, or cannot
                be read.
        """
        if self.fortran_order and len(self.shape) > 1:
            raise ValueError(f"{self.describe()} is stored in Fortran order; save it C-ordered")
        out = np.empty(self.shape, dtype=self.dtype if dtype is None else dtype)
        flat = out.reshape(-1)
        lo = 0
        for block in self.blocks(0, self.size, block_values):
            flat[lo : lo + block.shape[0]] = block
            lo += block.shape[0]
        return out


def npz_members(path: Path) -> dict[str, NpzMember]:
    """The ``.npy`` members of the archive at ``path``, by key, from the zip directory and
    each member's ``.npy`` header (no array data is read).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: naming ``path``, where it is not a readable ``.npz`` (not a zip, a
            damaged header, an encrypted member, an array of Python objects).
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not an .npz archive (a zip of .npy arrays): truncated?")
    members = {}
    try:
        with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
            size = raw.seek(0, 2)
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                member = _member(path, archive, raw, info)
                end = member.data_offset + member.size * member.dtype.itemsize
                if member.stored and end > size:
                    raise ValueError(f"member {info.filename!r} runs past the end of the file")
                members[member.key] = member
    except _READ_ERRORS as exc:
        raise ValueError(f"{path} is a damaged .npz archive: {exc}") from exc
    return members


def _member(path: Path, archive: zipfile.ZipFile, raw: IO[bytes], info: zipfile.ZipInfo):
    if info.flag_bits & 0x1:
        raise ValueError(f"member {info.filename!r} is encrypted")
    with archive.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"member {info.filename!r} has .npy format version {version}")
        header_bytes = fh.tell()
    if dtype.hasobject:
        raise ValueError(f"member {info.filename!r} holds Python objects (it would need pickle)")
    stored = info.compress_type == zipfile.ZIP_STORED
    offset = header_bytes
    if stored:  # the member's bytes start after its local header, whose extra may differ
        raw.seek(info.header_offset)
        signature, name_len, extra_len = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
        if signature != b"PK\x03\x04":
            raise ValueError(f"member {info.filename!r} has no local header where listed")
        offset += info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    key = info.filename.removesuffix(".npy")
    return NpzMember(path, key, dtype, tuple(shape), fortran_order, stored, offset)


class NpzWriter:
    """Writes an ``.npz`` member by member, each from blocks, stored (see the module
    docstring). Use as a context manager; the archive is complete once it exits."""

    def __init__(self, path: Path):
        self._file = open(path, "wb")  # noqa: SIM115 (closed by __exit__)
        self._archive = zipfile.ZipFile(self._file, "w", zipfile.ZIP_STORED, allowZip64=True)

    def __enter__(self) -> NpzWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._archive.close()
        self._file.close()

    def write(
        self, key: str, dtype: Any, shape: tuple[int, ...], blocks: Iterable[np.ndarray]
    ) -> None:
        """Writes the member ``key``: a C-ordered array of ``dtype`` and ``shape`` whose values,
        in row-major order, are the concatenated ``blocks`` (each cast to ``dtype``).

        Raises:
            ValueError: the blocks do not hold exactly ``prod(shape)`` values.
        """
        dtype = np.dtype(dtype)
        header = _npy_header(dtype, shape)
        nbytes = len(header) + prod(shape) * dtype.itemsize
        info = zipfile.ZipInfo(f"{key}.npy", date_time=_DATE)
        info.compress_type = zipfile.ZIP_STORED
        info.file_size = nbytes
        info.external_attr = 0o644 << 16  # rw-r--r--, as np.savez leaves a member
        zip64 = nbytes * 1.05 > zipfile.ZIP64_LIMIT  # the test zipfile itself makes
        base = self._file.tell() + 30 + len(info.filename) + (_ZIP64_EXTRA if zip64 else 0)
        pad = -base % _ALIGN
        if pad:  # a record is at least its 4-byte head
            pad += _ALIGN if pad < 4 else 0
            info.extra = struct.pack("<HH", _PAD_RECORD, pad - 4) + bytes(pad - 4)
        written = 0
        with self._archive.open(info, "w", force_zip64=zip64) as out:
            out.write(header)
            for block in blocks:
                block = np.ascontiguousarray(block, dtype=dtype)
                written += block.size
                if written > prod(shape):
                    break
                out.write(block.data)
        if written != prod(shape):
            raise ValueError(
                f"{key}: the blocks hold {written} values, {list(shape)} holds {prod(shape)}"
            )


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape``."""
    buffer = io.BytesIO()
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    try:
        np.lib.format.write_array_header_1_0(buffer, fields)
    except ValueError:  # a header too long for version 1.0
        buffer = io.BytesIO()
        np.lib.format.write_array_header_2_0(buffer, fields)
    return buffer.getvalue()
