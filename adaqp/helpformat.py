"""How the commands' ``--help`` reads: each option's default after its help, and the line
breaks of descriptions kept (``python -m adaqp.bench``, ``python -m adaqp.cluster``)."""

from __future__ import annotations

import argparse


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
