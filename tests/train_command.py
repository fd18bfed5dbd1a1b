"""``python -m adaqp.train`` as a user runs it, for the tests that run the command: its
environment (one thread, this checkout first on the path), its arguments for the Cora
config, a run of it, and waiting on what a running one writes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def command_env() -> dict[str, str]:
    """This process's environment, with one thread per process and this checkout first."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_command(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """``args`` run in ``cwd`` under ``command_env``, its output captured as text."""
    return subprocess.run(
        args,
        cwd=cwd,
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def train_args(out: Path, parts: Path, *flags: str) -> list[str]:
    """One process training configs/cora-gcn.toml into ``out``, partitions in ``parts``."""
    return [
        sys.executable,
        "-m",
        "adaqp.train",
        "--config",
        str(ROOT / "configs/cora-gcn.toml"),
        "--out",
        str(out),
        "--set",
        f"partition.dir={parts}",
        "--set",
        "metrics.progress=false",
        *flags,
    ]


def wait_for(predicate: Callable[[], object], what: str, timeout: float = 180.0) -> None:
    """Polls ``predicate`` until it is true; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)
