"""The partition format: damaged directories are refused by name, writes never lose files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from adaqp.data import SyntheticSpec, load_dataset
from adaqp.partitioning import schema, store
from adaqp.partitioning.build import make_partition


@pytest.fixture(scope="module")
def graph():
    spec = SyntheticSpec(num_nodes=300, num_classes=3, avg_degree=6, feature_dim=5, seed=1)
    return load_dataset("synthetic", synthetic=spec)


@pytest.fixture(scope="module")
def base(graph, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base") / "parts"
    make_partition(graph, out, num_parts=2, spec={"name": graph.name})
    return out


@pytest.fixture
def copy(base, tmp_path) -> Path:
    out = tmp_path / "parts"
    shutil.copytree(base, out)
    return out


def _load_all(part_dir: Path) -> None:
    meta = schema.read_metadata(part_dir)
    for rank in range(meta["params"]["num_parts"]):
        store.load_part(part_dir, rank, meta)


def _edit_meta(part_dir: Path, edit, *, resign: bool = True) -> None:
    path = part_dir / schema.METADATA_FILE
    meta = json.loads(path.read_text())
    edit(meta)
    if resign:
        meta[schema.CHECKSUM_KEY] = schema.metadata_checksum(meta)
    path.write_text(json.dumps(meta, indent=2))


def _resign_part(part_dir: Path, rank: int) -> None:
    """Makes the metadata vouch for part ``rank`` as it is now: the structural checks
    behind the checksums must catch what a buggy writer could produce."""
    digest = store.sha256_file(part_dir / schema.part_file(rank))
    _edit_meta(part_dir, lambda meta: meta["parts"][rank].update(sha256=digest))


def _rewrite_arrays(part_dir: Path, rank: int, edit) -> None:
    path = part_dir / schema.part_file(rank)
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    edit(arrays)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    _resign_part(part_dir, rank)


def _set(name, make):
    return lambda arrays: arrays.__setitem__(name, make(arrays))


def _raw(edit_bytes, resign: bool):
    def apply(part_dir: Path) -> None:
        path = part_dir / schema.part_file(1)
        path.write_bytes(edit_bytes(bytearray(path.read_bytes())))
        if resign:
            _resign_part(part_dir, 1)

    return apply


def _flip(data: bytearray) -> bytes:
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


def _arrays(edit):
    return lambda part_dir: _rewrite_arrays(part_dir, 1, edit)


def _move_inner_count(meta):
    """Keeps the totals right, so only the part files can tell."""
    moved = meta["parts"][1]["num_inner"] - 1
    meta["parts"][0]["num_inner"] += moved
    meta["parts"][1]["num_inner"] = 1


def _reversed_indptr(a):
    indptr = a["indptr"].copy()
    indptr[1], indptr[2] = indptr[2] + 1, indptr[1]
    return indptr


# (case, damage done to a copy of a good 2-part partition, what the error must say)
CORRUPTIONS = [
    ("truncated", _raw(lambda b: bytes(b[: len(b) // 2]), False), "does not match its checksum"),
    ("truncated, re-signed", _raw(lambda b: bytes(b[: len(b) // 2]), True), "cannot read"),
    ("bit flip", _raw(_flip, False), "does not match its checksum"),
    ("bit flip, re-signed", _raw(_flip, True), "cannot read.*CRC"),
    ("not a zip, re-signed", _raw(lambda b: b"garbage" * 10, True), "cannot read"),
    ("empty file, re-signed", _raw(lambda b: b"", True), "cannot read"),
    ("missing part file", lambda d: (d / schema.part_file(1)).unlink(), "is missing"),
    ("missing array", _arrays(lambda a: a.pop("halo_degree")), "lacks the array 'halo_degree'"),
    (
        "object array",
        _arrays(_set("labels", lambda a: a["labels"].astype(object))),
        "cannot read",
    ),
    (
        "features too few rows",
        _arrays(_set("features", lambda a: a["features"][:-1])),
        "features has .* rows for",
    ),
    (
        "features wrong width",
        _arrays(_set("features", lambda a: a["features"][:, :-1])),
        "features have 4 columns, not 5",
    ),
    (
        "features float64",
        _arrays(_set("features", lambda a: a["features"].astype(np.float64))),
        "features has dtype float64",
    ),
    (
        "global_ids int32",
        _arrays(_set("global_ids", lambda a: a["global_ids"].astype(np.int32))),
        "global_ids has dtype int32, not int64",
    ),
    (
        "indices int32",
        _arrays(_set("indices", lambda a: a["indices"].astype(np.int32))),
        "indices has dtype int32",
    ),
    ("labels 2-d", _arrays(_set("labels", lambda a: a["labels"][:, None])), "labels has 2 dims"),
    ("indptr not monotone", _arrays(_set("indptr", _reversed_indptr)), "not monotone"),
    ("rewritten unchanged (control: must load)", _arrays(lambda a: None), None),
    (
        "indptr wrong end",
        _arrays(_set("indptr", lambda a: np.append(a["indptr"][:-1], a["indptr"][-1] + 1))),
        "indptr ends at",
    ),
    (
        "indptr not starting at 0",
        _arrays(_set("indptr", lambda a: a["indptr"] + 1)),
        "indptr must have .* starting at 0",
    ),
    (
        "indices out of range",
        _arrays(_set("indices", lambda a: np.where(a["indices"] == 0, 10**6, a["indices"]))),
        r"indices\) out of range",
    ),
    (
        "negative index",
        _arrays(_set("indices", lambda a: np.where(a["indices"] == 0, -1, a["indices"]))),
        r"indices\) out of range",
    ),
    (
        "send_idx out of range",
        _arrays(_set("send_idx", lambda a: a["send_idx"] + len(a["global_ids"]))),
        "send_idx out of range",
    ),
    (
        "send_counts wrong total",
        _arrays(_set("send_counts", lambda a: a["send_counts"] + 1)),
        "send_counts do not add up",
    ),
    (
        "recv_counts swapped",
        _arrays(_set("recv_counts", lambda a: a["recv_counts"][::-1].copy())),
        "recv_counts differ",
    ),
    (
        "halo owned by itself",
        _arrays(_set("halo_owner", lambda a: np.ones_like(a["halo_owner"]))),
        "halo_owner must be",
    ),
    (
        "halo_owner_local past the owner",
        _arrays(_set("halo_owner_local", lambda a: a["halo_owner_local"] + 10**6)),
        "halo_owner_local out of range",
    ),
    (
        "global ids not ascending",
        _arrays(_set("global_ids", lambda a: a["global_ids"][::-1].copy())),
        "global_ids are not ascending",
    ),
    (
        "train mask differs from metadata",
        _arrays(_set("train_mask", lambda a: ~a["train_mask"])),
        "train_mask holds",
    ),
    ("missing metadata", lambda d: (d / schema.METADATA_FILE).unlink(), "no partition at"),
    (
        "metadata edge_cut edited",
        lambda d: _edit_meta(d, lambda m: m.update(edge_cut=0), resign=False),
        "metadata.json does not match its metadata_sha256",
    ),
    (
        "metadata count edited",
        lambda d: _edit_meta(d, lambda m: m["parts"][1].update(num_inner=1), resign=False),
        "does not match its metadata_sha256",
    ),
    (
        "metadata checksum removed",
        lambda d: _edit_meta(d, lambda m: m.pop(schema.CHECKSUM_KEY), resign=False),
        "does not match its metadata_sha256",
    ),
    (
        "metadata count edited, re-signed",
        lambda d: _edit_meta(d, lambda m: m["parts"][1].update(num_inner=1)),
        "num_inner add up to",
    ),
    (
        "counts moved between parts, re-signed",
        lambda d: _edit_meta(d, _move_inner_count),
        "part-00000.npz is inconsistent: global_ids has .* rows, the metadata says",
    ),
    (
        "part file outside the directory",
        lambda d: _edit_meta(d, lambda m: m["parts"][1].update(file="../part-00001.npz")),
        "part 1 names the file",
    ),
    (
        "format version 1",
        lambda d: _edit_meta(d, lambda m: m.update(format_version=1)),
        "format version 1, this build reads 2; re-create the partition",
    ),
    ("metadata not json", lambda d: (d / schema.METADATA_FILE).write_text("{"), "not valid JSON"),
]


@pytest.mark.parametrize(
    "damage,expected", [c[1:] for c in CORRUPTIONS], ids=[c[0] for c in CORRUPTIONS]
)
def test_damaged_partition_is_refused_naming_the_file(copy, damage, expected):
    _load_all(copy)  # the copy is good before the damage
    damage(copy)
    if expected is None:
        _load_all(copy)
        return
    with pytest.raises(schema.PartitionError, match=expected) as info:
        _load_all(copy)
    assert str(copy) in str(info.value)


def test_resigned_arrays_really_changed(copy):
    """The re-signing helper must not hide the damage: the control case above shows an
    unchanged rewrite loads, this one that a real change reaches the checks."""
    _rewrite_arrays(copy, 1, _set("send_idx", lambda a: a["send_idx"] + 10**6))
    with np.load(copy / schema.part_file(1)) as data:
        assert data["send_idx"].min() >= 10**6
    with pytest.raises(schema.PartitionError):
        _load_all(copy)


def test_metadata_checksum_is_written_and_canonical(base):
    meta = schema.read_metadata(base)
    assert meta[schema.CHECKSUM_KEY] == schema.metadata_checksum(meta)
    assert (
        schema.metadata_checksum({**meta, "edge_cut": meta["edge_cut"] + 1})
        != meta[schema.CHECKSUM_KEY]
    )


# --- writing --------------------------------------------------------------------------


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_foreign_directory_is_refused_and_left_intact(graph, tmp_path):
    out = tmp_path / "scratch"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("keep")
    (out / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = _tree(out)
    with pytest.raises(schema.PartitionError, match="not an AdaQP partition.*nothing was removed"):
        make_partition(graph, out, num_parts=2, spec={})
    assert _tree(out) == before and sorted(os.listdir(out)) == ["notes.txt", "sub"]
    assert sorted(os.listdir(tmp_path)) == ["scratch"]  # no staging leftovers


def test_foreign_metadata_file_is_not_ours(graph, tmp_path):
    out = tmp_path / "scratch"
    out.mkdir()
    (out / schema.METADATA_FILE).write_text('{"format": "someone-else"}')
    with pytest.raises(schema.PartitionError, match="not an AdaQP partition"):
        make_partition(graph, out, num_parts=2, spec={})
    assert (out / schema.METADATA_FILE).read_text() == '{"format": "someone-else"}'


def test_leftovers_of_an_interrupted_write_are_named(graph, tmp_path):
    out = tmp_path / "parts"
    out.mkdir()
    (out / schema.part_file(0)).write_bytes(b"half")
    with pytest.raises(schema.PartitionError, match="interrupted write"):
        make_partition(graph, out, num_parts=2, spec={})
    assert (out / schema.part_file(0)).read_bytes() == b"half"


def test_empty_directory_is_used(graph, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    make_partition(graph, out, num_parts=2, spec={})
    _load_all(out)
    assert sorted(os.listdir(out)) == [
        schema.METADATA_FILE,
        schema.part_file(0),
        schema.part_file(1),
    ]


def test_rewrite_replaces_only_the_files_it_wrote(graph, tmp_path):
    out = tmp_path / "parts"
    make_partition(graph, out, num_parts=3, spec={})
    (out / "README.txt").write_text("mine")
    (out / "part-00099.npz").write_text("not listed in the metadata, so not ours")
    make_partition(graph, out, num_parts=2, spec={})
    _load_all(out)
    assert sorted(os.listdir(out)) == [
        "README.txt",
        schema.METADATA_FILE,
        schema.part_file(0),
        schema.part_file(1),
        "part-00099.npz",
    ]
    assert (out / "README.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["parts"]


def _fail_on_call(monkeypatch, target, name: str, when):
    real = getattr(target, name)

    def failing(*args, **kwargs):
        if when(*args):
            raise OSError(28, "No space left on device (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)


def test_crash_while_staging_leaves_nothing_or_the_old_partition(graph, tmp_path, monkeypatch):
    fresh, old = tmp_path / "fresh", tmp_path / "old"
    make_partition(graph, old, num_parts=2, spec={"v": 1})
    before = _tree(old)
    calls = []
    _fail_on_call(monkeypatch, store.np, "savez", lambda *a: calls.append(1) or len(calls) == 2)
    with pytest.raises(schema.PartitionError, match="cannot write a partition to .*fresh"):
        make_partition(graph, fresh, num_parts=2, spec={"v": 2})
    assert not fresh.exists()
    calls.clear()
    with pytest.raises(schema.PartitionError, match="No space left"):
        make_partition(graph, old, num_parts=2, spec={"v": 2})
    assert _tree(old) == before  # untouched, and no staging directory left inside
    assert schema.read_metadata(old)["dataset"]["spec"] == {"v": 1}
    assert sorted(os.listdir(tmp_path)) == ["old"]


def test_crash_while_swapping_leaves_no_complete_looking_directory(graph, tmp_path, monkeypatch):
    out = tmp_path / "parts"
    make_partition(graph, out, num_parts=2, spec={"v": 1})
    _fail_on_call(monkeypatch, store.os, "replace", lambda src, dst: str(dst).endswith(".json"))
    with pytest.raises(schema.PartitionError):
        make_partition(graph, out, num_parts=2, spec={"v": 2})
    monkeypatch.undo()
    with pytest.raises(schema.PartitionError, match="no partition at"):
        schema.read_metadata(out)
    with pytest.raises(schema.PartitionError, match="interrupted write"):
        make_partition(graph, out, num_parts=2, spec={"v": 3})


@pytest.mark.parametrize(
    "where,expected",
    [
        (lambda tmp: tmp / "file", "exists and is not a directory"),
        (lambda tmp: tmp / "file" / "parts", "Not a directory"),
        (lambda tmp: Path("/proc/adaqp-parts"), "cannot write a partition to /proc/adaqp-parts"),
        (lambda tmp: Path("/proc/self/parts"), "cannot create files in /proc/self"),
    ],
    ids=["existing file", "under a file", "under /proc", "under /proc/self"],
)
def test_unwritable_target_is_a_clear_error(graph, tmp_path, where, expected):
    (tmp_path / "file").write_text("x")
    out = where(tmp_path)
    if str(out).startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    with pytest.raises(schema.PartitionError, match=expected):
        make_partition(graph, out, num_parts=2, spec={})
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_read_only_directory_is_read_but_not_rewritten(graph, copy):
    copy.chmod(0o555)
    try:
        _load_all(copy)
        with pytest.raises(schema.PartitionError, match="Permission denied"):
            make_partition(graph, copy, num_parts=2, spec={})
        _load_all(copy)
    finally:
        copy.chmod(0o755)


def test_permission_error_is_a_clear_error(graph, copy, monkeypatch):
    """Runs as root too: a write refused by the file system, wherever it happens."""
    before = _tree(copy)
    real_mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):
        if self.parent == copy or self == copy:
            raise PermissionError(13, "Permission denied (injected)", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(schema.PartitionError, match="cannot write a partition to .*Permission"):
        make_partition(graph, copy, num_parts=2, spec={})
    monkeypatch.undo()
    assert _tree(copy) == before
    _load_all(copy)
