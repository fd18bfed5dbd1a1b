"""adaqp/cli/deps.py: the commands run with an interpreter that lacks torch and the others say
so in one line with the fix, exit code 2, instead of a traceback; their --help still works.

The packages are hidden from a child python by a ``sitecustomize`` that refuses them as an
interpreter without them does (ModuleNotFoundError): the same on any machine, whatever the
system python holds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from adaqp.cli import deps

ROOT = Path(__file__).resolve().parents[2]
CORA = str(ROOT / "configs" / "cora-gcn.toml")

HIDE = """\
import os, sys

hidden = set(os.environ["ADAQP_TEST_HIDE"].split(","))


class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Hide())
"""


def _run(tmp_path: Path, args: list[str], hide: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDE)
    env = dict(os.environ, ADAQP_TEST_HIDE=hide, NPROC="2")
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_the_list_is_pyprojects_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~ \[;]", req)[0] for req in project["dependencies"]]
    assert list(deps.PACKAGES) == names


def test_the_line_names_what_is_missing_and_the_fix(monkeypatch):
    assert deps.missing() == [] and deps.refusal() is None  # this suite's own environment
    line = deps.refusal(("numpy", "no_such_package_here", "also_not_here"))
    assert line.startswith("no_such_package_here, also_not_here are not installed for ")
    assert sys.executable in line and ".venv" in line and "\n" not in line


PARTITION = ["-m", "partition", "--num-parts", "4", "--out", "p"]
CLUSTER = ["-m", "adaqp.cluster", "--hosts", "2", "--", "--config", CORA]


@pytest.mark.parametrize(
    ("args", "hide", "prog"),
    [
        (PARTITION, "pymetis", "python -m partition"),
        (PARTITION, "torch,numpy", "python -m partition"),
        (["-m", "adaqp.bench", "modes", "--epochs", "1"], "torch", "python -m adaqp.bench"),
        (["-m", "adaqp.bench", "quant"], "torch", "python -m adaqp.bench"),  # imports torch
        (["-m", "adaqp.bench", "quant", "--help"], "torch", "python -m adaqp.bench"),
        (CLUSTER, "torch", "python -m adaqp.cluster"),
        (["-m", "adaqp.launcher", CORA, "--epochs", "1"], "torch", None),
        (["-m", "adaqp.train", "--config", CORA, "--out", "p"], "torch", "python -m adaqp.train"),
        (["-m", "adaqp.train", "--config", CORA], "numpy", "python -m adaqp.train"),
    ],
)
def test_a_missing_package_is_one_line_and_exit_2(tmp_path, args, hide, prog):
    proc = _run(tmp_path, args, hide)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    prefix = f"{prog}: error: " if prog else "error: "
    first = hide.split(",")[0]
    assert lines[0].startswith(prefix + first), lines
    assert "not installed for" in lines[0] and ".venv" in lines[0], lines
    assert not proc.stdout and not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("args", "needed"),
    [
        (["-m", "partition", "--help"], ("numpy",)),  # the config's defaults import it
        (["-m", "adaqp.bench", "modes", "--help"], ()),
        (["-m", "adaqp.cluster", "--help"], ()),
        (["-m", "adaqp.launcher", "--help"], ()),
    ],
)
def test_help_needs_none_of_them(tmp_path, args, needed):
    hidden = [name for name in deps.PACKAGES if name not in needed]
    proc = _run(tmp_path, args, ",".join(hidden))
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr
