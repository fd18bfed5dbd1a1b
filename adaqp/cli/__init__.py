"""What every command shares: how its command line reads and errs (``parser``), the
config files a user can name (``configs``), the packages it needs (``deps``), and what the
launcher hands its workers (``handoff``). Standard library only: the launcher loads no
third-party package."""
