"""The on-disk partition format: written by ``python -m partition``, read by each worker.

One import for everything the format offers; the code lives in two modules:

- :mod:`adaqp.partitioning.schema`: what a partition directory holds (``metadata.json`` with
  its fields and checksum, one ``part-NNNNN.npz`` of arrays per part, all documented there) and
  the checks that refuse a damaged directory or one made for another run (``read_metadata``,
  ``check_matches``).
- :mod:`adaqp.partitioning.store`: writing a directory atomically without removing files the
  format did not write (``write_partition``, ``check_target``), and loading one part after
  verifying its checksum (``load_part``, ``sha256_file``). No pickle: JSON metadata and
  ``numpy.load(..., allow_pickle=False)``.
"""

from __future__ import annotations

from adaqp.partitioning.schema import (
    CHECKSUM_KEY,
    FORMAT,
    FORMAT_VERSION,
    METADATA_FILE,
    PART_ARRAYS,
    Part,
    PartitionError,
    check_matches,
    metadata_checksum,
    part_file,
    read_metadata,
)
from adaqp.partitioning.store import (
    PartitionExists,
    check_target,
    load_part,
    sha256_file,
    write_partition,
)

__all__ = [
    "CHECKSUM_KEY",
    "FORMAT",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "PART_ARRAYS",
    "Part",
    "PartitionError",
    "PartitionExists",
    "check_matches",
    "check_target",
    "load_part",
    "metadata_checksum",
    "part_file",
    "read_metadata",
    "sha256_file",
    "write_partition",
]
