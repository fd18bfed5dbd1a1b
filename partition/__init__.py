"""The partitioning tool: ``python -m partition --dataset NAME --num-parts P --out DIR``."""

from partition.assign import assign_parts
from partition.build import build_parts, make_partition

__all__ = ["assign_parts", "build_parts", "make_partition"]
