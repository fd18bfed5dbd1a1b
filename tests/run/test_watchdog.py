"""StallWatch: a warning while an epoch runs too long, naming the rank and the epoch."""

from __future__ import annotations

import logging
import math
import time

from adaqp.run.watchdog import SLOWEST_FACTOR, StallWatch


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "adaqp.run.watchdog"]


def test_a_stalled_epoch_warns_naming_rank_epoch_and_timeout(caplog):
    caplog.set_level(logging.WARNING)
    watch = StallWatch(rank=3, warn_after_s=0.3, timeout_s=600, poll_s=0.05)
    try:
        start = time.monotonic()  # before at(): the elapsed time bounds the epoch's
        watch.at("epoch 7")
        time.sleep(1.0)
        deadline = start + 60  # a busy machine may hold the watch's thread back
        while not _warnings(caplog) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.close()
    elapsed = time.monotonic() - start
    warnings = _warnings(caplog)
    # At 0.3, 0.6, 1.2 s...: one each time the wait doubles, not one per poll (0.05 s).
    assert 1 <= len(warnings) <= math.log2(elapsed / 0.3) + 1, warnings
    assert warnings[0].startswith("rank 3: epoch 7 has run ")
    assert "comm.timeout_s = 600 s" in warnings[0]


def test_epochs_that_end_in_time_do_not_warn(caplog):
    caplog.set_level(logging.WARNING)
    watch = StallWatch(rank=0, warn_after_s=3.0, timeout_s=600, poll_s=0.02)
    try:
        for epoch in range(1, 6):
            watch.at(f"epoch {epoch}")
            time.sleep(0.05)
    finally:
        watch.close()
    assert _warnings(caplog) == []


def test_the_threshold_follows_the_longest_epoch():
    watch = StallWatch(rank=0, warn_after_s=0.01, timeout_s=600, poll_s=60)
    try:
        assert watch.threshold_s() == 0.01
        watch.at("epoch 1")
        time.sleep(0.2)
        watch.at("epoch 2")
        assert watch.longest_s >= 0.2
        assert watch.threshold_s() == SLOWEST_FACTOR * watch.longest_s
    finally:
        watch.close()


def test_zero_disables_the_watch():
    watch = StallWatch(rank=0, warn_after_s=0, timeout_s=600)
    assert watch._thread is None
    watch.at("epoch 1")
    watch.close()
    watch.close()  # idempotent
