"""``python -m adaqp.ogb_fixture``: write a config's graph in OGB's raw layout, marked synthetic.

The writing is ``adaqp.data.ogb_fixture``'s; this command line reads a run config, which
sits above the data stage, so it lives beside the other tools.
"""

from __future__ import annotations

import argparse
import logging
import sys

from adaqp.cli.parser import Parser
from adaqp.config import ConfigError, load_config
from adaqp.data.ogb import FIXTURE_MARKER
from adaqp.data.ogb_fixture import write_ogb_fixture


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m adaqp.ogb_fixture",
        description="Load the graph that --config's [data] names (e.g. the products-scale "
        "synthetic graph) and write it in OGB's raw layout under ROOT/<name with _>/, marked "
        f"synthetic ({FIXTURE_MARKER}), so that load_dataset(NAME, root=ROOT) or a run with "
        "--set data.dataset=NAME --set data.root=ROOT reads it without network. The layout "
        "is the one OGB has for NAME: csv.gz files (ogbn-products, ogbn-arxiv), or NumPy "
        "archives with float16 features and labels only on the split's nodes "
        "(ogbn-papers100M). An existing folder is never overwritten. Exit codes: 0 "
        "written, 2 refused.",
        epilog="example: python -m adaqp.ogb_fixture --config "
        "configs/products-scale-sage.toml --root /tmp/ogb-fixture, then "
        'load_dataset("ogbn-products", root="/tmp/ogb-fixture")',
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="TOML file whose [data] names the graph to write")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override, repeatable, e.g. data.synthetic.num_nodes=100000",
    )
    parser.add_argument("--root", required=True, help="folder the fixture is written under")
    parser.add_argument(
        "--name",
        default="ogbn-products",
        help="OGB dataset to stand in for, whose layout, split and class count the fixture "
        "takes (default: %(default)s; ogbn-papers100M for the binary layout)",
    )
    parser.add_argument(
        "--compresslevel",
        type=int,
        default=1,
        choices=range(1, 10),
        metavar="1-9",
        help="gzip level of the csv.gz files (default: %(default)s, the fastest); the "
        "binary layout's .npz archives are stored uncompressed, so that they can be mapped",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    words = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m adaqp.ogb_fixture", *words])
    try:
        graph = load_config(args.config, args.set).data.load()
        write_ogb_fixture(
            graph, args.root, args.name, written_by=command, compresslevel=args.compresslevel
        )
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
