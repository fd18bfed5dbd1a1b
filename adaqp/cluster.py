"""``python -m adaqp.cluster``: the emulated cluster's command line (adaqp/bench/emulate/)."""

from adaqp.bench.emulate import main

if __name__ == "__main__":
    raise SystemExit(main())
