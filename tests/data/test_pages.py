"""Passes over a mapped array (adaqp.data.pages): every row once, nothing changed, and the
pages read handed back to the kernel."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from adaqp.data.pages import is_mapped, release, row_blocks


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


def test_row_blocks_yield_every_row_once_in_order(tmp_path: Path) -> None:
    values = np.arange(1000 * 6, dtype=np.float32).reshape(1000, 6)
    path = tmp_path / "rows.bin"
    values.tofile(path)
    mapped = np.memmap(path, np.float32, "c", 0, values.shape)
    assert is_mapped(mapped) and is_mapped(mapped[10:20]) and not is_mapped(values)
    for array in (values, mapped):
        blocks = list(row_blocks(array, block_bytes=6 * 4 * 64 + 1))
        assert [b.shape[0] for b in blocks[:-1]] == [64] * (len(blocks) - 1)
        assert np.array_equal(np.concatenate(blocks), values)
    assert list(row_blocks(values[:0])) == []


def test_a_changed_value_survives_its_pages_being_released(tmp_path: Path) -> None:
    """The mapping is copy-on-write: a page this process changed is its own and is kept."""
    path = tmp_path / "rows.bin"
    np.zeros((4096, 16), dtype=np.float32).tofile(path)
    mapped = np.memmap(path, np.float32, "c", 0, (4096, 16))
    mapped[5, 3] = 7.0
    release(mapped)
    for _ in row_blocks(mapped, block_bytes=4096):
        pass
    assert mapped[5, 3] == 7.0 and float(mapped.sum()) == 7.0
    assert np.fromfile(path, dtype=np.float32).sum() == 0.0  # the file never changes


def test_a_pass_over_a_mapped_file_leaves_it_unresident(tmp_path: Path) -> None:
    size = 256 << 20
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        for _ in range(size >> 24):
            f.write(np.ones(1 << 22, dtype=np.float32).tobytes())
    mapped = np.memmap(path, np.float32, "c", 0, (size // 4 // 64, 64))
    if not release(mapped[:1]):
        # An older kernel: the advice is refused and the pass only reads; the values
        # are still right, which the other tests check.
        assert sum(float(b.sum()) for b in row_blocks(mapped)) == size // 4
        return
    before = _resident_bytes()
    total = sum(float(b.sum()) for b in row_blocks(mapped))
    grown = _resident_bytes() - before
    assert total == size // 4
    assert grown < size // 4, f"{grown >> 20} MiB of a {size >> 20} MiB file stayed resident"
