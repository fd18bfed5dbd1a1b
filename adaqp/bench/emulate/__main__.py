"""``python -m adaqp.bench.emulate``: the same command line as ``python -m adaqp.cluster``."""

import sys

from adaqp.bench.emulate.cli import main

if __name__ == "__main__":
    sys.exit(main())
