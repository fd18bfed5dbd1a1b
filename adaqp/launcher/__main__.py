"""``python -m adaqp.launcher``."""

import sys

from adaqp.launcher import main

sys.exit(main())
