"""Benchmarks (``python -m adaqp.bench``); the emulated cluster several of them run on is
:mod:`adaqp.emulate` (``python -m adaqp.cluster``).

Benchmarks write under ``results/local/bench/`` (ignored by git) unless ``--out-dir`` (or
``--out``) says otherwise. A committed reading lives in
``results/bench/<benchmark>/<workload>/`` (indexed in ``results/bench/README.md``); an
``--out-dir`` naming that folder updates it.
Figures need matplotlib (``pip install -e .[bench]`` or ``bash launch/setup.sh --bench``);
without it the JSON and tables are still written, with one warning (``pyplot``). This
module and the command line import no torch, so ``--help`` answers at once; a benchmark
imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaqp.cli.deps import extra_fix
from adaqp.quant.bits import SUPPORTED_BITS

logger = logging.getLogger(__name__)

DEFAULT_OUT_DIR = Path("results/local/bench")
"""Where benchmarks write by default: outside the committed ``results/bench/``."""

COMMITTED_OUT_DIR = Path("results/bench")
"""The committed readings the docs quote, one folder per reading under
``<benchmark>/<workload>/`` (``--out-dir`` that folder to update one)."""

CLUSTER_CONFIG = "configs/cluster-synthetic-gcn.toml"
"""The earlier cluster workload (``--workload synthetic``): a synthetic graph sized for a
2-core machine (20k nodes, 190k edges, 3 layers, hidden 256) without communities, where
METIS cuts mostly edges between classes, so its halo rows lower the accuracy; the 1M-node
``configs/synthetic-*.toml`` are for real hosts."""

SIGNAL_CONFIG = "configs/cluster-synthetic-signal-gcn.toml"
"""The default cluster workload (``--workload synthetic-signal``): the same size with 32
communities that each hold every class and enough edges between them that METIS cuts
about a quarter of the edges, each as informative as an internal one; training without
the halo rows (``nocomm``) loses accuracy (results/bench/modes/workload-search/)."""

MODEL_SETTINGS: dict[str, tuple[str, ...]] = {
    "gcn": ("model.name=gcn",),
    "sage": ("model.name=sage",),
    "gat": (
        "model.name=gat",
        "model.hidden=32",
        "model.heads=4",
        "model.attn_dropout=0.0",
        "train.lr=0.005",
    ),
}
"""``--model``'s overrides of a workload's config, which keep its layers, LayerNorm and
dropout: SAGE as GCN; GAT with 4 heads of 32 per hidden layer and the learning rate under
which a first probe on the signal workload told its widths apart (docs/bit-widths.md). On
the signal workload each model's ``SIGNAL_RECIPES`` entry replaces the learning rate."""


@dataclass(frozen=True)
class Recipe:
    """How a model trains on a workload: every mode alike, so that Vanilla's validation
    accuracy has plateaued by the last epoch."""

    lr: float
    """Adam's learning rate (``train.lr``)."""
    lr_warmup_epochs: int
    """Epochs of linear warm-up to ``lr`` (``train.lr_warmup_epochs``)."""
    epochs: int
    """Epochs by which Vanilla's validation accuracy has plateaued under this recipe."""

    def overrides(self) -> tuple[str, ...]:
        return (f"train.lr={self.lr}", f"train.lr_warmup_epochs={self.lr_warmup_epochs}")


SIGNAL_RECIPES: dict[str, Recipe] = {
    "gcn": Recipe(lr=0.05, lr_warmup_epochs=10, epochs=320),
    "sage": Recipe(lr=0.01, lr_warmup_epochs=10, epochs=240),
    "gat": Recipe(lr=0.01, lr_warmup_epochs=10, epochs=430),
}
"""Each model's recipe on the signal workload (``SIGNAL_CONFIG`` with ``MODEL_SETTINGS``),
tuned on Vanilla, one process: the learning rate and warm-up that reached Vanilla's
validation plateau in the fewest epochs among those tried, and the first multiple of 10
epochs by which every seed run long enough was within 0.5 points of its best
(results/bench/recipes/signal/). Without a warm-up, Adam's first steps at these rates throw
the loss far above chance and the first tens of epochs go to recovering."""


def signal_recipe(config: str, model: str | None) -> Recipe | None:
    """The recipe every mode trains by on ``config``: ``model``'s (GCN's, the config's,
    without one) on the signal workload, where they were measured; None on the others."""
    return SIGNAL_RECIPES[model or "gcn"] if config == SIGNAL_CONFIG else None


MATPLOTLIB_HINT = "pip install -e .[bench] (or bash launch/setup.sh --bench)"

