"""Benchmarks that write their figures to ``results/bench/`` (``python -m adaqp.bench``)."""

from __future__ import annotations

import os
import subprocess
import sys

SMALL_SYNTHETIC: tuple[str, ...] = (
    "data.synthetic.num_nodes=20000",
    "data.synthetic.avg_degree=10",
    "data.synthetic.feature_dim=64",
    "data.synthetic.num_classes=8",
    "data.synthetic.feature_noise=2.0",
)
"""Overrides for a synthetic graph sized for a 2-core machine (20k nodes, 190k edges);
the 1M-node ``configs/synthetic-*.toml`` are for real hosts."""


MODE_VARIANTS: dict[str, tuple[str, ...]] = {
    "vanilla": ("--mode", "vanilla"),
    "adaqp-q": ("--mode", "adaqp-q"),
    "adaqp-p": ("--mode", "adaqp-p"),
    "adaqp": ("--mode", "adaqp"),
    "onebit-s1": ("--mode", "onebit", "--set", "staleness.bound=1"),
    "onebit-s2": ("--mode", "onebit", "--set", "staleness.bound=2"),
}
"""Benchmark variants: a name and the ``adaqp.train`` flags that select it."""

COST_MODEL_VARIANTS: dict[str, tuple[str, ...]] = {
    "adaqp-shared": ("--mode", "adaqp", "--set", "quant.cost_model=shared"),
    "adaqp-host": ("--mode", "adaqp", "--set", "quant.cost_model=host"),
}
"""``adaqp`` under a named cost model, for comparing them (not run unless asked for)."""


def torchrun_command(
    nproc: int, train_args: list[str], launcher_args: tuple[str, ...] = ()
) -> list[str]:
    """The command that runs ``adaqp.train`` under a standalone torchrun on this machine."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *launcher_args,
        "-m",
        "adaqp.train",
        *train_args,
    ]


def torchrun_train(nproc: int, train_args: list[str], timeout_s: float, what: str) -> None:
    """Runs ``adaqp.train`` under a standalone torchrun with ``nproc`` workers.

    Raises:
        RuntimeError: the job failed; the message holds the end of its stderr.
    """
    cmd = torchrun_command(nproc, train_args)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=timeout_s, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
