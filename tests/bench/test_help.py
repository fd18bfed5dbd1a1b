"""The command lines of ``adaqp.bench``, ``adaqp.cluster`` and ``partition``: every option
explained with its default, whole summaries, and ``--help`` without importing torch."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from adaqp.bench.__main__ import BENCHMARKS, build_parser, main
from adaqp.cli.parser import HelpFormatter
from adaqp.emulate.cli import build_parser as cluster_parser
from partition.__main__ import build_parser as partition_parser

ROOT = Path(__file__).resolve().parents[2]
OURS = [name for name in BENCHMARKS if name != "quant"]  # quant's options are its owner's

# Runs each entry point as ``python -m`` does, with every ``--help`` in ``sys.argv`` lists,
# then reports whether torch was imported and the exit codes.
HELP_SCRIPT = """
import json, runpy, sys
module, runs = sys.argv[1], json.loads(sys.argv[2])
codes = []
for argv in runs:
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        codes.append(exc.code)
print(json.dumps({"torch": "torch" in sys.modules, "codes": codes}))
"""


def _sub_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    return not (default is None or default is False or default == [])


def _check_explained(parser: argparse.ArgumentParser, monkeypatch) -> None:
    """Every option has help, and the help shows its default (wide: no line breaks)."""
    monkeypatch.setenv("COLUMNS", "1000")
    text = parser.format_help()
    for action in _options(parser):
        assert action.help, f"{parser.prog} {action.option_strings}: no help"
        if "(default" in action.help:
            continue
        if _shows_default(action):
            assert f"(default: {action.default})" in text, (parser.prog, action.option_strings)
        else:  # None / False / []: the help must say what happens without the option
            assert action.required or isinstance(
                action, argparse._StoreTrueAction | argparse._AppendAction
            ), (parser.prog, action.option_strings)


@pytest.mark.parametrize("name", OURS)
def test_every_benchmark_option_is_explained_with_its_default(name, monkeypatch):
    _check_explained(_sub_parser(build_parser(name), name), monkeypatch)


def test_cluster_and_partition_options_are_explained_with_their_defaults(monkeypatch):
    _check_explained(cluster_parser(), monkeypatch)
    parser = partition_parser()
    _check_explained(parser, monkeypatch)
    text = parser.format_help()
    for option in ("--method", "--objective", "--seed", "--dataset"):
        action = next(a for a in parser._actions if option in a.option_strings)
        assert "(default: the config's" in action.help, option  # None: from the config
    assert "else metis" in text and "--force" in text


def test_top_level_help_shows_each_summary_whole(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for name, summary in BENCHMARKS.items():
        assert f"{name} {summary}" in text, name
    assert "results/local/bench" in text and "pip install -e .[bench]" in text


def test_the_summary_table_names_every_benchmark_module():
    modules = {
        path.stem
        for path in (ROOT / "adaqp" / "bench").glob("*.py")
        if "def add_arguments" in path.read_text()
    }
    assert set(BENCHMARKS) == modules


def test_a_benchmark_help_shows_its_module_description(capsys):
    with pytest.raises(SystemExit):
        main(["cluster", "--help"])
    out = capsys.readouterr().out
    assert "--workload" in out and "breakdown.png" in out and "``" not in out
    with pytest.raises(SystemExit) as exit_info:
        main(["nonesuch"])
    assert exit_info.value.code == 2


def test_formatter_leaves_unset_defaults_out():
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--a", default=3, help="a")
    parser.add_argument("--b", help="b")
    parser.add_argument("--c", action="store_true", help="c")
    parser.add_argument("--d", default="x", help="d (default: none of it)")
    text = parser.format_help()
    assert "a (default: 3)" in text and "(default: None)" not in text
    assert "(default: False)" not in text and "(default: x)" not in text


def _help_run(module: str, runs: list[list[str]]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", HELP_SCRIPT, module, json.dumps(runs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("module", "runs"),
    [
        ("adaqp.bench", [["--help"], *([name, "--help"] for name in OURS)]),
        ("adaqp.cluster", [["--help"]]),
        ("partition", [["--help"]]),
    ],
    ids=["bench", "cluster", "partition"],
)
def test_help_answers_without_importing_torch(module, runs):
    result = _help_run(module, runs)
    assert result["codes"] == [0] * len(runs)
    assert not result["torch"], f"python -m {module} --help imported torch"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("cluster --bandwidth fast", "bandwidth: cannot read 'fast'"),
        ("cluster --bandwidth 1gbit,2gbit --hosts 4", "bandwidth has 2 values for 4 hosts"),
        ("cluster --latency soon", "latency: cannot read 'soon'"),
        ("cluster --seeds a,b", "argument --seeds: expected comma-separated integers"),
        ("cluster --modes adaqp,turbo", "--modes: unknown turbo; must include vanilla"),
        ("modes --seeds 1,1", "argument --seeds: a seed is named twice"),
        ("modes --variants adaqp", "--variants: must include vanilla"),
        ("scaling --world-sizes 1,x", "argument --world-sizes: expected comma-separated positive"),
        ("scaling --partition-nodes 0", "argument --partition-nodes: expected comma-separated"),
    ],
)
def test_bad_options_are_one_line_and_exit_2_before_any_work(argv, message, tmp_path, capsys):
    """A typo in a link setting used to end a cluster run with a traceback after the
    partitioning; a bad seed list (or a scaling benchmark's list of sizes) was a ValueError
    traceback."""
    with pytest.raises(SystemExit) as info:
        main([*argv.split(), "--out-dir", str(tmp_path / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error: " in err[-1] and message in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "out").exists()
