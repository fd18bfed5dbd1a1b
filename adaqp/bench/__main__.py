"""``python -m adaqp.bench BENCHMARK [options]``: run one benchmark (``main``).

The command line imports only the benchmark it runs, and none for ``--help``: the
one-line summaries are here (``BENCHMARKS``), each benchmark's options in its module
(``add_arguments``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import textwrap
from types import ModuleType

from adaqp.bench import UsageError
from adaqp.cli.deps import require
from adaqp.cli.parser import HelpFormatter, Parser
from adaqp.emulate.netns import ClusterError  # no torch: subprocess alone

PROG = "python -m adaqp.bench"

BENCHMARKS: dict[str, str] = {
    "aggregate": "aggregation throughput, forward + backward: our CSR SpMM against autograd "
    "through torch.sparse.mm on a synthetic graph",
    "modes": "every training mode side by side (vanilla, adaqp-q, adaqp-p, adaqp, onebit, "
    "uniform 2/4/8 bits) over several seeds, each run a torchrun job over loopback",
    "cluster": "every mode over several seeds on an emulated cluster of hosts joined by "
    "shaped links (root): epoch time breakdown, bytes, accuracy, time to accuracy",
    "costmodel": "the cost model's calibrated exchange times against the measured ones, over "
    "saved bench cluster results (runs nothing)",
    "scaling": "training across P workers and partitioning as the graph grows, with fitted "
    "power-law exponents",
    "quant": "quantizer and dropout throughput: the compiled kernels against the torch "
    "path and the torch path against the quantizer it replaced, at each bit width, beside "
    "a memory copy",
}
"""Every benchmark (the module ``adaqp.bench.<name>``) and its one-line summary. The
summaries live here so that ``--help`` imports no benchmark module (some import torch)."""
READS_ONLY = {"costmodel"}
"""Benchmarks that only read saved results: they run without torch and the others."""

DESCRIPTION = textwrap.fill(
    "Run one benchmark. Each writes its readings (JSON and Markdown, and with matplotlib "
    "its figures) under --out-dir, by default results/local/bench/, which git ignores; "
    "--out-dir results/bench/<benchmark>/<workload> updates a committed reading that the docs "
    "quote (results/bench/README.md lists them) "
    "(aggregate and quant also take --out FILE). "
    "Figures need matplotlib: pip install -e .[bench] or bash launch/setup.sh --bench "
    "(without it the readings are still written)."
)


def load(name: str) -> ModuleType:
    """The benchmark module ``name`` (imported now: it may import torch)."""
    if name not in BENCHMARKS:
        raise KeyError(name)
    return importlib.import_module(f"adaqp.bench.{name}")


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The command line; only the ``chosen`` benchmark's module is imported and its
    options added (the others' subcommands are listed with their summaries only)."""
    parser = Parser(
        prog=PROG,
        description=DESCRIPTION,
        epilog="python -m adaqp.bench BENCHMARK --help lists a benchmark's options.",
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # a prefix is a typo, not the option it starts
    )
    sub = parser.add_subparsers(
        dest="benchmark", required=True, metavar="BENCHMARK", title="benchmarks"
    )
    for name, summary in BENCHMARKS.items():
        # The module's docstring, less its reStructuredText quotes.
        description = (load(name).__doc__ or "").replace("``", "") if name == chosen else summary
        sub_parser = sub.add_parser(
            name,
            help=summary,
            description=description,
            formatter_class=HelpFormatter,
            allow_abbrev=False,
        )
        if name == chosen:
            load(name).add_arguments(sub_parser)
    return parser


def _chosen(argv: list[str]) -> str | None:
    """The benchmark named on the command line: the first argument that is not an option
    (the top level has no option taking a value)."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in BENCHMARKS else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(_chosen(argv))
    except ModuleNotFoundError:  # the chosen benchmark's module imports torch
        require(PROG)
        raise
    args = parser.parse_args(argv)
    if args.benchmark not in READS_ONLY:  # before workers start that would each fail alike
        require(PROG)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        return load(args.benchmark).main(args)
    except UsageError as exc:  # options that argparse alone could not judge
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except ClusterError as exc:  # a baseline run that failed (its log named), no cluster
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
