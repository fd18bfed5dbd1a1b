"""The README's and docs/' relative links lead somewhere: files that exist, headings that
exist (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens). Every user
config key is named in docs/config.md; the benchmark-only settings are listed in
docs/benchmarks.md and named in none of the pages a user reads to train."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)")


def anchors(page: Path) -> set[str]:
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target, anchor in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}#{anchor} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_check_finds_a_broken_anchor(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# A `b`: c\n\n[x](#a-b-c) [y](#nowhere)\n")
    assert anchors(page) == {"a-b-c"}
    assert [a for _, a in LINK.findall(page.read_text()) if a not in anchors(page)] == ["nowhere"]


# The config keys: every user key in docs/config.md; the benchmark-only settings in one
# place for benchmark authors (docs/benchmarks.md#benchmark-only-settings), and in none of
# the pages a user reads to train.
CONFIG_PAGE = ROOT / "docs" / "config.md"
BENCH_SETTINGS = (ROOT / "docs" / "benchmarks.md", "Benchmark-only settings")
USER_PAGES = [
    ROOT / "README.md",
    *(ROOT / "docs" / f"{name}.md" for name in ("training", "config", "design")),
    ROOT / "docs" / "checkpoints-and-faults.md",
    *(ROOT / "docs" / f"{name}.md" for name in ("datasets", "partitions")),
]
"""Pages that say how to train. The measurement pages (bit-widths, cost-models, staleness,
gat, benchmarks, kernels) may name a benchmark-only setting where a reading used it."""
BENCHMARK_ONLY_VALUES = {
    "quant.scheme": ("random",),
    "quant.cost_model": ("shared", "sender", "link"),
}
"""Values of user keys that only the benchmarks set (the values' docstrings in
adaqp/config/exchange.py say so)."""


def config_keys() -> tuple[list[str], list[str]]:
    """``(user keys, benchmark-only keys)`` as ``section.key``: a section's fields after its
    ``# Benchmark-only`` comment are benchmark-only (adaqp/config/exchange.py)."""
    import dataclasses
    import inspect

    from adaqp.config import Config

    user, bench = [], []
    for section in dataclasses.fields(Config):
        cls = section.default_factory()
        source = inspect.getsource(type(cls))
        marker = source.find("# Benchmark-only")
        for field in dataclasses.fields(cls):
            at = re.search(rf"^\s+{field.name}:", source, re.MULTILINE).start()
            key = f"{section.name}.{field.name}"
            (bench if 0 <= marker < at else user).append(key)
    return user, bench


def section_text(page: Path, title: str) -> str:
    """The text under the heading ``title`` of ``page``, up to the next heading of its level."""
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip("#").strip() == title)
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level
        ),
        len(lines),
    )
    return "\n".join(lines[start:end])


def documented(key: str, text: str) -> bool:
    """``section.key`` written out, or `key` in a bullet that names `[section]`."""
    section, name = key.split(".")
    if re.search(rf"`{re.escape(key)}\b", text):
        return True
    bullets = re.split(r"\n(?=- )", text)
    return any(f"`[{section}]`" in b and f"`{name}`" in b for b in bullets)


def benchmark_mentions(text: str, bench_keys: list[str]) -> list[str]:
    """The benchmark-only keys and values ``text`` names."""
    found = []
    for key in bench_keys:
        name = key.split(".")[1]
        if re.search(rf"`{name}`|\b{re.escape(key)}\b|\b{name}\s*=", text):
            found.append(key)
    for key, values in BENCHMARK_ONLY_VALUES.items():
        name = key.split(".")[1]
        words = name.replace("_", "[_ ]")  # cost_model, or "cost model" in a sentence
        for value in values:
            # quant.cost_model=shared, cost_model = "shared", cost model `shared`
            if re.search(rf"{name}\s*=\s*\"?{value}\b|{words}s?\W{{1,6}}`{value}`", text):
                found.append(f"{key} = {value}")
    return found


def test_every_user_config_key_is_in_config_md():
    user, _ = config_keys()
    text = section_text(CONFIG_PAGE, "Configs and config keys")
    missing = [key for key in user if not documented(key, text)]
    assert not missing, f"docs/config.md#configs-and-config-keys lacks {missing}"


def test_benchmark_only_settings_are_listed_once_and_left_out_of_the_users_pages():
    from adaqp.config import COST_MODELS, SCHEMES

    _, bench = config_keys()
    assert {"comm.overlap_allreduce", "staleness.landing"} <= set(bench)  # the parse works
    assert set(BENCHMARK_ONLY_VALUES["quant.scheme"]) <= set(SCHEMES)
    assert set(BENCHMARK_ONLY_VALUES["quant.cost_model"]) <= set(COST_MODELS)
    listed = section_text(*BENCH_SETTINGS)
    for key in bench:
        assert f"`{key}" in listed, f"{key} is missing from benchmarks.md's list"
    for key, values in BENCHMARK_ONLY_VALUES.items():
        assert all(f'"{v}"' in listed for v in values) and f"`{key}" in listed, key
    named = {
        str(page.relative_to(ROOT)): found
        for page in USER_PAGES
        if (found := benchmark_mentions(page.read_text(), bench))
    }
    assert not named, f"benchmark-only settings in the user's pages: {named}"


def test_the_key_checks_can_fail():
    _, bench = config_keys()
    text = "- Sections (`[quant]`): `seed`.\n- `staleness.landing`, `quant.cost_model=shared`."
    assert documented("quant.seed", text) and not documented("quant.bits", text)
    assert documented("staleness.landing", text) and not documented("comm.seed", text)
    assert benchmark_mentions(text, bench) == ["staleness.landing", "quant.cost_model = shared"]
    assert benchmark_mentions("the cost model `sender` and `time_limit_s`", bench) == [
        "quant.time_limit_s",
        "quant.cost_model = sender",
    ]
    assert benchmark_mentions("rows landing late; shared storage; a random partition", bench) == []
    assert benchmark_mentions("docs/cost-models.md: the cost model, link profiling", bench) == []
