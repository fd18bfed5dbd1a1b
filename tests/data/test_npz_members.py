"""Tests for adaqp.data.npz_members: .npz members read mapped or in blocks, written in blocks."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from adaqp.data.npz_members import NpzWriter, npz_members


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "edge_index": rng.integers(0, 1000, (2, 37)),
        "node_feat": rng.standard_normal((29, 5)).astype(np.float16),
        "labels": rng.standard_normal(11).astype(np.float32),
        "empty": np.zeros((0, 3), dtype=np.int32),
    }


def _write(path: Path, arrays: dict[str, np.ndarray], block: int) -> None:
    with NpzWriter(path) as npz:
        for key, array in arrays.items():
            flat = array.reshape(-1)
            blocks = (flat[i : i + block] for i in range(0, flat.size, block))
            npz.write(key, array.dtype, array.shape, blocks)


def _read_all(member, block: int) -> np.ndarray:
    parts = list(member.blocks(0, member.size, block))
    return np.concatenate(parts) if parts else np.zeros(0, member.dtype)


def test_written_members_read_back_like_np_load(tmp_path: Path) -> None:
    arrays = _arrays()
    path = tmp_path / "data.npz"
    _write(path, arrays, block=7)  # blocks that do not divide the rows
    with np.load(path, allow_pickle=False) as z:
        assert sorted(z.files) == sorted(arrays)
        for key, array in arrays.items():
            assert z[key].dtype == array.dtype and np.array_equal(z[key], array), key
    members = npz_members(path)
    for key, array in arrays.items():
        member = members[key]
        assert member.stored and member.shape == array.shape and member.dtype == array.dtype
        assert member.data_offset % 64 == 0, key  # mapped arrays are aligned
        mapped = member.mapped()
        assert np.array_equal(mapped, array) and mapped.flags.aligned, key
        assert np.array_equal(member.read(block_values=4), array), key
        assert np.array_equal(_read_all(member, 5), array.reshape(-1)), key
    # A range of values, in blocks, and a map that writes stay in the process.
    edge = members["edge_index"]
    got = np.concatenate(list(edge.blocks(30, 50, 6)))
    assert np.array_equal(got, arrays["edge_index"].reshape(-1)[30:50])
    mapped = members["node_feat"].mapped()
    mapped[0, 0] = 1234
    assert np.array_equal(members["node_feat"].mapped(), arrays["node_feat"])
    # The same arrays give the same bytes.
    _write(tmp_path / "again.npz", arrays, block=3)
    assert (tmp_path / "again.npz").read_bytes() == path.read_bytes()


def test_zip64_members_are_aligned_and_mapped(tmp_path: Path, monkeypatch) -> None:
    # Members past zip64's limit carry a 20-byte zip64 record in their local header; the
    # limit is lowered so that a small array takes that path.
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 100)
    arrays = _arrays()
    path = tmp_path / "big.npz"
    _write(path, arrays, block=1000)
    monkeypatch.undo()
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo("node_feat.npy").file_size > 100
    for key, member in npz_members(path).items():
        assert member.data_offset % 64 == 0 and np.array_equal(member.mapped(), arrays[key])


def test_compressed_and_fortran_members(tmp_path: Path) -> None:
    arrays = _arrays()
    fortran = np.asfortranarray(arrays["node_feat"])
    path = tmp_path / "compressed.npz"
    np.savez_compressed(path, edge_index=arrays["edge_index"], fortran=fortran)
    members = npz_members(path)
    edge, f_member = members["edge_index"], members["fortran"]
    assert not edge.stored and f_member.fortran_order
    assert np.array_equal(edge.read(block_values=3), arrays["edge_index"])
    got = np.concatenate(list(edge.blocks(40, 70, 4)))  # a seek into the stream
    assert np.array_equal(got, arrays["edge_index"].reshape(-1)[40:70])
    # Blocks walk the storage order: column after column for a Fortran-ordered member.
    assert np.array_equal(_read_all(f_member, 4), fortran.reshape(-1, order="F"))
    with pytest.raises(ValueError, match="Fortran order"):
        f_member.read()
    with pytest.raises(ValueError, match="compressed"):
        edge.mapped()


def test_writer_refuses_a_wrong_number_of_values(tmp_path: Path) -> None:
    with NpzWriter(tmp_path / "short.npz") as npz, pytest.raises(ValueError, match="6 values"):
        npz.write("x", np.int64, (2, 4), [np.arange(6)])
    with NpzWriter(tmp_path / "long.npz") as npz, pytest.raises(ValueError, match="x"):
        npz.write("x", np.int64, (2,), [np.arange(2), np.arange(2)])


def test_damaged_archives_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.npz"
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        npz_members(missing)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="garbage.npz is not an .npz"):
        npz_members(garbage)
    path = tmp_path / "data.npz"
    _write(path, _arrays(), block=100)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated.npz"):
        npz_members(truncated)
    objects = tmp_path / "objects.npz"
    np.savez(objects, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="objects.npz.*pickle"):
        npz_members(objects)
    # A compressed member whose stream is damaged fails when read, naming file and key.
    compressed = tmp_path / "compressed.npz"
    np.savez_compressed(compressed, x=np.random.default_rng(0).standard_normal(20000))
    data = bytearray(compressed.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    compressed.write_bytes(bytes(data))
    member = npz_members(compressed)["x"]
    with pytest.raises(ValueError, match=r"compressed.npz: 'x'"):
        member.read(block_values=1000)
