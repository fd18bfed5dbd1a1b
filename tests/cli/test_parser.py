"""The errors every command's parser gives alike (``adaqp.cli.parser``): the option meant
by an unknown one, and a ``--set`` item without ``=``."""

from __future__ import annotations

import pytest

from adaqp.cli.parser import Parser, did_you_mean, set_item_problem

OPTIONS = ["--epochs", "--seed", "--set", "--mode", "-h", "--help"]


@pytest.mark.parametrize(
    ("words", "hint"),
    [
        (["--epoch", "5"], "; did you mean --epochs?"),
        (["--epoch=5"], "; did you mean --epochs?"),
        (["--epoch", "5", "--sed", "1"], "; did you mean --epochs for --epoch, --seed for --sed?"),
        (["--frobnicate"], ""),  # close to nothing: no guess
        (["epochs"], ""),  # a value, not an option
        (["--seed"], ""),  # known: argparse refused something else
    ],
)
def test_did_you_mean(words, hint):
    assert did_you_mean(words, OPTIONS) == hint


@pytest.mark.parametrize(
    ("words", "problem"),
    [
        (["--set", "a.b", "128"], "did you mean --set a.b=128?"),
        (["--set=a.b", "128"], "did you mean --set a.b=128?"),
        (["--set", "a.b", "--epochs", "3"], "did you mean --set a.b=VALUE?"),
        (["--set", "a.b"], "did you mean --set a.b=VALUE?"),
        (["--set", "a.b=1", "--set", "c.d", "2"], '"c.d" has no "="'),
    ],
)
def test_a_set_item_without_equals_is_named(words, problem):
    found = set_item_problem(words)
    assert found is not None and found.startswith("--set takes KEY=VALUE: ")
    assert problem in found


@pytest.mark.parametrize(
    "words",
    [["--set", "a.b=1"], ["--set=a.b=1", "x"], ["--", "--set", "a.b"], ["--set", "--epochs"]],
)
def test_items_with_equals_and_words_after_a_separator_pass(words):
    assert set_item_problem(words) is None


def test_a_subcommands_options_are_suggested_and_set_is_checked_only_where_taken(capsys):
    parser = Parser(prog="tool")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--out-dir")
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["run", "--out-dr", "x"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tool: error: unrecognized arguments: --out-dr x; did you mean --out-dir?"
    )
    # This parser takes no --set: "--set a.b" is an unknown option like any other.
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--set", "a.b"])
    assert capsys.readouterr().err.splitlines()[-1].endswith("unrecognized arguments: --set a.b")


def test_a_prefix_is_refused_unless_asked_for():
    parser = Parser()
    parser.add_argument("--epochs", type=int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--epoch", "3"])
    loose = Parser(allow_abbrev=True)
    loose.add_argument("--epochs", type=int)
    assert loose.parse_args(["--epoch", "3"]).epochs == 3
