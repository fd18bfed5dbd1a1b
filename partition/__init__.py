"""The partitioning tool: ``python -m partition --dataset NAME --num-parts P --out DIR``.

A thin entry point over :mod:`adaqp.partitioning`, which owns the cut, the build and
the on-disk format; nothing in ``adaqp`` imports this package. Its names are imported on
first use, so that ``python -m partition --help`` (which imports this package first)
needs neither numpy nor pymetis.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "assign_parts": "adaqp.partitioning.cut",
    "build_parts": "adaqp.partitioning.build",
    "make_partition": "adaqp.partitioning.build",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'partition' has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name]), name)
