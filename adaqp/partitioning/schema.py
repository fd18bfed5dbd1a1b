"""What a partition directory holds, and the checks that refuse a damaged or mismatched one.

Layout of a partition directory::

    DIR/
      metadata.json        everything below, human readable, checksummed
      part-00000.npz       part 0's arrays (numpy .npz, no pickled objects)
      part-00001.npz
      ...

``metadata.json`` fields:

- ``format`` ("adaqp-partition") and ``format_version`` (``FORMAT_VERSION``; version 1
  had no ``metadata_sha256`` and no ``stats`` and must be re-created).
- ``metadata_sha256``: sha256 of the canonical JSON (sorted keys, no spaces) of every
  other field; an edited count or edge cut is refused.
- ``dataset``: ``spec`` (what identifies the graph: name, split seed, generator
  parameters; matched against the run's config), ``fingerprint`` (content hash of the
  input graph), ``num_nodes``, ``num_edges``, ``feature_dim``, ``feature_dtype``
  (``float32``, or ``float16`` as OGB stores ogbn-papers100M's; absent counts as
  ``float32``), ``num_classes``, ``multilabel``, ``info`` (the loader's provenance
  record).
- ``params``: ``method``, ``num_parts``, ``seed``, ``balance_train``, ``objective``
  (METIS objective, ``cut`` or ``volume``; absent counts as ``cut``).
- ``edge_cut``: directed in-edges whose source lives on another part.
- ``parts``: one entry per part: ``file``, ``sha256`` of the file, ``num_inner``,
  ``num_halo``, ``num_edges``, ``num_train``, ``num_send`` (rows sent per exchange).
- ``balance``: max/mean of nodes, edges and training nodes per part.
- ``stats``: what the exchange will cost: ``edge_cut``, ``edge_cut_fraction``,
  ``halo_rows`` (halo nodes summed over parts), ``halo_rows_per_node`` (that / N),
  ``num_central`` and ``central_fraction`` (inner nodes with no in-edge from a halo
  node, summed over parts, and that / N), and ``parts``: per part ``edge_cut``,
  ``num_halo``, ``num_central``, ``central_fraction``.
- ``partition_time_s``.

Arrays in ``part-NNNNN.npz`` (local ids: inner nodes 0..I-1, halo nodes I..I+H-1):

- ``global_ids`` int64 [I]: global id of each inner node (ascending).
- ``features`` [I, F] of the dataset's ``feature_dtype`` (a worker makes them float32
  when it builds its tensors); ``labels`` int64 [I], -1 for an unlabelled node (or
  float32 [I, C] if multilabel); ``train_mask``, ``val_mask``, ``test_mask`` bool [I],
  which never select an unlabelled node.
- ``in_degree`` int64 [I]: global in-degree (no self-loop) of each inner node.
- ``indptr`` int64 [I+1], ``indices`` int64 [E]: CSR of the inner nodes' in-edges,
  sources as local ids (inner or halo).
- ``halo_global_ids`` int64 [H], ``halo_owner`` int64 [H] (owning part),
  ``halo_owner_local`` int64 [H] (local id on its owner), ``halo_degree`` int64 [H].
  Halo nodes are sorted by (owner, owner-local id), so rows received from each peer
  land contiguously and in order.
- ``send_idx`` int64 [S]: local ids of inner nodes to send, peer by peer in rank order;
  ``send_counts`` int64 [P], ``recv_counts`` int64 [P] (halo rows owned by each peer).

:mod:`adaqp.partitioning.store` writes and loads these files.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "adaqp-partition"
FORMAT_VERSION = 2
METADATA_FILE = "metadata.json"
CHECKSUM_KEY = "metadata_sha256"
PART_FILE_NAME = re.compile(r"part-\d{5}\.npz")
"""Matches (with ``fullmatch``) the names :func:`part_file` gives, and nothing else."""

PART_ARRAYS = {
    "global_ids": (np.int64, 1),
    "features": (None, 2),
    "labels": (None, None),
    "train_mask": (np.bool_, 1),
    "val_mask": (np.bool_, 1),
    "test_mask": (np.bool_, 1),
    "in_degree": (np.int64, 1),
    "indptr": (np.int64, 1),
    "indices": (np.int64, 1),
    "halo_global_ids": (np.int64, 1),
    "halo_owner": (np.int64, 1),
    "halo_owner_local": (np.int64, 1),
    "halo_degree": (np.int64, 1),
    "send_idx": (np.int64, 1),
    "send_counts": (np.int64, 1),
    "recv_counts": (np.int64, 1),
}
"""Every array a part file must hold: name -> (dtype or None if free, ndim or None); the
free ones are set by the metadata (:func:`check_part_arrays`)."""

_PART_ENTRY_KEYS = ("file", "sha256", "num_inner", "num_halo", "num_edges", "num_train", "num_send")


class PartitionError(ValueError):
    """A partition directory is missing, corrupt, unwritable, or does not match the run."""


@dataclass
class Part:
    """One part's arrays as loaded from disk (see the module docstring for shapes)."""

    rank: int
    num_parts: int
    arrays: dict[str, np.ndarray]

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def num_inner(self) -> int:
        return len(self.arrays["global_ids"])

    @property
    def num_halo(self) -> int:
        return len(self.arrays["halo_global_ids"])


