"""The environment variables through which ``launch/train.sh`` and the launcher tell the
workers what the user typed and where to report how they ended. No imports: the launcher,
which loads no third-party package, and ``adaqp.train`` both take these names from here."""

CALLER_CWD_ENV = "ADAQP_CALLER_CWD"
"""Set by launch/train.sh, which runs from the checkout: the folder the user typed the
command in. The launcher resolves the command line's paths against it; a worker's
``--resume`` hint shows its output folder absolute where it differs from the checkout."""

STATUS_DIR_ENV = "ADAQP_STATUS_DIR"
"""Set by the launcher: each rank writes its exit code to ``rank-<RANK>.code`` there."""

COMMAND_ENV = "ADAQP_COMMAND"
"""Set by the launcher: the command as the user typed it (for the ``--resume`` hint)."""
