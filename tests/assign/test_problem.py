"""The problem's building blocks (adaqp.assign.problem): validation of channels and solver
inputs, and the canonical order of a channel's group widths."""

from __future__ import annotations

import numpy as np
import pytest

from adaqp.assign import (
    Channel,
    LinkModel,
    solve_assignment,
)


def test_invalid_inputs():
    lm = LinkModel.uniform(2, 1e-5, 1e9)
    with pytest.raises(ValueError):
        Channel(1, 1, np.ones(3))
    with pytest.raises(ValueError):
        Channel(0, 1, -np.ones(3))
    bad = [
        dict(channels=[Channel(0, 1, np.ones(3)), Channel(0, 1, np.ones(2))]),
        dict(channels=[Channel(0, 2, np.ones(3))]),
        dict(lam=1.5),
        dict(bits=(2, 3)),
        dict(method="simplex"),
    ]
    for kw in bad:
        kw = {"channels": [Channel(0, 1, np.ones(3))], **kw}
        with pytest.raises(ValueError):
            solve_assignment(kw.pop("channels"), 8, lm, **kw)


def test_sorting_full_groups_canonicalises_without_cost():
    # Private helper: solvers rarely return unsorted ties, so exercise it directly.
    from adaqp.assign.problem import LinkProblem, sort_full_groups

    channels = [
        Channel(0, 1, np.array([5.0, 1.0, 3.0, 3.0, 2.0, 0.5, 0.1])),
        Channel(1, 0, np.ones(4)),
    ]
    p = LinkProblem(channels, 16, LinkModel.uniform(2, 1e-5, 1e8), (2, 4, 8), 2, 0.5)
    k = np.array([0, 2, 1, 2, 0, 2], dtype=np.int64)  # groups: 4 in channel 0 (last of 1), 2 in 1
    out = sort_full_groups(p, k)
    assert out.tolist() == [2, 1, 0, 2, 2, 0]  # the 1-message tail group keeps its width
    assert np.array_equal(p.channel_bytes(out), p.channel_bytes(k))
    assert p.objective(out) < p.objective(k)
