"""The packages AdaQP's commands need, and the one line that says which are missing.

The commands (``python -m partition``, ``python -m adaqp.bench``, ``python -m
adaqp.cluster``, the launcher) ask :func:`require` or :func:`refusal` before they import
or start anything that needs torch, so that an interpreter without them (the system
python, where ``.venv`` was meant) ends in one line naming the packages and the fix, exit
code 2, instead of a ``ModuleNotFoundError`` traceback from deep inside, or one from every
worker. Only the standard library here: this module must import where nothing else does.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGES = ("torch", "numpy", "scipy", "pymetis", "ogb", "tqdm", "numba")
"""The import names of the dependencies in pyproject.toml (all that ``launch/setup.sh``
installs), in its order."""

_ROOT = Path(__file__).resolve().parent.parent


def missing(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Those of ``packages`` this interpreter cannot import (found without importing them)."""
    absent = []
    for name in packages:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it, a broken package
            found = False
        if not found:
            absent.append(name)
    return absent


def refusal(packages: tuple[str, ...] = PACKAGES) -> str | None:
    """The line that says which of ``packages`` are not installed and how to get them
    (without an ``error:`` prefix), or None where all are."""
    absent = missing(packages)
    if not absent:
        return None
    venv = _ROOT / ".venv" / "bin" / "python"
    if venv.exists():
        fix = f"use {venv} (or activate it: source {venv.parent / 'activate'})"
    else:
        fix = "run bash launch/setup.sh, then use .venv/bin/python (or source .venv/bin/activate)"
    verb = "is" if len(absent) == 1 else "are"
    return f"{', '.join(absent)} {verb} not installed for {sys.executable}: {fix}"


def venv_has(module: str, root: Path | None = None) -> bool:
    """Whether ``<root>/.venv`` holds the package ``module`` (looked for on disk: that
    interpreter is not started)."""
    lib = (_ROOT if root is None else root) / ".venv" / "lib"
    return any(lib.glob(f"python*/site-packages/{module}/__init__.py"))


def extra_fix(module: str, install: str, root: Path | None = None) -> str:
    """How to get ``module``, an optional extra's package (matplotlib) this interpreter
    lacks: where this is not ``.venv``'s interpreter and ``.venv`` has it, use that one
    (as ``refusal`` says for the core packages); else ``install``, the command that
    installs it (then use ``.venv``, where this is another interpreter)."""
    root = _ROOT if root is None else root
    venv = root / ".venv" / "bin" / "python"
    if not venv.exists() or Path(sys.prefix).resolve() == venv.parent.parent.resolve():
        return install
    if venv_has(module, root):
        return f"use {venv} (or activate it: source {venv.parent / 'activate'})"
    return f"{install}, then use {venv}"


def require(prog: str, packages: tuple[str, ...] = PACKAGES) -> None:
    """Ends the process (exit code 2) with ``refusal``'s line where a package is missing."""
    line = refusal(packages)
    if line is not None:
        print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(2)
