"""The on-disk partition format: written by ``python -m partition``, read by each worker.

Layout of a partition directory::

    DIR/
      metadata.json        everything below, human readable
      part-00000.npz       part 0's arrays (numpy .npz, no pickled objects)
      part-00001.npz
      ...

``metadata.json`` fields:

- ``format`` ("adaqp-partition") and ``format_version`` (``FORMAT_VERSION``).
- ``dataset``: ``spec`` (what identifies the graph: name, split seed, generator
  parameters; matched against the run's config), ``fingerprint`` (content hash of the
  input graph), ``num_nodes``, ``num_edges``, ``feature_dim``, ``num_classes``,
  ``multilabel``, ``info`` (the loader's provenance record).
- ``params``: ``method``, ``num_parts``, ``seed``, ``balance_train``.
- ``edge_cut``: directed in-edges whose source lives on another part.
- ``parts``: one entry per part: ``file``, ``sha256`` of the file, ``num_inner``,
  ``num_halo``, ``num_edges``, ``num_train``, ``num_send`` (rows sent per exchange).
- ``balance``: max/mean of nodes, edges and training nodes per part.
- ``partition_time_s``.

Arrays in ``part-NNNNN.npz`` (local ids: inner nodes 0..I-1, halo nodes I..I+H-1):

- ``global_ids`` int64 [I]: global id of each inner node (ascending).
- ``features`` float32 [I, F]; ``labels`` int64 [I] (or float32 [I, C] if multilabel);
  ``train_mask``, ``val_mask``, ``test_mask`` bool [I].
- ``in_degree`` int64 [I]: global in-degree (no self-loop) of each inner node.
- ``indptr`` int64 [I+1], ``indices`` int64 [E]: CSR of the inner nodes' in-edges,
  sources as local ids (inner or halo).
- ``halo_global_ids`` int64 [H], ``halo_owner`` int64 [H] (owning part),
  ``halo_owner_local`` int64 [H] (local id on its owner), ``halo_degree`` int64 [H].
  Halo nodes are sorted by (owner, owner-local id), so rows received from each peer
  land contiguously and in order.
- ``send_idx`` int64 [S]: local ids of inner nodes to send, peer by peer in rank order;
  ``send_counts`` int64 [P], ``recv_counts`` int64 [P] (halo rows owned by each peer).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "adaqp-partition"
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"

PART_ARRAYS = {
    "global_ids": (np.int64, 1),
    "features": (np.float32, 2),
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
"""Every array a part file must hold: name -> (dtype or None if free, ndim or None)."""


class PartitionError(ValueError):
    """A partition directory is missing, corrupt, or does not match the run."""


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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def write_partition(out_dir: Path, metadata: dict[str, Any], parts: list[dict[str, np.ndarray]]):
    """Writes a whole partition atomically: into a sibling temp dir, then renamed.

    ``metadata["parts"][i]`` gains ``file`` and ``sha256``. An existing ``out_dir`` is
    replaced only after the new one is complete.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        for rank, arrays in enumerate(parts):
            missing = set(PART_ARRAYS) - set(arrays)
            if missing:
                raise ValueError(f"part {rank} lacks arrays {sorted(missing)}")
            path = tmp / part_file(rank)
            np.savez(path, **arrays)
            metadata["parts"][rank]["file"] = path.name
            metadata["parts"][rank]["sha256"] = sha256_file(path)
        (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def read_metadata(part_dir: Path) -> dict[str, Any]:
    """Reads and checks ``metadata.json``.

    Raises:
        PartitionError: the directory or file is missing, or not this format.
    """
    path = Path(part_dir) / METADATA_FILE
    if not path.is_file():
        raise PartitionError(f"no partition at {part_dir}: {path} is missing")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PartitionError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PartitionError(f"{path} is not an AdaQP partition (format field missing)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise PartitionError(
            f"{path} has format version {meta.get('format_version')}, this build reads "
            f"{FORMAT_VERSION}; re-create the partition"
        )
    for key in ("dataset", "params", "parts"):
        if key not in meta:
            raise PartitionError(f"{path} lacks the field {key!r}")
    if len(meta["parts"]) != meta["params"]["num_parts"]:
        raise PartitionError(
            f"{path}: {len(meta['parts'])} part entries for num_parts {meta['params']['num_parts']}"
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
) -> None:
    """Refuses a partition made from another graph or with other parameters."""
    wanted = {
        "num_parts": num_parts,
        "method": method,
        "seed": seed,
        "balance_train": balance_train,
    }
    made = {key: meta["params"].get(key) for key in wanted}
    if made["num_parts"] != num_parts:
        raise PartitionError(
            f"partition {part_dir} has {made['num_parts']} parts but the world size is "
            f"{num_parts}; launch {made['num_parts']} workers or use another partition dir"
        )
    if made != wanted:
        raise PartitionError(
            f"partition {part_dir} was made with {made}, this run asks for {wanted}; "
            "remove the directory or set partition.dir elsewhere"
        )
    if meta["dataset"]["spec"] != spec:
        raise PartitionError(
            f"partition {part_dir} was made from dataset {meta['dataset']['spec']}, this run "
            f"asks for {spec}; remove the directory or set partition.dir elsewhere"
        )


def load_part(part_dir: Path, rank: int, meta: dict[str, Any] | None = None) -> Part:
    """Loads one part, verifying its checksum and the arrays' dtypes and shapes.

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
    if sha256_file(path) != entry["sha256"]:
        raise PartitionError(
            f"partition file {path} does not match its checksum in {METADATA_FILE}; "
            "it was modified or truncated: re-create the partition"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (ValueError, OSError) as exc:
        raise PartitionError(f"cannot read {path}: {exc}") from None
    _check_arrays(arrays, path, entry, num_parts)
    return Part(rank=rank, num_parts=num_parts, arrays=arrays)


def _check_arrays(arrays: dict[str, np.ndarray], path: Path, entry: dict, num_parts: int):
    for name, (dtype, ndim) in PART_ARRAYS.items():
        if name not in arrays:
            raise PartitionError(f"{path} lacks the array {name!r}")
        if dtype is not None and arrays[name].dtype != dtype:
            raise PartitionError(f"{path}: {name} has dtype {arrays[name].dtype}, not {dtype}")
        if ndim is not None and arrays[name].ndim != ndim:
            raise PartitionError(f"{path}: {name} has {arrays[name].ndim} dims, not {ndim}")
    num_inner, num_halo = len(arrays["global_ids"]), len(arrays["halo_global_ids"])
    checks = [
        (num_inner == entry["num_inner"], "num_inner differs from metadata"),
        (num_halo == entry["num_halo"], "num_halo differs from metadata"),
        (len(arrays["indptr"]) == num_inner + 1, "indptr length"),
        (int(arrays["indptr"][-1]) == len(arrays["indices"]), "indptr end"),
        (
            all(
                len(arrays[k]) == num_inner
                for k in ("features", "labels", "train_mask", "val_mask", "test_mask", "in_degree")
            ),
            "per-node array lengths",
        ),
        (len(arrays["send_counts"]) == num_parts == len(arrays["recv_counts"]), "count lengths"),
        (int(arrays["send_counts"].sum()) == len(arrays["send_idx"]), "send_counts total"),
        (int(arrays["recv_counts"].sum()) == num_halo, "recv_counts total"),
        (
            len(arrays["indices"]) == 0
            or (arrays["indices"].min() >= 0 and arrays["indices"].max() < num_inner + num_halo),
            "edge sources out of range",
        ),
        (
            len(arrays["send_idx"]) == 0
            or (arrays["send_idx"].min() >= 0 and arrays["send_idx"].max() < num_inner),
            "send_idx out of range",
        ),
    ]
    for ok, what in checks:
        if not ok:
            raise PartitionError(f"{path} is inconsistent: {what}")