def part_file(rank: int) -> str:
    return f"part-{rank:05d}.npz"


def metadata_checksum(meta: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``meta`` without its ``metadata_sha256`` field."""
    body = {key: value for key, value in meta.items() if key != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def read_metadata(part_dir: Path) -> dict[str, Any]:
    """Reads ``metadata.json`` and checks its format, version, checksum and fields.

    Raises:
        PartitionError: the directory or file is missing, edited, or not this format.
    """
    path = Path(part_dir) / METADATA_FILE
    if not path.is_file():
        raise PartitionError(f"no partition at {part_dir}: {path} is missing")
    try:
        meta = json.loads(path.read_text())
    except OSError as exc:
        raise PartitionError(f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise PartitionError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PartitionError(f"{path} is not an AdaQP partition (format field missing)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise PartitionError(
            f"{path} has format version {meta.get('format_version')}, this build reads "
            f"{FORMAT_VERSION}; re-create the partition (python -m partition ... --out "
            f"{part_dir} --force, or remove the directory)"
        )
    if meta.get(CHECKSUM_KEY) != metadata_checksum(meta):
        raise PartitionError(
            f"{path} does not match its {CHECKSUM_KEY}: the metadata was edited or "
            "damaged; re-create the partition (python -m partition ... --force)"
        )
    for key in ("dataset", "params", "parts", "edge_cut"):
        if key not in meta:
            raise PartitionError(f"{path} lacks the field {key!r}")
    num_parts = meta["params"].get("num_parts")
    if not isinstance(meta["parts"], list) or len(meta["parts"]) != num_parts:
        raise PartitionError(f"{path}: the part entries do not match num_parts {num_parts}")
    for rank, entry in enumerate(meta["parts"]):
        lacking = [key for key in _PART_ENTRY_KEYS if key not in entry]
        if lacking:
            raise PartitionError(f"{path}: part {rank} lacks {lacking}")
        if entry["file"] != part_file(rank):
            raise PartitionError(f"{path}: part {rank} names the file {entry['file']!r}")
    for count, total in (("num_inner", "num_nodes"), ("num_edges", "num_edges")):
        added = sum(entry[count] for entry in meta["parts"])
        if added != meta["dataset"].get(total):
            raise PartitionError(
                f"{path}: the parts' {count} add up to {added}, not the dataset's "
                f"{total} {meta['dataset'].get(total)}"
            )
    return meta


def check_matches(
    meta: dict[str, Any],
    part_dir: Path,
    *,
    spec: dict[str, Any],
    num_parts: int,
    method: str,
    seed: int,
    balance_train: bool,
    objective: str | None = None,
    tool: bool = False,
) -> None:
    """Refuses a partition made from another graph or with other parameters.

    ``objective`` None leaves the METIS objective unchecked (for callers that do not
    know it); metadata without one counts as ``cut``. The message says what differs and
    what to do: for a training run (the default), use another number of workers, delete
    the directory (rank 0 then makes it again) or set ``partition.dir`` elsewhere; for the
    partition tool (``tool``), pass ``--force`` or choose another ``--out``.
    """
    wanted = {
        "num_parts": num_parts,
        "method": method,
        "seed": seed,
        "balance_train": balance_train,
    }
    made = {key: meta["params"].get(key) for key in wanted}
    if objective is not None:
        wanted["objective"] = objective
        made["objective"] = meta["params"].get("objective", "cut")
    if tool:
        remedy = "pass --force to re-create it (replacing the one there), or choose another --out"
    else:
        remedy = (
            f"delete {part_dir} (rank 0 then partitions the graph again) or pass another "
            "directory with --set partition.dir=DIR"
        )
    if made["num_parts"] != num_parts:
        if tool:
            raise PartitionError(
                f"partition {part_dir} has {made['num_parts']} parts, not the {num_parts} "
                f"asked for; {remedy}"
            )
        raise PartitionError(
            f"partition {part_dir} has {made['num_parts']} parts but the world size is "
            f"{num_parts}; launch {made['num_parts']} workers, or {remedy}"
        )
    asker = "this command" if tool else "this run"
    if made != wanted:
        raise PartitionError(
            f"partition {part_dir} was made with {made}, {asker} asks for {wanted}; {remedy}"
        )
    if meta["dataset"]["spec"] != spec:
        raise PartitionError(
            f"partition {part_dir} was made from dataset {meta['dataset']['spec']}, {asker} "
            f"asks for {spec}; {remedy}"
        )


def _in_range(values: np.ndarray, low: int, high: int) -> bool:
    return len(values) == 0 or (int(values.min()) >= low and int(values.max()) < high)


def check_part_arrays(
    arrays: dict[str, np.ndarray], path: Path, meta: dict[str, Any], rank: int
) -> None:
    """Checks one part's arrays against the format and the metadata; the first failure
    raises ``PartitionError`` naming the file and the array."""

    def fail(what: str):
        raise PartitionError(f"{path} is inconsistent: {what}; re-create the partition")

    dataset, entry = meta["dataset"], meta["parts"][rank]
    num_parts = meta["params"]["num_parts"]
    multilabel = bool(dataset.get("multilabel"))
    expected = dict(PART_ARRAYS)
    expected["labels"] = (np.float32, 2) if multilabel else (np.int64, 1)
    expected["features"] = (np.dtype(dataset.get("feature_dtype", "float32")), 2)
    for name, (dtype, ndim) in expected.items():
        if name not in arrays:
            fail(f"it lacks the array {name!r}")
        array = arrays[name]
        if array.dtype != dtype:
            fail(f"{name} has dtype {array.dtype}, not {np.dtype(dtype)}")
        if array.ndim != ndim:
            fail(f"{name} has {array.ndim} dims, not {ndim}")

    num_inner, num_halo = len(arrays["global_ids"]), len(arrays["halo_global_ids"])
    if num_inner != entry["num_inner"]:
        fail(f"global_ids has {num_inner} rows, the metadata says {entry['num_inner']}")
    if num_halo != entry["num_halo"]:
        fail(f"halo_global_ids has {num_halo} rows, the metadata says {entry['num_halo']}")
    per_node = ("features", "labels", "train_mask", "val_mask", "test_mask", "in_degree")
    for name in per_node:
        if len(arrays[name]) != num_inner:
            fail(f"{name} has {len(arrays[name])} rows for {num_inner} inner nodes")
    for name in ("halo_owner", "halo_owner_local", "halo_degree"):
        if len(arrays[name]) != num_halo:
            fail(f"{name} has {len(arrays[name])} rows for {num_halo} halo nodes")
    if arrays["features"].shape[1] != dataset["feature_dim"]:
        fail(f"features have {arrays['features'].shape[1]} columns, not {dataset['feature_dim']}")
    if multilabel and arrays["labels"].shape[1] != dataset["num_classes"]:
        fail(f"labels have {arrays['labels'].shape[1]} columns, not {dataset['num_classes']}")
    if int(arrays["train_mask"].sum()) != entry["num_train"]:
        fail(f"train_mask holds {int(arrays['train_mask'].sum())} nodes, not {entry['num_train']}")
    for name in ("train_mask", "val_mask", "test_mask"):
        if not multilabel and (arrays["labels"][arrays[name]] < 0).any():
            fail(f"{name} selects an unlabelled node (label -1): it would be trained or scored")

    num_nodes = dataset["num_nodes"]
    if (
        not _in_range(arrays["global_ids"], 0, num_nodes)
        or (np.diff(arrays["global_ids"]) <= 0).any()
    ):
        fail(f"global_ids are not ascending ids in [0, {num_nodes})")
    if not _in_range(arrays["halo_global_ids"], 0, num_nodes):
        fail(f"halo_global_ids out of range [0, {num_nodes})")

    indptr, indices = arrays["indptr"], arrays["indices"]
    if len(indptr) != num_inner + 1 or int(indptr[0]) != 0:
        fail(f"indptr must have {num_inner + 1} entries starting at 0")
    if (np.diff(indptr) < 0).any():
        fail("indptr is not monotone (non-decreasing)")
    if int(indptr[-1]) != len(indices) or len(indices) != entry["num_edges"]:
        fail(
            f"indptr ends at {int(indptr[-1])} for {len(indices)} indices, "
            f"the metadata says {entry['num_edges']} edges"
        )
    if not _in_range(indices, 0, num_inner + num_halo):
        fail(f"edge sources (indices) out of range [0, {num_inner + num_halo})")
    if (arrays["in_degree"] < 0).any() or (arrays["halo_degree"] < 0).any():
        fail("negative degrees")

    owner, owner_local = arrays["halo_owner"], arrays["halo_owner_local"]
    if not _in_range(owner, 0, num_parts) or (owner == rank).any() or (np.diff(owner) < 0).any():
        fail(f"halo_owner must be sorted part ids in [0, {num_parts}) other than {rank}")
    owner_inner = np.array([e["num_inner"] for e in meta["parts"]], dtype=np.int64)
    if len(owner) and ((owner_local < 0).any() or (owner_local >= owner_inner[owner]).any()):
        fail("halo_owner_local out of range of the owners' inner nodes")

    send_counts, recv_counts = arrays["send_counts"], arrays["recv_counts"]
    if len(send_counts) != num_parts or len(recv_counts) != num_parts:
        fail(f"send_counts / recv_counts must have {num_parts} entries")
    if (send_counts < 0).any() or int(send_counts.sum()) != len(arrays["send_idx"]):
        fail(f"send_counts do not add up to the {len(arrays['send_idx'])} rows of send_idx")
    if len(arrays["send_idx"]) != entry["num_send"]:
        fail(f"send_idx has {len(arrays['send_idx'])} rows, the metadata says {entry['num_send']}")
    if not np.array_equal(recv_counts, np.bincount(owner, minlength=num_parts)):
        fail("recv_counts differ from the halo rows owned by each peer")
    if not _in_range(arrays["send_idx"], 0, num_inner):
        fail(f"send_idx out of range [0, {num_inner})")
