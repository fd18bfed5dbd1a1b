"""``python -m adaqp.memory``: what each training worker will hold at its peak, before launch."""

from __future__ import annotations

import argparse
import json
import sys

from adaqp.cli.parser import Parser

PROG = "python -m adaqp.memory"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Predict each training worker's peak resident memory for a config and a "
        "number of workers, before anything starts: from the run's partition where it exists, "
        "else from the graph's sizes. Prints one line per worker and the largest, or with "
        "--json an object with peak_memory_bytes (the largest worker's) and "
        "peak_memory_bytes_per_worker, and lower_bound (true where the model keeps what "
        "the estimate does not count: GAT) with its note. Exit codes: 0 done, 2 bad "
        "arguments or a config, partition or dataset that cannot be read.",
        allow_abbrev=False,
    )
    parser.add_argument("--config", required=True, help="TOML config of the run (required)")
    parser.add_argument(
        "--nproc", type=int, required=True, help="number of training workers P, on all hosts"
    )
    parser.add_argument("--mode", help="training mode (default: the config's comm.mode)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override, repeatable, as for training (default: none)",
    )
    parser.add_argument(
        "--halo-per-inner",
        type=float,
        help="without a partition: halo rows per inner row to assume (default 1.0; a "
        "partition, where there is one, gives the real counts)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.nproc < 1:
        parser.error(f"--nproc must be at least 1, got {args.nproc}")
    if args.halo_per_inner is not None and args.halo_per_inner < 0:
        parser.error(f"--halo-per-inner must be >= 0, got {args.halo_per_inner}")
    from adaqp.config import ConfigError, load_config
    from adaqp.memory.estimate import predict
    from adaqp.partitioning.schema import PartitionError

    overrides = list(args.set) + ([f"comm.mode={args.mode}"] if args.mode else [])
    try:
        config = load_config(args.config, overrides)
        prediction = predict(config, args.nproc, args.halo_per_inner, config_path=args.config)
    except (ConfigError, PartitionError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(prediction.as_json(), indent=2))
    else:
        print(prediction.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