MODE_VARIANTS: dict[str, tuple[str, ...]] = {
    "vanilla": ("--mode", "vanilla"),
    "adaqp-q": ("--mode", "adaqp-q"),
    "adaqp-p": ("--mode", "adaqp-p"),
    "adaqp": ("--mode", "adaqp"),
    "adaqp-s": ("--mode", "adaqp-s"),
    "onebit-s1": ("--mode", "onebit", "--set", "staleness.bound=1"),
    "onebit-s2": ("--mode", "onebit", "--set", "staleness.bound=2"),
}
"""Benchmark variants: a name and the ``adaqp.train`` flags that select it."""

UNIFORM_VARIANTS: dict[str, tuple[str, ...]] = {
    f"uniform-{bits}": (
        "--mode",
        "adaqp",
        "--set",
        "quant.scheme=uniform",
        "--set",
        f"quant.bits={bits}",
        "--set",
        "quant.full_precision=never",
    )
    for bits in SUPPORTED_BITS
}
"""``adaqp``'s exchange with overlap, every message at one width (``uniform-1`` to
``uniform-8``), float32 never replacing it: they differ from ``adaqp`` only in how the
widths are chosen, so they are the constant widths the adaptive planner must beat."""

ADAPTIVE = ("--mode", "adaqp", "--set", "quant.scheme=adaptive")
"""``adaqp`` with the solver choosing each message group's width (``quant.scheme``
adaptive); the default scheme is uniform at the model's width (docs/bit-widths.md says why)."""

ADAPTIVE_VARIANTS: dict[str, tuple[str, ...]] = {
    "adaqp-adaptive": ADAPTIVE,
    **{
        f"adaqp-budget{budget}": (*ADAPTIVE, "--set", f"quant.variance_budget={budget}")
        for budget in (0.1, 0.9)
    },
    "adaqp-bits12": (*ADAPTIVE, "--set", "quant.allowed_bits=[1,2]"),
    "adaqp-adaptive-2b": (
        *ADAPTIVE,
        "--set",
        "quant.bits=2",
        "--set",
        "quant.allowed_bits=[1,2,4,8]",
    ),
}
"""The solver: at its default variance budget ``quant.variance_budget`` = 1, the uniform
width's variance (``adaqp-adaptive``); at budgets of 0.1 and 0.9 of it (``adaqp-budget0.1``,
``adaqp-budget0.9``; docs/cost-models.md#the-objective); and choosing only between 1 and 2
bits (``adaqp-bits12``); and with its budget at 2 bits' variance whatever the model's
width, choosing among 1, 2, 4 and 8 bits (``adaqp-adaptive-2b``: GAT's default is 4 bits,
and 2 bits may be the uniform width to beat); not run unless asked for."""

NOCOMM_ACC_NOTE = "no halo"
"""How tables mark ``nocomm``'s accuracy: each part trained without its halo rows, which
says what the exchange carries (a graph whose cut edges carry signal loses accuracy
there), not what a mode that exchanges would reach."""

COST_MODEL_VARIANTS: dict[str, tuple[str, ...]] = {
    "adaqp-shared": (*ADAPTIVE, "--set", "quant.cost_model=shared"),
    "adaqp-host": (*ADAPTIVE, "--set", "quant.cost_model=host"),
}
"""The solver under a named cost model, for comparing them (not run unless asked for)."""

_PLAIN_STALE = (
    "--mode",
    "onebit",
    "--set",
    "staleness.bound=1",
    "--set",
    "staleness.warmup_epochs=0",
    "--set",
    "staleness.smoothing=0",
    "--set",
    "staleness.fresh_last_layer=false",
)
STALENESS_VARIANTS: dict[str, tuple[str, ...]] = {
    "onebit-s1-plain": _PLAIN_STALE,
    "onebit-s1-smooth": (*_PLAIN_STALE, "--set", "staleness.smoothing=0.9"),
    "onebit-s1-warmup": (*_PLAIN_STALE, "--set", "staleness.warmup_epochs=10"),
    "onebit-s1-fresh-last": (*_PLAIN_STALE, "--set", "staleness.fresh_last_layer=true"),
    "onebit-s1-sync4": (*_PLAIN_STALE, "--set", "staleness.sync_every=4"),
    "onebit-s2-plain": (*_PLAIN_STALE, "--set", "staleness.bound=2"),
    "onebit-s1-smooth-fresh-last": (
        *_PLAIN_STALE,
        "--set",
        "staleness.smoothing=0.9",
        "--set",
        "staleness.fresh_last_layer=true",
    ),
    "onebit-s1-combined": (
        *_PLAIN_STALE,
        "--set",
        "staleness.smoothing=0.9",
        "--set",
        "staleness.fresh_last_layer=true",
        "--set",
        "staleness.warmup_epochs=10",
    ),
}
"""The staleness ablation: ``onebit`` at S = 1 with every compensation off (plain), and
with one of them on; ``onebit-s1`` is the defaults (not run unless asked for)."""


