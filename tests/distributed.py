"""Spawns real gloo worker processes for multi-process tests.

``run_workers(fn, world_size, tmp_path, *args)`` starts ``world_size`` processes that call
``fn(rank, world_size, init_method, *args)`` and rendezvous through a file in
``tmp_path``. The processes are forked from a server process that has imported torch and
adaqp once (multiprocessing's forkserver): a fresh interpreter importing them costs
seconds of CPU per rank, which on two cores is most of a short distributed test. The
server imports and starts nothing else (no thread, no process group), so each rank begins
as a new process would. It fails the test on a hang (with every process killed), on a
signal, on a non-zero exit, and shows each failing child's traceback. ``fn`` returns a
dict of numpy arrays (or nothing), saved without pickle and returned to the test.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest

QUANTIZED = ("quant.scheme=adaptive", "quant.cost_model=shared", "quant.full_precision=never")
"""Overrides for tests of the quantized exchange path with the solver choosing widths (the
default scheme is uniform, 1 bit for GCN): by default every rank of one machine sends
float32 (``quant.full_precision = "auto"``: they share a host), and the default cost model
(host) prices from a profile of the machine's load; ``never`` and ``shared`` quantize
every message and plan alike on any machine."""

_PRELOAD = [
    "torch",
    "numpy",
    "adaqp.train",
    "adaqp.run.job",
    "tests.distributed",
    "tests.preload_kernels",
]


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _entry(fn, rank: int, world_size: int, init_method: str, out_dir: str, args) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    out = Path(out_dir)
    try:
        result = fn(rank, world_size, init_method, *args)
        if result:
            np.savez(out / f"result-{rank}.npz", **result)
    except BaseException:
        (out / f"error-{rank}.txt").write_text(traceback.format_exc())
        raise SystemExit(1) from None
    # As adaqp.train does: the work is done and saved; skip the interpreter teardown,
    # which gloo's transport threads can abort.
    from adaqp.train import exit_now

    exit_now(0)


def _spawn(fn, world_size: int, tmp_path: Path, args, timeout: float):
    """Starts the ranks, joins them by a shared deadline, kills any still alive.

    Returns (exit codes, ranks that hung, output dir).
    """
    ctx = _context()
    out_dir = tmp_path / f"workers-{time.monotonic_ns()}"
    out_dir.mkdir(parents=True)
    init_method = f"file://{out_dir / 'rendezvous'}"
    procs = [
        ctx.Process(target=_entry, args=(fn, rank, world_size, init_method, str(out_dir), args))
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    return [proc.exitcode for proc in procs], hung, out_dir


def _tracebacks(out_dir: Path, world_size: int) -> list[str]:
    texts = []
    for rank in range(world_size):
        path = out_dir / f"error-{rank}.txt"
        texts.append(path.read_text() if path.exists() else "")
    return texts


def run_workers(
    fn, world_size: int, tmp_path: Path, *args: Any, timeout: float = 180.0
) -> list[dict[str, np.ndarray]]:
    """Runs ``fn`` on ``world_size`` ranks; returns each rank's result dict."""
    codes, hung, out_dir = _spawn(fn, world_size, tmp_path, args, timeout)
    errors = "\n".join(
        f"--- rank {rank} ---\n{text}"
        for rank, text in enumerate(_tracebacks(out_dir, world_size))
        if text
    )
    if hung:
        pytest.fail(f"ranks {hung} hung past {timeout:.0f}s\n{errors}")
    if any(code != 0 for code in codes):
        pytest.fail(f"worker exit codes {codes}\n{errors}")
    results = []
    for rank in range(world_size):
        path = out_dir / f"result-{rank}.npz"
        if path.exists():
            with np.load(path, allow_pickle=False) as data:
                results.append({k: data[k] for k in data.files})
        else:
            results.append({})
    return results


def expect_worker_failure(
    fn, world_size: int, tmp_path: Path, *args: Any, timeout: float = 120.0
) -> list[str]:
    """Runs ``fn`` expecting every rank to fail; returns the tracebacks (rank order)."""
    codes, hung, out_dir = _spawn(fn, world_size, tmp_path, args, timeout)
    if hung:
        pytest.fail(f"ranks {hung} hung past {timeout:.0f}s instead of failing")
    for rank, code in enumerate(codes):
        assert code != 0, f"rank {rank} exited 0 but was expected to fail"
    return _tracebacks(out_dir, world_size)


def worker_pid(out_dir: Path, rank: int) -> int | None:
    """The pid of the ``adaqp.train`` worker of ``rank`` whose command names ``out_dir``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = b"adaqp.train" in cmdline and str(out_dir).encode() in cmdline
        if ours and f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


class NullWriter:
    """Stands in for ``RunWriter`` where a test only needs the trainer's summary."""

    def log_epoch(self, record) -> None:
        pass


class RecordingWriter:
    """Stands in for ``RunWriter``, keeping every epoch's record in ``records``."""

    def __init__(self) -> None:
        self.records = []

    def log_epoch(self, record) -> None:
        self.records.append(record)


def owner_of(global_ids: list[np.ndarray], num_nodes: int) -> np.ndarray:
    """The rank that owns each node, from every rank's global ids (each node exactly once)."""
    owner = np.full(num_nodes, -1, dtype=np.int64)
    for rank, ids in enumerate(global_ids):
        owner[ids] = rank
    assert (owner >= 0).all()
    return owner
