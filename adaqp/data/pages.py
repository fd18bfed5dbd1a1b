"""Passes over an array mapped from a file that leave nothing of it resident.

OGB's binary layout maps its features from the archive (``adaqp.data.ogb_binary``): they
take no memory until read. But every page a pass reads stays in the process's resident
set while the file is mapped, so one pass over papers100M's features (28 GB) would make
the process look, and be charged by a control group, as if it held them all. Such a pass
walks the array in row blocks (:func:`row_blocks`) and hands each block's pages back to
the kernel once it is done with it (``madvise(MADV_PAGEOUT)``, Linux 5.4 and later):
the file's clean pages are dropped and read again if touched, while pages this process
changed (a copy-on-write mapping's private copies) are kept, so no value is ever lost.
An array not mapped from a file is walked the same way and nothing is handed back.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator

import numpy as np

BLOCK_BYTES = 64 << 20
"""Bytes of a row block (at least one row)."""

_MADV_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21)
"""Linux's advice to reclaim a range's pages now (21 where Python does not name it)."""


def _madvise():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):  # not a platform with madvise
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call


_MADVISE = _madvise()


def is_mapped(array: np.ndarray) -> bool:
    """Whether ``array`` (or the array it views) is mapped from a file."""
    base = array
    while base is not None:
        if isinstance(base, np.memmap | mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


def release(block: np.ndarray) -> bool:
    """Hands the pages of ``block``, part of an array mapped from a file, back to the
    kernel (see the module docstring). Returns whether the kernel took the advice (False:
    an array not mapped from a file, whose memory is its only copy; an older kernel or
    another platform; nothing changes then)."""
    if _MADVISE is None or block.nbytes == 0 or not is_mapped(block):
        return False
    page = mmap.PAGESIZE
    start = block.ctypes.data // page * page
    stop = -(-(block.ctypes.data + block.nbytes) // page) * page
    return _MADVISE(start, stop - start, _MADV_PAGEOUT) == 0


def row_blocks(array: np.ndarray, block_bytes: int = BLOCK_BYTES) -> Iterator[np.ndarray]:
    """Yields ``array``'s rows in blocks (views) of about ``block_bytes``; where it is
    mapped from a file, each block's pages are released (:func:`release`) when the next
    is asked for, so a pass over it stays one block resident."""
    rows = array.shape[0] if array.ndim else 0
    row_bytes = max(1, array.nbytes // max(rows, 1))
    step = max(1, block_bytes // row_bytes)
    for start in range(0, rows, step):
        block = array[start : start + step]
        yield block
        release(block)
