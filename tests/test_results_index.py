"""The committed readings stay behind their index: every reading under results/bench is
listed in results/bench/README.md, every link from the README and docs/ into results/
leads to a file or folder that exists, and no folder is named for a rerun (a rerun
replaces the reading it repeats; git keeps the one it replaced).

A reading is the first folder down each path under results/bench that holds files; the
folders inside it (``idle/``, ``clusters/<name>/``) are part of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "results" / "bench"
INDEX = BENCH / "README.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")
RERUN = re.compile(r"-(v\d+|recheck|rerun|final|again|repeat|first-cycle(-\w+)?|seeds?-[\d-]+)$")
"""Names a rerun took before a reading was replaced: ``-v2``, ``-recheck``, ``-rerun``,
``-final``, ``-first-cycle-rerun``, ``-seeds-3-5``."""


def readings(bench: Path) -> list[Path]:
    """Each folder under ``bench`` that holds files and lies in no such folder."""
    found, stack = [], sorted(p for p in bench.iterdir() if p.is_dir())
    while stack:
        folder = stack.pop(0)
        if any(p.is_file() and not p.name.startswith(".") for p in folder.iterdir()):
            found.append(folder)
        else:
            stack[:0] = sorted(p for p in folder.iterdir() if p.is_dir())
    return found


def unindexed(bench: Path) -> list[str]:
    """Readings under ``bench`` that no link in ``bench``/README.md leads to or into."""
    index = bench / "README.md"
    targets = {(index.parent / t).resolve() for t in LINK.findall(index.read_text())}
    listed = {t if t.is_dir() else t.parent for t in targets}
    return [
        str(r.relative_to(bench))
        for r in readings(bench)
        if not any(r.resolve() == t or r.resolve() in t.parents for t in listed)
    ]


def broken_results_links(page: Path, root: Path = ROOT, into: str = "results") -> list[str]:
    """Relative links of ``page`` into ``root``/``into`` that lead nowhere."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (page.parent / target).resolve()
        if path.is_relative_to(root / into) and not path.exists():
            broken.append(target)
    return broken


def rerun_names(bench: Path) -> list[str]:
    return [
        str(p.relative_to(bench)) for p in bench.rglob("*") if p.is_dir() and RERUN.search(p.name)
    ]


def test_every_reading_is_in_the_index():
    assert readings(BENCH), "no readings found"
    missing = unindexed(BENCH)
    assert not missing, f"not listed in {INDEX.relative_to(ROOT)}: {missing}"


@pytest.mark.parametrize("page", [*PAGES, INDEX], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_into_results_resolve(page):
    broken = broken_results_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize(
    "page", sorted(BENCH.rglob("README.md")), ids=lambda p: str(p.relative_to(BENCH))
)
def test_links_from_readings_resolve(page):
    """A reading's README links its files, other readings and the docs."""
    broken = broken_results_links(page, into="")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_no_folder_is_named_for_a_rerun():
    assert not rerun_names(BENCH)


def test_the_checks_can_fail(tmp_path):
    """An unlisted reading, a dangling link and a rerun's name are each caught."""
    bench = tmp_path / "results" / "bench"
    (bench / "cluster" / "listed" / "idle").mkdir(parents=True)
    (bench / "cluster" / "listed" / "cluster.json").write_text("{}")
    (bench / "cluster" / "listed" / "idle" / "cluster.json").write_text("{}")
    (bench / "cluster" / "unlisted-v2").mkdir()
    (bench / "cluster" / "unlisted-v2" / "cluster.json").write_text("{}")
    (bench / "README.md").write_text("[a](cluster/listed/)\n")
    assert [p.name for p in readings(bench)] == ["listed", "unlisted-v2"]
    assert unindexed(bench) == ["cluster/unlisted-v2"]
    assert rerun_names(bench) == ["cluster/unlisted-v2"]
    page = tmp_path / "docs" / "a.md"
    page.parent.mkdir()
    page.write_text(
        "[ok](../results/bench/cluster/listed/cluster.json) "
        "[gone](../results/bench/cluster/gone/cluster.md) [other](../README.md)\n"
    )
    assert broken_results_links(page, tmp_path) == ["../results/bench/cluster/gone/cluster.md"]
    for name in ("x-v3", "x-recheck", "x-rerun", "x-final", "x-first-cycle-rerun", "x-seeds-3-5"):
        assert RERUN.search(name), name
    for name in ("signal-300mbit-gcn", "hosts-1gbit-0.3core", "seeds-3-5", "idle"):
        assert not RERUN.search(name), name
