"""What rank 0 tells the user while a run trains: what trains and where to, then a tqdm
bar on a terminal (sized even where the terminal reports no size) or, elsewhere, a log
line every tenth of the run, and an estimate of the time left after the first epochs.

The lines go to the ``adaqp.train`` logger, as the command's own do.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from adaqp.config import Config
from adaqp.run.metrics import EpochRecord
from adaqp.runtime import World

logger = logging.getLogger("adaqp.train")


class Progress:
    """tqdm on a terminal; otherwise a log line every tenth of the run."""

    def __init__(self, config: Config, world: World, first_epoch: int = 1):
        self.total = config.train.epochs
        self.bar = None
        if world.is_main and config.metrics.progress and sys.stderr.isatty():
            from tqdm import tqdm

            columns, rows = _fixed_size(sys.stderr) or (None, None)
            self.bar = tqdm(
                total=self.total,
                initial=first_epoch - 1,
                desc="train",
                unit="epoch",
                file=sys.stderr,
                ncols=columns,
                nrows=rows,
                dynamic_ncols=columns is None,
            )
        self.every = max(1, self.total // 10)
        self.estimate_at = min(first_epoch + 2, self.total)

    def __call__(self, record: EpochRecord) -> None:
        val = f"{record.val_acc:.4f}" if record.val_acc is not None else "-"
        if record.epoch == self.estimate_at and record.epoch < self.total:
            left = self.total - record.epoch
            # Above the bar: tqdm clears its line, the log line takes it, the bar redraws.
            with self.bar.external_write_mode(file=sys.stderr) if self.bar else nullcontext():
                logger.info(
                    "epoch %d took %.2fs: about %s for the %s left",
                    record.epoch,
                    record.epoch_time_s,
                    _duration(left * record.epoch_time_s),
                    count(left, "epoch"),
                )
        if self.bar is not None:
            # The validation accuracy first: at 80 columns tqdm cuts the line's end (the
            # bar's own rate already says the epoch time).
            self.bar.set_postfix_str(postfix(record), refresh=False)
            self.bar.update(1)
        elif record.epoch % self.every == 0 or record.epoch == self.total:
            logger.info(
                "epoch %d/%d loss %.4f val %s epoch %.3fs comm %.3fs",
                record.epoch,
                self.total,
                record.train_loss,
                val,
                record.epoch_time_s,
                record.comm_time_s,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def postfix(record: EpochRecord) -> str:
    """The bar's figures of an epoch: ``val=0.8123, loss=1.2345``."""
    val = f"{record.val_acc:.4f}" if record.val_acc is not None else "-"
    return f"val={val}, loss={record.train_loss:.4f}"


def _fixed_size(stream) -> tuple[int, int] | None:
    """None where the terminal ``stream`` reports its size (the bar follows it), else the
    bar's (columns, rows): ``$COLUMNS`` and ``$LINES``, or 80 x 24. A terminal whose size
    was never set reports zero, and tqdm draws nothing on a terminal of no columns or rows."""
    try:
        columns, rows = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        columns = rows = 0
    if columns > 0 and rows > 0:
        return None

    def value(reported: int, name: str, default: int) -> int:
        text = os.environ.get(name, "")
        return reported or (int(text) if text.isdigit() and int(text) > 0 else default)

    return value(columns, "COLUMNS", 80), value(rows, "LINES", 24)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe(config: Config, meta: dict, world_size: int, out: Path) -> None:
    """The first lines a user sees once the workers are up: what trains, and where to."""
    data = meta["dataset"]
    logger.info(
        "%s: %s, %s, %s, %s; %s, %s x %d hidden, mode %s, %s (edge cut %d); %s, writing to %s",
        config.data.dataset,
        count(data["num_nodes"], "node"),
        count(data["num_edges"], "edge"),
        count(data["feature_dim"], "feature"),
        count(data["num_classes"], "class", "classes"),
        config.model.name,
        count(config.model.layers, "layer"),
        config.model.hidden,
        config.comm.mode,
        count(world_size, "worker"),
        int(meta.get("edge_cut", 0)),
        count(config.train.epochs, "epoch"),
        out,
    )


def count(n: int, word: str, plural: str | None = None) -> str:
    """``1 epoch``, ``2 epochs``: a count with its noun in the right number."""
    return f"{n} {word if n == 1 else plural or word + 's'}"
