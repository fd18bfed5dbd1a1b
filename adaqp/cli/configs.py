"""The config files a user can name, and the line that refuses one that is not there with
the configs that are. Standard library only: the launcher, which loads no third-party
package, and ``load_config`` (``adaqp.config.typed_toml``) say it alike."""

from __future__ import annotations

import os
from pathlib import Path

CONFIGS = "configs"
"""The folder of config files, one per workload: the working folder's, else the checkout's."""


def config_files(cwd: Path | None = None) -> tuple[str, list[str]]:
    """The config files a user can name from ``cwd`` (default: the working folder):
    ``configs/*.toml`` there, else in the checkout beside this package. Returns the
    folder as a user in ``cwd`` would type it (relative where it lies below ``cwd``, else
    absolute) and the files' names, sorted; no names where neither folder holds one."""
    cwd = Path.cwd() if cwd is None else cwd
    for folder in (cwd / CONFIGS, Path(__file__).resolve().parents[2] / CONFIGS):
        names = sorted(path.name for path in folder.glob("*.toml"))
        if names:
            try:
                return str(folder.relative_to(cwd)), names
            except ValueError:
                return str(folder.resolve()), names
    return CONFIGS, []


def missing_config(path: str | os.PathLike[str], cwd: Path | None = None) -> str:
    """The one-line refusal of a config ``path`` that is not a regular file; where it does
    not exist, with the configs that do (``config_files``): those in ``cwd``'s
    ``configs/`` as paths to type, the checkout's as its folder and their names."""
    path = Path(path)
    if path.exists():
        return f"config file {path} is not a regular file"
    folder, names = config_files(cwd)
    if not names:
        return f"config file {path} not found"
    if folder == CONFIGS:
        return f"config file {path} not found; the configs here: " + ", ".join(
            f"{CONFIGS}/{name}" for name in names
        )
    return f"config file {path} not found; the configs in {folder}/: " + ", ".join(names)
