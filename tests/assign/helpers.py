"""Helpers shared by the tests of adaqp.assign: random instances, an enumeration of group
widths, comparing assignments."""

from __future__ import annotations

import numpy as np

from adaqp.assign import (
    Assignment,
    Channel,
    LinkModel,
)


def _expand(channels, bits, combo, groups):
    """Per-channel message widths of one combination."""
    out = [np.zeros(ch.num_messages, dtype=int) for ch in channels]
    for k, (ci, idx) in zip(combo, groups, strict=True):
        out[ci][idx] = sorted(bits)[k]
    return out


def _random_instance(rng, num_channels, max_messages, num_ranks=4, dim=None):
    pairs = [(p, q) for p in range(num_ranks) for q in range(num_ranks) if p != q]
    chosen = sorted(rng.choice(len(pairs), num_channels, replace=False))
    channels = [
        Channel(
            *pairs[i], rng.gamma(0.7, 1.0, rng.integers(1, max_messages + 1)) * rng.uniform(1, 10)
        )
        for i in chosen
    ]
    shape = (num_ranks, num_ranks)
    lm = LinkModel(rng.uniform(1e-6, 1e-4, shape), rng.uniform(1e7, 1e9, shape))
    return channels, lm, int(dim or rng.choice([8, 30, 64]))


def _same_bits(a: Assignment, b: Assignment) -> bool:
    return len(a.bits) == len(b.bits) and all(map(np.array_equal, a.bits, b.bits))
