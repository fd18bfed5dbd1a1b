"""``adaqp.train`` with one planted fault in a torchrun job's first attempt (tests only).

``torchrun ... tests/run/faulty_train.py <adaqp.train flags>``, with ``ADAQP_TEST_FAULT``:

- ``before-start``: rank 1 dies as the partition is prepared, so that rank 0's claim is
  never started (the output directory it reserved is given up again);
- ``after-start``: rank 1 dies once the checkpoint of epoch 2 is complete;
- ``at-exit``: rank 1 fails on its way out of a run that finished (exit code 1).

Later attempts (``TORCHELASTIC_RESTART_COUNT`` > 0) run unchanged.
"""

from __future__ import annotations

import os
import sys

from adaqp import train
from adaqp.run import job
from adaqp.run.checkpoint import Checkpointer

FAULT = os.environ.get("ADAQP_TEST_FAULT", "")
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
RANK = int(os.environ.get("RANK", "0"))


def _die() -> None:
    sys.stderr.write(f"rank {RANK}: planted fault {FAULT}\n")
    sys.stderr.flush()
    os._exit(1)


if FIRST_ATTEMPT and RANK == 1 and FAULT == "before-start":
    job.prepare_partition = lambda *args, **kwargs: _die()
elif FIRST_ATTEMPT and RANK == 1 and FAULT == "after-start":
    save = Checkpointer.save

    def save_then_die(self, epoch, *args, **kwargs):
        save(self, epoch, *args, **kwargs)
        if epoch >= 2:
            _die()

    Checkpointer.save = save_then_die

if __name__ == "__main__":
    code = train.main()
    if FIRST_ATTEMPT and RANK == 1 and FAULT == "at-exit" and code == 0:
        _die()
    train.exit_now(code)
