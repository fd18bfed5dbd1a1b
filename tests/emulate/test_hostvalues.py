"""One value for every host, or exactly one per host (adaqp.emulate.hostvalues)."""

from __future__ import annotations

import pytest

from adaqp.emulate.hostvalues import per_host


def test_one_value_for_all_or_one_per_host():
    assert per_host("bandwidth", "1gbit", 3) == ["1gbit"] * 3
    assert per_host("latency", " 1ms, ,2ms ", 3) == ["1ms", "", "2ms"]
    assert per_host("loss", "", 2) == ["", ""]
    with pytest.raises(ValueError, match="bandwidth has 2 values for 3 hosts: give one"):
        per_host("bandwidth", "1gbit,2gbit", 3)
    with pytest.raises(ValueError, match="2 values for 1 host:"):
        per_host("cpus", "1,2", 1)
