"""How the commands' command lines read: ``--help`` with each option's default after its
help and the line breaks of descriptions kept (``HelpFormatter``), and the errors every
command gives alike (``Parser``): an unknown option names the close one (``--epoch 5``:
did you mean ``--epochs``?), and a ``--set`` item without ``=`` says so, where argparse
alone would take the item's value for another argument. Standard library only: the
launcher, which loads no third-party package, words its errors with the same helpers.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence
from typing import NoReturn

UNRECOGNIZED = "unrecognized arguments: "
"""How argparse's refusal of words it does not know begins."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default after its help (not for a default of None, False or an
    empty list, nor where the help already says "(default ...") and keeps the line breaks
    of descriptions."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default == [] or "(default" in text:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """Every command's parser: a prefix of an option is a typo, not the option it starts
    (``allow_abbrev`` off unless asked for), an unknown option's error names the closest
    option of this parser and of its subcommands, and a ``--set`` item without ``=`` is
    refused before argparse takes the word after it for something else (``--set
    model.hidden 128`` would read ``128`` as an unknown argument or a config). Errors stay
    argparse's: the usage, one ``prog: error: ...`` line, exit code 2."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        if "--set" in self._option_string_actions:
            problem = set_item_problem(words)
            if problem is not None:
                self.error(problem)
        return super().parse_known_args(words, namespace)

    def error(self, message: str) -> NoReturn:
        if message.startswith(UNRECOGNIZED):
            message += did_you_mean(message[len(UNRECOGNIZED) :].split(), self.option_names())
        super().error(message)

    def option_names(self) -> list[str]:
        """Every option string of this parser and of its subcommands' parsers (argparse
        reports a subcommand's unknown words from the top parser)."""
        names = list(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    names += sub.option_names() if isinstance(sub, Parser) else []
        return names


def did_you_mean(words: Iterable[str], options: Iterable[str]) -> str:
    """``"; did you mean --epochs?"`` for the unknown options among ``words`` that are
    close to one of ``options`` (``difflib``'s close match); ``""`` where none is.

    Several: ``"; did you mean --epochs for --epoch, --seed for --sed?"``. A word that is
    not an option (it does not start with ``-``) is a value and gets no suggestion.
    """
    options = sorted(set(options))
    found: list[tuple[str, str]] = []
    for word in words:
        flag = word.partition("=")[0]
        if not flag.startswith("-") or flag in options:
            continue
        close = difflib.get_close_matches(flag, options, n=1)
        if close and (flag, close[0]) not in found:
            found.append((flag, close[0]))
    if not found:
        return ""
    if len(found) == 1:
        return f"; did you mean {found[0][1]}?"
    return "; did you mean " + ", ".join(f"{match} for {flag}" for flag, match in found) + "?"


def set_item_problem(words: Sequence[str]) -> str | None:
    """The error for the first ``--set`` item in ``words`` (up to a ``--``) that has no
    ``=``, naming the item it most likely meant; None where every item has one.

    ``--set model.hidden 128`` -> ``--set takes KEY=VALUE: "model.hidden" has no "=";
    did you mean --set model.hidden=128?``. An item followed by an option or by nothing
    gets ``=VALUE`` in the suggestion.
    """
    for i, word in enumerate(words):
        if word == "--":
            return None
        if word == "--set" and i + 1 < len(words) and not words[i + 1].startswith("-"):
            item, after = words[i + 1], words[i + 2 : i + 3]
        elif word.startswith("--set="):
            item, after = word[len("--set=") :], words[i + 1 : i + 2]
        else:
            continue
        if "=" in item:
            continue
        value = after[0] if after and not after[0].startswith("-") else "VALUE"
        return f'--set takes KEY=VALUE: "{item}" has no "="; did you mean --set {item}={value}?'
    return None
