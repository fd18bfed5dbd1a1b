"""Rank 0's progress bar keeps the validation accuracy in sight at 80 columns: tqdm cuts
the end of a line too long for the terminal, where the accuracy used to be."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import termios

from tqdm import tqdm

from adaqp.run.job import _postfix
from adaqp.run.metrics import EpochRecord
from tests.run.test_job_progress import _read_all, _train


def test_an_80_column_bar_shows_the_validation_accuracy(monkeypatch):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    monkeypatch.delenv("COLUMNS", raising=False)
    with open(slave, "w", closefd=True) as stream:
        _train(monkeypatch, stream)
    out = _read_all(master)
    os.close(master)
    bars = [s for s in re.split(r"[\r\n]", out) if re.match(r"train: +\d+%.*/30 ", s)]
    drawn = [s for s in bars if "loss" in s]  # after the first epoch
    assert drawn and all("val=0.5000" in s and len(s) <= 80 for s in drawn), bars


def test_the_validation_accuracy_stays_in_a_long_run_at_80_columns():
    """Hours elapsed and left, and a slow epoch: the longest line tqdm draws."""
    record = EpochRecord(999, 1.2345, 100.1, 0.01, 0.0, 0.0, 0, val_acc=0.8123)
    line = tqdm.format_meter(
        999, 1000, 1e5, ncols=80, prefix="train", unit="epoch", postfix=_postfix(record)
    )
    assert "val=0.8123" in line and len(line) <= 80, line
