"""Where a run's checkpoints live and which of them are complete: names only, no torch.

Read by the pre-flight checks that run before torch loads (``adaqp.run.preflight``) and by
``adaqp.run.checkpoint``, which writes and loads the checkpoints themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

from adaqp.atomic import write_json

DEFAULT_DIR = "checkpoints"
"""Where a run's checkpoints go inside its output directory (``checkpoint.dir`` empty)."""
OWNER_FILE = "owner.json"
"""In a run's folder under ``checkpoint.dir``: {"out": the run's output directory}. Other
runs never resume, replace or remove checkpoints that name another directory."""
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


def run_checkpoints(out_dir: Path, checkpoint_dir: str | Path | None) -> Path:
    """Where the run in ``out_dir`` keeps its checkpoints: ``<out>/checkpoints``, or with
    ``checkpoint_dir`` (the config's ``checkpoint.dir``) ``<checkpoint_dir>/<out's name>``,
    so that the runs that share a ``checkpoint.dir`` (``-v2``, ``-v3``, ... of one
    command) each keep their own."""
    if checkpoint_dir:
        return Path(checkpoint_dir) / Path(out_dir).name
    return Path(out_dir) / DEFAULT_DIR


def checkpoint_root(config, out_dir: Path) -> Path:
    """The checkpoints of the run in ``out_dir`` under ``config`` (``run_checkpoints``)."""
    return run_checkpoints(out_dir, config.checkpoint.dir or None)


def checkpoint_owner(root: Path) -> str | None:
    """The output directory named by ``root``'s owner file; None where it has none."""
    try:
        owner = json.loads((root / OWNER_FILE).read_text()).get("out")
    except (OSError, ValueError, AttributeError):
        return None
    return owner if isinstance(owner, str) else None


def claim_checkpoints(root: Path, out_dir: Path) -> None:
    """Marks ``root`` as the checkpoints of the run in ``out_dir`` (``OWNER_FILE``). Only
    for a folder under ``checkpoint.dir``: one inside the run's directory moves with it."""
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / OWNER_FILE, {"out": str(Path(out_dir).resolve())})
