"""What a run's checkpoint folder holds, and which of its checkpoints are complete: names
only, no torch.

Where that folder is (``<out>/checkpoints``, or a folder of its own under
``checkpoint.dir``) is :mod:`adaqp.run.placement`'s, which reads this before torch loads;
``adaqp.run.checkpoint`` writes and loads the checkpoints themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

from adaqp.process.atomic import write_json

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


def find_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (``adaqp.run.checkpoint``), or None.
    Complete means it has a manifest; its shards are verified when loaded."""
    epochs = complete_epochs(root)
    return step_dir(root, epochs[-1]) if epochs else None


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
