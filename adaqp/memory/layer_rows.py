"""The rows each layer of a training step computes and exchanges, known before launch.

Under ``train.compute_rows = "loss"`` (``adaqp/graph/loss_rows.py``) layer l computes only
the rows within L - 1 - l hops of a training node, and its exchange moves only the halo
rows those read: a worker's activations and messages are sized by these counts, not by
its whole part. The trainer works them out at start-up, collectively (``rings`` and
``layer_rows``, one flag exchange per layer); the memory prediction must know them
before any process exists. ``partition_layer_counts`` gives the trainer's exact counts
from the partition files alone, in one process, and ``modelled_layer_counts`` an
estimate from a worker's sizes where there is no partition yet.

The flag exchange is simulated: a rank's flags on its halo rows, split by owner (the halo
is sorted by owner, ``recv_counts`` rows each), are that owner's flags on its send-list
segment for the rank; the part format stores, for every halo row, its local id on its
owner (``halo_owner_local``), which is what that segment of the owner's ``send_idx``
holds, in the same order (``adaqp/partitioning/parts.py``). So the owner's part need not be
loaded to set them. Counts do not depend on the order of the inner rows, so the part
files' own local numbering serves. Memory: per part a bool per inner node (the rows a
depth needs, O(N) over all parts), and one part's CSR at a time, memory-mapped where the
file stores it uncompressed (as ``np.savez`` does) and read a block of rows at a time;
each part is read once per layer. The files' checksums are not verified here (that reads
every feature): training verifies them.

Shapes: I inner rows, H halo rows, S rows sent (the send list), L layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adaqp.config.sections import COMPUTE_ROWS
from adaqp.data.npz_members import NpzMember, npz_members
from adaqp.graph.loss_rows import mark_reads
from adaqp.partitioning.schema import PartitionError, read_metadata

_EDGE_BLOCK = 1 << 22
"""In-edges read at a time (tens of MB of temporaries, however large the part)."""

_PART_ARRAYS = ("indptr", "indices", "train_mask", "halo_owner_local", "recv_counts")
"""What the counts read from a part file."""

HALO_READERS = 2.0
"""Rows of a part that read one of its halo rows, assumed without a partition (a cut's
in-edges per halo row: METIS's cuts of the graphs the tests use have 1.4 to 1.9). More
readers, a halo row read more often: 2 errs high, which a bound on memory prefers."""


@dataclass(frozen=True)
class LayerCounts:
    """What one layer of a training step computes and exchanges on one worker."""

    num_out: int
    """Output rows (the inner rows it computes)."""
    num_in: int
    """Inner input rows (the previous layer's output rows; layer 0: every inner row)."""
    num_halo: int
    """Halo rows its training exchange receives (0 for layer 0 when the layer-0 halo is
    cached: the rows arrived once, with the features, and nothing travels per step)."""
    num_send: int
    """Rows its training exchange sends, summed over the peers (0 where it is cached)."""


def _check(num_layers: int, compute_rows: str) -> None:
    if num_layers < 1:
        raise ValueError(f"num_layers must be at least 1, got {num_layers}")
    if compute_rows not in COMPUTE_ROWS:
        choices = ", ".join(COMPUTE_ROWS)
        raise ValueError(f"compute_rows must be one of {choices}, got {compute_rows!r}")


def _stored_array(member: NpzMember) -> np.ndarray:
    """A part file's array: mapped where the member is stored uncompressed and 1-D
    (nothing is read until used), else read."""
    if member.stored and len(member.shape) == 1:
        return member.mapped()
    return member.read()


def _part_arrays(part_dir: Path, meta: dict, rank: int) -> dict[str, np.ndarray]:
    """The arrays of part ``rank`` the counts read, checked against the metadata's sizes."""
    entry = meta["parts"][rank]
    path = part_dir / entry["file"]
    try:
        members = npz_members(path)
        arrays = {name: _stored_array(members[name]) for name in _PART_ARRAYS}
    except (OSError, KeyError, ValueError) as exc:  # npz_members names what is wrong
        raise PartitionError(f"cannot read {path}: {exc}; re-create the partition") from None
    sizes = {
        "indptr": entry["num_inner"] + 1,
        "indices": entry["num_edges"],
        "train_mask": entry["num_inner"],
        "halo_owner_local": entry["num_halo"],
        "recv_counts": len(meta["parts"]),
    }
    for name, size in sizes.items():
        if len(arrays[name]) != size:
            raise PartitionError(
                f"{path}: {name} has {len(arrays[name])} entries, the metadata says {size}; "
                "re-create the partition"
            )
    return arrays


def _reads(arrays: dict[str, np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bool [I], bool [H]): the inner and halo rows that the rows flagged in ``rows``
    read, the CSR taken a block of rows at a time and blocks without a flagged row skipped
    (their edges are never read from the file)."""
    indptr, indices = arrays["indptr"], arrays["indices"]
    inner = np.zeros(len(rows), dtype=bool)
    halo = np.zeros(len(arrays["halo_owner_local"]), dtype=bool)
    lo = 0
    while lo < len(rows):
        hi = int(np.searchsorted(indptr, indptr[lo] + _EDGE_BLOCK, side="right")) - 1
        hi = min(max(hi, lo + 1), len(rows))
        if rows[lo:hi].any():
            block = np.asarray(indptr[lo : hi + 1])
            mark_reads(block, indices[block[0] : block[-1]], rows[lo:hi], inner, halo)
        lo = hi
    return inner, halo


def partition_layer_counts(
    part_dir: str | Path, num_layers: int, cached_input: bool, compute_rows: str
) -> list[list[LayerCounts]]:
    """Each worker's counts, layer by layer (``[rank][layer]``), on the partition in
    ``part_dir``: those the trainer's ``layer_rows`` gives each rank (``compute_rows =
    "loss"``), or every row (``"all"``, ``LayerRows.whole``). ``cached_input``: the
    layer-0 halo is cached (``comm.cache_input_halo``; it takes effect from two parts
    on), so layer 0 exchanges nothing in training. One process, no process group.

    Raises:
        PartitionError: the partition is missing or its files disagree with its metadata.
        ValueError: ``num_layers`` below 1 or an unknown ``compute_rows``.
    """
    _check(num_layers, compute_rows)
    part_dir = Path(part_dir)
    meta = read_metadata(part_dir)
    entries = meta["parts"]
    num_parts = len(entries)
    cached = cached_input and num_parts > 1
    if compute_rows == "all":
        return [
            [
                LayerCounts(
                    num_out=entry["num_inner"],
                    num_in=entry["num_inner"],
                    num_halo=0 if cached and layer == 0 else entry["num_halo"],
                    num_send=0 if cached and layer == 0 else entry["num_send"],
                )
                for layer in range(num_layers)
            ]
            for entry in entries
        ]
    # needed[p]: part p's rows within d hops of a training row (rings 0..d), the output
    # rows of layer L - 1 - d; num_out / halo / send[d][p]: their count and the rows
    # their layer's exchange moves.
    needed = [
        np.array(_part_arrays(part_dir, meta, p)["train_mask"], dtype=bool)
        for p in range(num_parts)
    ]
    num_out = [[int(rows.sum()) for rows in needed]]
    halo = [[0] * num_parts for _ in range(num_layers)]
    send = [[0] * num_parts for _ in range(num_layers)]
    for depth in range(num_layers - 1 if cached else num_layers):
        # (Cached, layer 0's exchange is the cache's, made once before training.)
        below = [rows.copy() for rows in needed]
        for p in range(num_parts):
            arrays = _part_arrays(part_dir, meta, p)
            inner, halo_read = _reads(arrays, needed[p])
            below[p] |= inner
            halo[depth][p] = int(halo_read.sum())
            # Its flags on the halo rows q owns are q's on its send-list segment for p.
            owner_local, ends = arrays["halo_owner_local"], np.cumsum(arrays["recv_counts"])
            for q in range(num_parts):
                segment = slice(int(ends[q - 1]) if q else 0, int(ends[q]))
                flagged = np.asarray(owner_local[segment])[halo_read[segment]]
                send[depth][q] += len(flagged)
                below[q][flagged] = True
            del arrays, inner, halo_read
        needed = below
        num_out.append([int(rows.sum()) for rows in needed])
    counts = []
    for p, entry in enumerate(entries):
        layers: list[LayerCounts] = []
        for layer in range(num_layers):
            depth = num_layers - 1 - layer
            num_in = entry["num_inner"] if layer == 0 else layers[-1].num_out
            layers.append(LayerCounts(num_out[depth][p], num_in, halo[depth][p], send[depth][p]))
        counts.append(layers)
    return counts


def coverage(train_fraction: float, avg_degree: float, hops: int) -> float:
    """The modelled fraction of rows within ``hops`` hops of a training row: a row's
    ``hops``-hop in-neighbourhood, itself included, taken as (1 + d)^hops rows drawn
    independently, each training with probability t: 1 - (1 - t)^((1 + d)^hops), at most
    1 and t at 0 hops. Neighbourhoods that overlap (clustered graphs) make it an over-
    rather than an under-estimate."""
    t = min(max(train_fraction, 0.0), 1.0)
    if t >= 1.0:
        return 1.0
    size = (1.0 + max(avg_degree, 0.0)) ** hops
    return min(1.0, -math.expm1(size * math.log1p(-t)))


def modelled_layer_counts(
    num_inner: int,
    num_halo: int,
    num_send: int,
    num_train: int,
    avg_degree: float,
    num_layers: int,
    cached_input: bool,
    compute_rows: str,
) -> list[LayerCounts]:
    """One worker's counts, layer by layer, without a partition: from its sizes (I inner,
    H halo and S sent rows, T of the inner rows training, ``avg_degree`` in-edges per row)
    and ``coverage``. Layer l outputs ``coverage(T / I, d, L - 1 - l)`` of the inner rows
    (layer L - 1 the T training rows). Its exchange moves the halo rows that its output
    rows read, and the sent rows that the peers' output rows read: each such row assumed
    read by ``HALO_READERS`` rows, each an output row independently with that coverage c,
    so a share 1 - (1 - c)^HALO_READERS of the halo and of the send list. ``cached_input``
    and ``compute_rows`` as ``partition_layer_counts``' (the caller says whether the cache
    takes effect: from two workers on)."""
    _check(num_layers, compute_rows)
    t = num_train / num_inner if num_inner else 0.0
    layers: list[LayerCounts] = []
    for layer in range(num_layers):
        hops = num_layers - 1 - layer
        if compute_rows == "all":
            num_out, exchanged = num_inner, 1.0
        else:
            rows = coverage(t, avg_degree, hops)
            num_out = num_train if hops == 0 else min(num_inner, round(rows * num_inner))
            exchanged = 1.0 - (1.0 - rows) ** HALO_READERS
        if cached_input and layer == 0:
            exchanged = 0.0
        layers.append(
            LayerCounts(
                num_out=num_out,
                num_in=num_inner if layer == 0 else layers[-1].num_out,
                num_halo=min(num_halo, round(exchanged * num_halo)),
                num_send=min(num_send, round(exchanged * num_send)),
            )
        )
    return layers
