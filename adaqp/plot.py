"""Training curves of one or several runs, side by side, drawn from their run folders.

``python -m adaqp.plot RUN_DIR [RUN_DIR ...] [--out FILE]`` (or ``adaqp-plot``) reads each
run's ``metrics.jsonl`` (finished or not) and ``config.json`` and draws, one line per run,
the training loss, the validation accuracy and, where recorded, the test accuracy against
the epoch (top row) and against the cumulative training time (bottom row: the sum of
``epoch_time_s`` up to that epoch, so evaluation is excluded). The figure goes to
``<first RUN_DIR>/curves.png`` unless ``--out`` names a .png, .pdf or .svg file.

Exit codes: 0 written (its path printed), 2 a usage error: a folder that does not exist or
holds no ``metrics.jsonl``, a line that is not an epoch record, a run with no epochs, an
``--out`` that cannot be written, or matplotlib (the ``bench`` extra) not installed.
matplotlib is imported only to draw, torch never: ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from adaqp.cli.deps import extra_fix
from adaqp.cli.parser import Parser
from adaqp.process.atomic import write_atomic
from adaqp.run.metrics import EpochRecord

FORMATS = (".png", ".pdf", ".svg")
DEFAULT_NAME = "curves.png"
METRICS_FILE, CONFIG_FILE, SUMMARY_FILE = "metrics.jsonl", "config.json", "summary.json"
"""A run folder's files (``adaqp.run.metrics``), named here so that reading them loads
nothing of the training path (torch included)."""
MATPLOTLIB_FIX = "bash launch/setup.sh --bench (or .venv/bin/pip install matplotlib)"
EXIT_CODES = "exit codes: 0 written, 2 a usage error (a bad run folder or --out, no matplotlib)"


class UsageError(Exception):
    """A bad run folder or argument: one ``error:`` line and exit code 2."""


@dataclass
class Run:
    """One run folder's epochs and the label its lines carry."""

    label: str
    records: list[EpochRecord]

    def train_time_s(self) -> list[float]:
        """Seconds of training (``epoch_time_s`` summed) at the end of each epoch."""
        return list(itertools.accumulate(r.epoch_time_s for r in self.records))


def _record(obj: object) -> EpochRecord:
    """An epoch record from one parsed line; TypeError where it is not one."""
    if not isinstance(obj, dict):
        raise TypeError("not a JSON object")
    record = EpochRecord.from_json(obj)
    for name in ("epoch", "train_loss", "epoch_time_s", "val_acc", "test_acc"):
        value = getattr(record, name)
        optional = name in ("val_acc", "test_acc") and value is None
        if not optional and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise TypeError(f"{name} is {value!r}, not a number")
    return record


def read_records(path: Path) -> list[EpochRecord]:
    """The epochs in a ``metrics.jsonl``. A last line without its newline that does not
    parse is being written (or was cut short by a kill): it is left out, with a note.
    Any other line that is not an epoch record is a UsageError naming it."""
    text = path.read_text()
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(_record(json.loads(line)))
        except (ValueError, TypeError) as exc:
            if number == len(lines) and not text.endswith("\n"):
                print(f"note: {path}: line {number} is incomplete, left out", file=sys.stderr)
                break
            raise UsageError(f"{path}: line {number} is not an epoch record ({exc})") from None
    return records


def _mode(config_path: Path) -> str | None:
    """The run's mode from its ``config.json``; None where there is no such file."""
    if not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text())
    except ValueError as exc:
        raise UsageError(f"{config_path} is not JSON ({exc})") from None
    mode = config.get("comm", {}).get("mode") if isinstance(config, dict) else None
    return mode if isinstance(mode, str) else None


def read_run(run_dir: Path, name: str) -> Run:
    """The run in ``run_dir``, labelled ``name (mode)``, plus ``unfinished`` where it has
    no summary (interrupted, failed or still running)."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such folder")
    metrics = run_dir / METRICS_FILE
    if not metrics.is_file():
        raise UsageError(f"{run_dir}: no metrics.jsonl (not a run folder, or no epoch started)")
    records = read_records(metrics)
    if not records:
        raise UsageError(f"{metrics} is empty: the run trained no epoch, there is nothing to plot")
    notes = [m for m in (_mode(run_dir / CONFIG_FILE),) if m]
    if not (run_dir / SUMMARY_FILE).is_file():
        notes.append("unfinished")
    return Run(f"{name} ({', '.join(notes)})" if notes else name, records)


def read_runs(run_dirs: list[Path]) -> list[Run]:
    """Every run, labelled by its folder's name (by the path as given where two runs'
    folders share a name)."""
    names = [d.resolve().name for d in run_dirs]
    shared = {n for n in names if names.count(n) > 1}
    return [read_run(d, str(d) if n in shared else n) for d, n in zip(run_dirs, names, strict=True)]


def _pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    try:
        import matplotlib
    except ImportError:
        fix = extra_fix("matplotlib", f"install it with {MATPLOTLIB_FIX}")
        raise UsageError(f"matplotlib is not installed for {sys.executable}: {fix}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(runs: list[Run], out: Path) -> None:
    """Writes the figure to ``out`` (format from its suffix), replacing it whole."""
    plt = _pyplot()
    panels = [("train_loss", "training loss"), ("val_acc", "validation accuracy")]
    if any(r.test_acc is not None for run in runs for r in run.records):
        panels.append(("test_acc", "test accuracy"))
    fig, axes = plt.subplots(
        2, len(panels), figsize=(4.5 * len(panels), 7), sharey="col", squeeze=False
    )
    for i, run in enumerate(runs):
        # Colours by run, not by each panel's own cycle: a run with no accuracy still
        # keeps its colour in the other panels.
        style = {"color": f"C{i % 10}", "label": run.label}
        for col, (field, _) in enumerate(panels):
            points = [
                (r.epoch, t, getattr(r, field))
                for r, t in zip(run.records, run.train_time_s(), strict=True)
                if getattr(r, field) is not None
            ]
            marker = "o" if len(points) < 30 else None  # so that a few epochs show too
            for row in (0, 1):
                xs = [p[row] for p in points]
                axes[row][col].plot(xs, [p[2] for p in points], marker=marker, ms=3, **style)
    for col, (_, title) in enumerate(panels):
        axes[0][col].set_title(title)
        axes[0][col].set_xlabel("epoch")
        axes[0][col].xaxis.get_major_locator().set_params(integer=True)
        axes[1][col].set_xlabel("training time (s, evaluation excluded)")
        for row in (0, 1):
            axes[row][col].grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, lambda f: fig.savefig(f, format=out.suffix[1:].lower(), dpi=120))
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(
        prog="adaqp.plot",
        description=__doc__.split("\n\n")[0],
        epilog=f"{EXIT_CODES}. Needs matplotlib: {MATPLOTLIB_FIX}.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="a run's --out folder"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"figure to write, {', '.join(FORMATS)} by its suffix "
        f"(default: <first RUN_DIR>/{DEFAULT_NAME})",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out if args.out is not None else args.run_dirs[0] / DEFAULT_NAME
    try:
        if out.suffix.lower() not in FORMATS:
            raise UsageError(f"--out {out}: the suffix must be one of {', '.join(FORMATS)}")
        draw(read_runs(args.run_dirs), out)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
