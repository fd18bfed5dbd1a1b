"""``python -m adaqp.cluster``: the emulated cluster's command line (adaqp/emulate/)."""

from adaqp.emulate import main

if __name__ == "__main__":
    raise SystemExit(main())
