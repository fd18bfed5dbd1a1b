"""``python -m adaqp.bench <name> [options]``: run one benchmark, write under results/bench/."""

from __future__ import annotations

import argparse
import logging
import sys

from adaqp.bench import aggregate, cluster, costmodel, modes, quant, scaling

BENCHMARKS = {
    "aggregate": aggregate,
    "modes": modes,
    "cluster": cluster,
    "costmodel": costmodel,
    "scaling": scaling,
    "quant": quant,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adaqp.bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, module in BENCHMARKS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.split("\n")[0]))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return BENCHMARKS[args.benchmark].main(args)


if __name__ == "__main__":
    sys.exit(main())
