"""Tests for adaqp.data.npz: the npz file format, its reader and the errors it reports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adaqp.data import load_dataset, save_npz
from adaqp.data.graph import GRAPH_ARRAYS
from tests.data.helpers import _small_graph


def test_npz_round_trip(tmp_path: Path) -> None:
    g = _small_graph()
    path = tmp_path / "g.npz"
    save_npz(g, path)
    h = load_dataset("npz", path=path)
    assert h.fingerprint() == g.fingerprint()
    assert h.info["params"] == g.info["params"]


def test_npz_normalises_and_symmetrizes(tmp_path: Path) -> None:
    path = tmp_path / "raw.npz"
    n = 4
    np.savez(
        path,
        indptr=np.array([0, 3, 3, 4, 4], dtype=np.int32),
        indices=np.array([2, 0, 2, 1], dtype=np.int32),  # unsorted, self-loop, duplicate
        features=np.ones((n, 2)),
        labels=np.array([0, 1, 1, 0]),
        train_mask=np.array([1, 0, 0, 0], dtype=np.uint8),
        val_mask=np.zeros(n, bool),
        test_mask=np.zeros(n, bool),
        symmetrize=True,
    )
    g = load_dataset("npz", path=path)
    # Edges 2->0 and 1->2 plus reverses.
    np.testing.assert_array_equal(g.indptr, [0, 1, 2, 4, 4])
    np.testing.assert_array_equal(g.indices, [2, 2, 0, 1])
    assert g.num_classes == 2 and g.name == "raw" and g.features.dtype == np.float32


def test_npz_missing_key(tmp_path: Path) -> None:
    g = _small_graph()
    path = tmp_path / "bad.npz"
    np.savez(
        path,
        indptr=g.indptr,
        indices=g.indices,
        features=g.features,
        labels=g.labels,
        train_mask=g.train_mask,
        val_mask=g.val_mask,
    )
    with pytest.raises(ValueError, match=r"bad\.npz.*'test_mask'"):
        load_dataset("npz", path=path)
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        load_dataset("npz", path=tmp_path / "nope.npz")
    with pytest.raises(ValueError, match="path"):
        load_dataset("npz")


def test_npz_that_is_not_an_archive_or_is_damaged_is_named_as_such(tmp_path: Path) -> None:
    """numpy reads a file that is not a zip as an array or a pickle: a truncated archive
    or another format must not be reported as pickled data (nor end a rank silently)."""
    good = tmp_path / "good.npz"
    save_npz(_small_graph(), good)
    data = good.read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.npz").write_bytes(b"indptr,indices\n0,1\n")
    for name in ("truncated", "text"):
        with pytest.raises(ValueError, match=rf"{name}\.npz is not an \.npz archive") as info:
            load_dataset("npz", path=tmp_path / f"{name}.npz")
        assert "pickle" not in str(info.value)
    flipped = bytearray(data)
    flipped[200:400] = bytes(b ^ 0xFF for b in flipped[200:400])  # inside the first array
    (tmp_path / "flipped.npz").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=r"flipped\.npz is a damaged \.npz archive"):
        load_dataset("npz", path=tmp_path / "flipped.npz")


def _set(key: str, value: Any) -> Callable[[dict], None]:
    def apply(arrays: dict) -> None:
        arrays[key] = value(arrays[key]) if callable(value) else value

    return apply


def _non_monotone(indptr: np.ndarray) -> np.ndarray:
    indptr = indptr.copy()
    indptr[1], indptr[2] = indptr[2] + 1, indptr[1]  # keeps both ends, breaks the order
    return indptr


def _index(at: int, value: float) -> Callable[[np.ndarray], np.ndarray]:
    def apply(arr: np.ndarray) -> np.ndarray:
        arr = arr.copy()
        arr.reshape(-1)[at] = value
        return arr

    return apply


def _first_unlabelled(arrays: dict) -> None:
    arrays["labels"] = arrays["labels"].copy()
    arrays["labels"][np.flatnonzero(~arrays["train_mask"])[0]] = -2


# One bad input per row: how it is broken, and what the error must say.
_BAD_INPUTS = [
    (
        "label-too-large",
        _set("labels", lambda x: np.where(np.arange(len(x)) == 7, 8, x)),
        r"labels must lie in \[0, 8\).*got 8 at node 7",
    ),
    ("label-negative", _first_unlabelled, r"labels must lie in \[0, 8\).*got -2"),
    (
        "feature-nan",
        _set("features", _index(5 * 64 + 3, np.nan)),
        r"NaN or Inf \(first at node 5\)",
    ),
    ("feature-inf", _set("features", _index(9 * 64, -np.inf)), r"NaN or Inf \(first at node 9\)"),
    (
        "mask-length",
        _set("val_mask", lambda x: x[:-1]),
        r"val_mask has 299 rows, expected num_nodes=300",
    ),
    ("train-empty", _set("train_mask", lambda x: np.zeros_like(x)), r"train_mask is empty"),
    (
        "indptr-length",
        _set("indptr", lambda x: x[:-1]),
        r"indptr must start at 0 and end at len\(indices\)",
    ),
    ("indptr-order", _set("indptr", _non_monotone), r"indptr must be non-decreasing"),
    ("index-range", _set("indices", _index(11, 300)), r"indices must lie in \[0, 300\)"),
    (
        "feature-rows",
        _set("features", lambda x: x[:-2]),
        r"features has 298 rows, expected num_nodes=300",
    ),
]


@pytest.mark.parametrize(
    ("case", "corrupt", "message"), _BAD_INPUTS, ids=[c[0] for c in _BAD_INPUTS]
)
def test_load_rejects_bad_input(tmp_path: Path, case: str, corrupt, message: str) -> None:
    g = _small_graph()
    arrays = {key: getattr(g, key) for key in GRAPH_ARRAYS}
    corrupt(arrays)
    path = tmp_path / f"{case}.npz"
    np.savez(path, **arrays, num_classes=np.int64(g.num_classes), name=np.str_(f"bad-{case}"))
    # The message names the dataset (and its file) and the problem.
    with pytest.raises(ValueError, match=rf"^dataset 'bad-{case}' \(.*{case}\.npz\): .*{message}"):
        load_dataset("npz", path=path)
