"""The partitioning tool: ``python -m partition --dataset NAME --num-parts P --out DIR``.

A thin entry point over :mod:`adaqp.partitioning`, which owns the cut, the build and
the on-disk format; nothing in ``adaqp`` imports this package.
"""

from adaqp.partitioning.build import build_parts, make_partition
from adaqp.partitioning.cut import assign_parts

__all__ = ["assign_parts", "build_parts", "make_partition"]
