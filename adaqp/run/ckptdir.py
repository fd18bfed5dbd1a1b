"""Where a run's checkpoints live and which of them are complete: names only, no torch.

Read by the pre-flight checks that run before torch loads (``adaqp.run.preflight``) and by
``adaqp.run.checkpoint``, which writes and loads the checkpoints themselves.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_DIR = "checkpoints"
"""Where a run's checkpoints go inside its output directory (``checkpoint.dir`` empty)."""
MANIFEST = "manifest.json"
"""Written last into a checkpoint's folder: a folder without one never counts."""


def step_dir(root: Path, epoch: int) -> Path:
    """The folder of the checkpoint at ``epoch`` under ``root``."""
    return root / f"epoch-{epoch:06d}"


def epoch_of(path: Path) -> int | None:
    """The epoch a checkpoint folder is named for, or None for any other name."""
    name = path.name
    if not name.startswith("epoch-") or not name[6:].isdigit():
        return None
    return int(name[6:])


def complete_epochs(root: Path) -> list[int]:
    """Epochs with a manifest under ``root``, ascending (shards not yet verified)."""
    if not root.is_dir():
        return []
    epochs = []
    for path in root.glob("epoch-*"):
        epoch = epoch_of(path)
        if epoch is not None and (path / MANIFEST).is_file():
            epochs.append(epoch)
    return sorted(epochs)


def checkpoint_root(config, out_dir: Path) -> Path:
    """``checkpoint.dir``, or ``<out>/checkpoints``."""
    return Path(config.checkpoint.dir) if config.checkpoint.dir else Path(out_dir) / DEFAULT_DIR
