"""``python -m adaqp.memory``: what each training worker will hold at its peak, before launch."""

from __future__ import annotations

import argparse
import json
import sys

from adaqp.cli.parser import Parser
from adaqp.memory.limits import USABLE_FRACTION, parse_memory

PROG = "python -m adaqp.memory"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Predict each training worker's peak resident memory for a config and a "
        "number of workers, before anything starts: from the run's partition where it exists, "
        "else from the graph's sizes, walking a training step and an evaluation over the "
        "rows each layer computes (docs/memory.md). Prints one line per worker (one for "
        "all where they are alike) and the largest, or with --json an object with "
        "peak_memory_bytes (the largest worker's), peak_memory_bytes_per_worker, "
        "terms_per_worker, peak_phase_per_worker, and lower_bound (true where the model "
        "keeps what the estimate does not count: GAT) with its note. Exit codes: 0 done, "
        "2 bad arguments or a config, partition or dataset that cannot be read.",
        allow_abbrev=False,
    )
    parser.add_argument("--config", required=True, help="TOML config of the run (required)")
    parser.add_argument(
        "--nproc",
        type=int,
        help="number of training workers P, on all hosts (required without --hosts-of)",
    )
    parser.add_argument(
        "--nproc-per-host",
        type=int,
        help="workers on each host (default: all on one; with --hosts-of, one): a quantized "
        "mode sends float32 between workers of one host (quant.full_precision=auto)",
    )
    parser.add_argument(
        "--hosts-of",
        metavar="SIZE",
        help="instead of one P: the fewest hosts of SIZE memory (e.g. 64g), one worker each, "
        f"whose every worker is predicted within {USABLE_FRACTION:.0%}% of SIZE, trying P = 1, "
        "2, 4, ... 1024, then the numbers between the first that fits and the power of two "
        "before it; prints each try and the fewest that fits",
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
    if args.hosts_of is None and args.nproc is None:
        parser.error("give --nproc P, or --hosts-of SIZE to find the fewest hosts")
    if args.nproc is not None and args.nproc < 1:
        parser.error(f"--nproc must be at least 1, got {args.nproc}")
    if args.nproc_per_host is not None and args.nproc_per_host < 1:
        parser.error(f"--nproc-per-host must be at least 1, got {args.nproc_per_host}")
    host_bytes = None
    if args.hosts_of is not None:
        try:
            host_bytes = parse_memory(args.hosts_of, "--hosts-of")
        except ValueError as exc:
            parser.error(str(exc))
        if host_bytes is None:
            parser.error("--hosts-of must be a size above 0, e.g. 64g")
    if args.halo_per_inner is not None and args.halo_per_inner < 0:
        parser.error(f"--halo-per-inner must be >= 0, got {args.halo_per_inner}")
    from adaqp.config import ConfigError, load_config
    from adaqp.memory.estimate import predict
    from adaqp.partitioning.schema import PartitionError

    overrides = list(args.set) + ([f"comm.mode={args.mode}"] if args.mode else [])
    try:
        config = load_config(args.config, overrides)
        if host_bytes is not None:
            return _fewest_hosts(config, args, host_bytes)
        prediction = predict(
            config, args.nproc, args.halo_per_inner, args.config, args.nproc_per_host
        )
    except (ConfigError, PartitionError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(prediction.as_json(), indent=2))
    else:
        print(prediction.text())
    return 0


MAX_HOSTS = 1024
"""``--hosts-of`` tries P = 1, 2, 4, ... up to this."""


def _fewest_hosts(config, args: argparse.Namespace, host_bytes: int) -> int:
    """``--hosts-of``: each power of two's largest worker, until one fits a host; then the
    numbers between it and the power of two before it, halving the range (a partition
    may have any number of parts), taking a worker's peak to fall as hosts are added."""
    from adaqp.memory.estimate import predict

    usable = int(host_bytes * USABLE_FRACTION)
    per_host = args.nproc_per_host or 1
    tries: list = []

    def fits_at(nproc: int):
        prediction = predict(config, nproc, args.halo_per_inner, args.config, per_host)
        tries.append(prediction)
        return prediction if prediction.peak_memory_bytes <= usable else None

    fits, nproc = None, 1
    while nproc <= MAX_HOSTS and fits is None:
        fits = fits_at(nproc)
        nproc *= 2
    if fits is not None:
        lo, hi = len(fits.workers) // 2, len(fits.workers)  # lo does not fit (or is 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = fits_at(mid)
            if found is None:
                lo = mid
            else:
                fits, hi = found, mid
    tries.sort(key=lambda p: len(p.workers))
    if args.json:
        out = {
            "config": args.config,
            "host_bytes": host_bytes,
            "usable_bytes": usable,
            "tries": [
                {"nproc": len(p.workers), "peak_memory_bytes": p.peak_memory_bytes} for p in tries
            ],
            "fewest_hosts": len(fits.workers) if fits else None,
            "prediction": fits.as_json() if fits else None,
        }
        print(json.dumps(out, indent=2))
        return 0
    gib = 2**30
    for p in tries:
        print(f"{len(p.workers):5d} hosts: largest worker {p.peak_memory_bytes / gib:.2f} GiB")
    if fits is None:
        print(f"no number of hosts up to {MAX_HOSTS} fits {usable / gib:.1f} GiB a worker")
        return 0
    print(f"fewest hosts of {host_bytes / gib:.0f} GiB: {len(fits.workers)}")
    print(fits.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
