"""Command line: ``python -m partition --dataset NAME --num-parts P --out DIR``."""

from __future__ import annotations

import argparse
import logging
import sys

from adaqp.config import ConfigError, load_config
from adaqp.partition_format import PartitionError
from partition.build import ensure_partition


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m partition", description="Cut a graph into parts for AdaQP workers."
    )
    parser.add_argument("--dataset", help="dataset name (overrides the config's data.dataset)")
    parser.add_argument("--num-parts", type=int, required=True, help="number of parts P")
    parser.add_argument("--out", required=True, help="partition directory to write")
    parser.add_argument("--method", choices=("metis", "random", "contiguous"))
    parser.add_argument("--seed", type=int, help="METIS / random seed")
    parser.add_argument("--config", help="TOML file whose [data] and [partition] are used")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override, repeatable (e.g. data.root=/datasets)",
    )
    parser.add_argument(
        "--force", action="store_true", help="re-create the partition even if one exists at --out"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    overrides = list(args.set)
    if args.dataset:
        overrides.append(f"data.dataset={args.dataset}")
    if args.method:
        overrides.append(f"partition.method={args.method}")
    if args.seed is not None:
        overrides.append(f"partition.seed={args.seed}")
    try:
        config = load_config(args.config, overrides)
        meta = ensure_partition(
            config.data, config.partition, args.num_parts, args.out, force=args.force
        )
    except (ConfigError, PartitionError, ValueError, OSError) as exc:
        # OSError: a dataset that is not on disk and cannot be downloaded.
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cut = meta["edge_cut"]
    edges = max(meta["dataset"]["num_edges"], 1)
    bal = meta["balance"]
    print(
        f"{args.out}: {meta['params']['num_parts']} parts, edge cut {cut} "
        f"({100.0 * cut / edges:.2f}% of {edges} edges), balance nodes {bal['num_inner']:.3f} "
        f"edges {bal['num_edges']:.3f} train {bal['num_train']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