def _integers(text: str, what: str, example: str, least: int | None = None) -> list[int]:
    """Comma-separated integers, each at least ``least``; argparse's type error naming
    ``what`` they must be otherwise."""
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        values = []
    if not values or (least is not None and min(values) < least):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated {what}, e.g. {example}; got {text!r}"
        )
    return values


def seed_list(text: str) -> list[int]:
    """``--seeds`` as argparse reads it: comma-separated integers ("0,1,2")."""
    seeds = _integers(text, "integers", "0,1,2")
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"a seed is named twice: {text!r}")
    return seeds


def count_list(text: str) -> list[int]:
    """``--world-sizes`` and the like as argparse reads them: comma-separated positive
    integers ("1,2,4")."""
    return _integers(text, "positive integers", "1,2,4", least=1)


class UsageError(Exception):
    """A benchmark's options do not fit together: raised before any work, reported by
    ``python -m adaqp.bench`` as argparse would (one line on stderr, exit code 2)."""


def chosen_variants(flag: str, text: str, known: dict[str, Any]) -> list[str]:
    """The comma-separated variant names of ``flag``; UsageError unless each is ``known``
    and vanilla (every comparison's baseline) is among them."""
    names = [name for name in text.split(",") if name]
    unknown = set(names) - set(known)
    if unknown or "vanilla" not in names:
        named = f"unknown {', '.join(sorted(unknown))}; " if unknown else ""
        raise UsageError(f"{flag}: {named}must include vanilla and come from {', '.join(known)}")
    return names


def bits_cell(avg_bits: float, halo_bytes: float) -> str:
    """A table's average bits: "-" where no halo byte was sent (``nocomm``, whose summary
    says 32 for the bits it never sent)."""
    return f"{avg_bits:.2f}" if halo_bytes else "-"


def pyplot(figures: str) -> Any:
    """``matplotlib.pyplot`` on the Agg backend; or None, after one warning naming the
    ``figures`` skipped, where matplotlib is not installed (the caller still writes its
    JSON and tables)."""
    try:
        import matplotlib
    except ImportError:
        logger.warning(
            "matplotlib is not installed: %s not drawn (the JSON and tables are written); "
            "for figures, %s",
            figures,
            extra_fix("matplotlib", MATPLOTLIB_HINT),
        )
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def add_out_options(parser: argparse.ArgumentParser, filename: str) -> None:
    """``--out-dir`` and ``--out`` of a benchmark that writes one file, ``filename``: the
    file goes to ``--out`` where given, else into ``--out-dir`` (``out_file``)."""
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help=f"where {filename} goes; {COMMITTED_OUT_DIR} updates the committed reading",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"the file written (default: OUT_DIR/{filename})",
    )


def out_file(args: argparse.Namespace, filename: str) -> Path:
    """The file a benchmark of ``add_out_options`` writes: ``--out``, else
    ``<--out-dir>/<filename>``."""
    return args.out if args.out is not None else args.out_dir / filename


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of benchmarks that train through torchrun: overrides and a time limit."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="extra config override for every run, repeatable",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")


def merge_overrides(items: list[str] | tuple[str, ...]) -> list[str]:
    """``section.key=value`` overrides with one entry per key, as the trainer applies them:
    a later value for a key replaces the earlier one, in the earlier one's place (a
    benchmark's own defaults come first, the user's ``--set`` after them)."""
    merged: dict[str, str] = {}
    for item in items:
        merged[item.partition("=")[0].strip()] = item
    return list(merged.values())


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


def run_order(modes: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """``(mode, seed)`` in the order they run: seed after seed, each seed's modes rotated by
    one place, so that no mode always runs first or last (on a shared machine, runs a
    minute apart can differ by a quarter in compute). Each mode's seeds stay in order."""
    return [
        (modes[(i + j) % len(modes)], seed)
        for i, seed in enumerate(seeds)
        for j in range(len(modes))
    ]


def step_time_s(epoch: dict[str, Any]) -> float:
    """What an epoch of ``metrics.jsonl`` adds to a run's time to accuracy: its training
    step and the bit-width solve after it (the ranks wait for a re-solve before the next
    epoch; a uniform width never pays one; ``assign_time_s`` is its name in older
    metrics), not evaluation (full precision in every mode), a measuring cost that would
    blur the comparison."""
    return epoch["epoch_time_s"] + epoch.get("solver_time_s", epoch.get("assign_time_s", 0.0))
