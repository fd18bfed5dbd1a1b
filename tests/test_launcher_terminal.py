"""The launcher under a terminal (adaqp/launcher/output.py, run.py): the workers get a
terminal of a size their progress bar can be drawn in, and the bar comes through the
filter intact; without a terminal, the workers' log line every tenth of the run."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from adaqp.launcher.output import DEFAULT_SIZE, copy_size, stderr_pipe

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SH = ROOT / "launch" / "train.sh"
CORA = str(ROOT / "configs" / "cora-gcn.toml")


def _terminal(rows: int, columns: int) -> tuple[int, int]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    return master, slave


def _size(fd: int) -> tuple[int, int]:
    columns, rows = os.get_terminal_size(fd)
    return rows, columns


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [((40, 120), (40, 120)), ((0, 0), DEFAULT_SIZE), ((0, 120), (DEFAULT_SIZE[0], 120))],
)
def test_the_workers_terminal_has_our_size_or_a_default_and_follows_a_resize(
    monkeypatch, ours, theirs
):
    """A terminal whose size was never set (``script`` without a terminal of its own) says
    0 x 0; the workers' terminal got that too, and their bar was drawn in no columns."""
    master, slave = _terminal(*ours)
    with open(slave, "w") as stream:
        monkeypatch.setattr(sys, "stderr", stream)
        read_end, write_end = stderr_pipe()
        try:
            assert os.isatty(write_end) and _size(write_end) == theirs
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
            copy_size(read_end)  # what the launcher does on SIGWINCH
            assert _size(write_end) == (50, 150)
        finally:
            os.close(read_end)
            os.close(write_end)
    os.close(master)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "NNODES", "RESTARTS")}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    env.update(NPROC="2", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _in_terminal(command: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """Runs ``command`` with a new terminal of size 0 x 0 as its stdin, stdout and stderr
    (as ``script -qc`` gives one without a terminal of its own); returns (exit code,
    everything it wrote)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        command, cwd=cwd, env=_env(), stdin=slave, stdout=slave, stderr=slave,
        start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    return code, out.decode("utf-8", "replace")


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_a_run_shows_the_bar_on_a_terminal_and_log_lines_elsewhere(tmp_path, terminal):
    epochs = 30
    command = ["bash", str(TRAIN_SH), CORA, "--epochs", str(epochs)]
    command += ["--out", str(tmp_path / "run"), "--set", f"partition.dir={tmp_path / 'p'}"]
    if terminal:
        code, out = _in_terminal(command, tmp_path, timeout=300)
    else:
        run = subprocess.run(
            command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
        )
        code, out = run.returncode, run.stdout + run.stderr
    assert code == 0, out
    assert "test acc" in out, out
    lines = re.findall(rf"epoch (\d+)/{epochs} loss", out)
    if terminal:
        # The bar, whole (no byte of its blocks lost in the filter), and no log lines.
        assert re.search(rf"train: 100%\|[█#]+\| {epochs}/{epochs} \[", out), out
        assert "\ufffd" not in out and not lines, out
        # The time estimate took the bar's line; the bar was drawn again below it.
        assert not re.search(r"train: +\d+%[^\r\n]*epoch 3 took", out), out
    else:
        assert [int(n) for n in lines] == list(range(3, epochs + 1, 3)), out
        assert not re.search(r"train: +\d+%", out), out
