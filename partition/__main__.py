"""Command line: ``python -m partition --dataset NAME --num-parts P --out DIR``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from adaqp.cli.deps import require
from adaqp.cli.parser import Parser

PROG = "python -m partition"

try:
    from adaqp.config import (
        METIS_OBJECTIVES,
        PARTITION_METHODS,
        ConfigError,
        DataConfig,
        PartitionConfig,
        load_config,
    )
except ModuleNotFoundError:  # numpy, which the config's dataset defaults import
    require(PROG)
    raise


def build_parser() -> argparse.ArgumentParser:
    """The command line; options left out (None) come from the config, so their help names
    the built-in default."""
    data, part = DataConfig(), PartitionConfig()
    parser = Parser(
        prog=PROG,
        description="Cut a graph into parts for AdaQP workers and write them to --out, "
        "printing the edge cut, halo rows and central share per part. Options left out "
        "come from --config's [data] and [partition] (or the built-in defaults). An "
        "existing partition at --out is reused if it matches and refused if it does not "
        "(another number of parts, graph or parameters); --force re-creates it. Ctrl-C "
        "(SIGINT) or SIGTERM stops it, removing its scratch files. Exit codes: 0 done, "
        "2 bad arguments or a refused partition, 130 / 143 stopped by SIGINT / SIGTERM.",
        allow_abbrev=False,  # a prefix is a typo, not the option it starts
    )
    parser.add_argument(
        "--dataset",
        help="dataset name: cora, citeseer, synthetic, npz or an OGB node dataset "
        f"(default: the config's data.dataset, else {data.dataset})",
    )
    parser.add_argument(
        "--num-parts",
        type=int,
        required=True,
        help="number of parts P, one per training worker (required)",
    )
    parser.add_argument("--out", required=True, help="partition directory to write (required)")
    parser.add_argument(
        "--method",
        choices=PARTITION_METHODS,
        help="how nodes are assigned to parts: metis (fewest cut edges, balanced), kaminpar "
        "(the same aim in a fraction of METIS's memory; objective cut only), random or "
        "contiguous id ranges (default: the config's "
        f"partition.method, else {part.method})",
    )
    parser.add_argument(
        "--objective",
        choices=METIS_OBJECTIVES,
        help="METIS objective: edge cut, or communication volume (halo rows, k-way) "
        f"(default: the config's partition.objective, else {part.objective})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="METIS / KaMinPar / random seed (default: the config's partition.seed, else "
        f"{part.seed})",
    )
    parser.add_argument(
        "--config",
        help="TOML file whose [data] and [partition] are used (default: none, the built-in "
        "defaults)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override, repeatable, e.g. data.root=/datasets (default: none)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="re-create the partition at --out even if one exists there, e.g. with another "
        "number of parts (default: reuse a matching one, refuse another)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.num_parts < 1:
        parser.error(f"--num-parts must be at least 1, got {args.num_parts}")
    # Only now the packages --help does without (numpy, pymetis): one line where they are
    # missing, not a traceback.
    require(PROG)
    from adaqp.partitioning.build import ensure_partition
    from adaqp.partitioning.schema import PartitionError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    overrides = list(args.set)
    if args.dataset:
        overrides.append(f"data.dataset={args.dataset}")
    if args.method:
        overrides.append(f"partition.method={args.method}")
    if args.objective:
        overrides.append(f"partition.objective={args.objective}")
    if args.seed is not None:
        overrides.append(f"partition.seed={args.seed}")
    try:
        config = load_config(args.config, overrides)
        meta = ensure_partition(
            config.data, config.partition, args.num_parts, args.out, force=args.force, tool=True
        )
    except (ConfigError, PartitionError, ValueError, OSError, ModuleNotFoundError) as exc:
        # OSError: a dataset that is not on disk and cannot be downloaded;
        # ModuleNotFoundError: an optional partitioner (kaminpar) that is not installed.
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: adaqp.process.stop
        return _stopped(str(exc), Path(args.out))
    print(_report(args.out, meta))
    return 0


def _stopped(name: str, out: Path) -> int:
    """Says that the tool stopped and what it left (nothing, unless a removal failed);
    returns 128 + the signal's number, the shell's convention."""
    from adaqp.partitioning.scratch import remove_own_leftovers

    if name not in signal.Signals.__members__:  # Python's own Ctrl-C handler names none
        name = "SIGINT"
    left = remove_own_leftovers(out.absolute().parent, out)
    if left:
        what = f"could not remove {', '.join(map(str, left))}: remove them by hand"
    else:
        what = "nothing was left behind (scratch and partly written files removed)"
    print(f"stopped by {name}; {what}", file=sys.stderr)
    return 128 + signal.Signals[name].value


def _report(out: str, meta: dict) -> str:
    """The result lines: totals, then one line per part."""
    cut = meta["edge_cut"]
    edges = max(meta["dataset"]["num_edges"], 1)
    bal = meta["balance"]
    stats = meta["stats"]
    params = meta["params"]
    lines = [
        f"{out}: {params['num_parts']} parts ({params['method']}, objective "
        f"{params.get('objective', 'cut')}), edge cut {cut} ({100.0 * cut / edges:.2f}% of "
        f"{edges} edges), halo rows {stats['halo_rows']} ({stats['halo_rows_per_node']:.3f} "
        f"per node), central {100.0 * stats['central_fraction']:.1f}%, balance nodes "
        f"{bal['num_inner']:.3f} edges {bal['num_edges']:.3f} train {bal['num_train']:.3f}"
    ]
    for rank, (entry, part) in enumerate(zip(meta["parts"], stats["parts"], strict=True)):
        lines.append(
            f"  part {rank}: {entry['num_inner']} inner, edge cut {part['edge_cut']}, "
            f"halo rows {part['num_halo']}, central {100.0 * part['central_fraction']:.1f}%"
        )
    stages = meta.get("stages")  # absent from a partition that was reused as it was made
    if stages:
        peak = max(s["peak_memory_bytes"] for s in stages)
        lines.append(
            "  stages: "
            + ", ".join(
                f"{s['name']} {s['seconds']:.1f} s {s['peak_memory_bytes'] / 1e9:.2f} GB"
                for s in stages
            )
            + f"; peak resident {peak / 1e9:.2f} GB"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
