"""Rank 0's progress (adaqp/run/progress.py): a bar on a terminal, of any reported size; a
log line every tenth of the run elsewhere; never neither. At 80 columns the bar keeps the
validation accuracy in sight: tqdm cuts the end of a line too long for the terminal, where
the accuracy used to be."""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import re
import struct
import sys
import termios

import pytest
import torch
from tqdm import tqdm

from adaqp.config import load_config
from adaqp.run.metrics import EpochRecord
from adaqp.run.progress import Progress, postfix
from adaqp.runtime import World

EPOCHS = 30
WORLD = World(0, 2, 0, 2, torch.device("cpu"), "gloo")


def _record(epoch: int) -> EpochRecord:
    return EpochRecord(epoch, 1.0 / epoch, 0.05, 0.01, 0.0, 0.0, 0, val_acc=0.5)


def _train(monkeypatch, stream) -> None:
    """Rank 0's progress over EPOCHS epochs, written to ``stream`` (as sys.stderr), with
    adaqp.train's log lines there too."""
    monkeypatch.setattr(sys, "stderr", stream)
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("adaqp.train")
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        progress = Progress(load_config(None, [f"train.epochs={EPOCHS}"]), WORLD)
        for epoch in range(1, EPOCHS + 1):
            progress(_record(epoch))
        progress.close()
    finally:
        logger.removeHandler(handler)


def _read_all(fd: int) -> str:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.parametrize(("rows", "columns"), [(0, 0), (24, 100), (0, 100)])
def test_a_terminal_gets_the_bar_whatever_size_it_reports(monkeypatch, rows, columns):
    """A terminal whose size was never set says 0 x 0 (``script`` without a terminal of
    its own): the bar used to be sized to that, which draws nothing, and the log lines
    left out for it, so the run showed no progress at all."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    assert tuple(os.get_terminal_size(slave)) == (columns, rows)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    with open(slave, "w", closefd=True) as stream:
        _train(monkeypatch, stream)
    out = _read_all(master)
    os.close(master)
    assert "train: 100%" in out and f"{EPOCHS}/{EPOCHS}" in out, out
    assert not re.search(r"epoch \d+/\d+ loss", out)  # the bar, not the lines
    # The time estimate took the bar's line, then the bar was drawn again below it.
    bar_then_estimate = re.search(r"train: +\d+%[^\r\n]*epoch 3 took", out)
    assert "epoch 3 took" in out and not bar_then_estimate, out
    width = max(len(seg) for seg in re.split(r"[\r\n]", out) if seg.startswith("train:"))
    assert width <= (columns or 80)


def test_elsewhere_a_line_every_tenth_of_the_run(monkeypatch, tmp_path):
    with open(tmp_path / "log", "w") as stream:
        _train(monkeypatch, stream)
    out = (tmp_path / "log").read_text()
    shown = [int(n) for n in re.findall(r"epoch (\d+)/30 loss", out)]
    assert shown == list(range(3, 31, 3)), out
    assert "epoch 3 took" in out and not re.search(r"train: +\d+%", out)


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
        999, 1000, 1e5, ncols=80, prefix="train", unit="epoch", postfix=postfix(record)
    )
    assert "val=0.8123" in line and len(line) <= 80, line
