"""``python -m adaqp.plot``: figures from run folders, and one error line for each bad input."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from adaqp.cli import deps
from adaqp.plot import main, read_runs
from adaqp.run.metrics import EpochRecord

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _record(epoch: int, test_acc: float | None = 0.6) -> dict:
    """A ``metrics.jsonl`` line as the trainer writes it (every field, old names too)."""
    record = EpochRecord(
        epoch,
        train_loss=2.0 / epoch,
        epoch_time_s=0.1 * epoch,
        comm_time_s=0.01,
        comm_wait_s=0.005,
        allreduce_time_s=0.002,
        halo_bytes_per_epoch=1000,
        train_acc=0.5,
        val_acc=0.5 + 0.01 * epoch,
        test_acc=test_acc,
    )
    return record.to_json()


def _run(
    parent: Path, name: str, epochs: int = 4, mode: str | None = "vanilla", finished: bool = True
) -> Path:
    run = parent / name
    run.mkdir()
    lines = [json.dumps(_record(e)) + "\n" for e in range(1, epochs + 1)]
    (run / "metrics.jsonl").write_text("".join(lines))
    if mode is not None:
        (run / "config.json").write_text(json.dumps({"comm": {"mode": mode}}))
    if finished:
        (run / "summary.json").write_text("{}")
    return run


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, data[:8]
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_one_run_writes_a_png_into_its_folder_and_prints_the_path(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = _run(tmp_path, "cora-gcn-vanilla-p4")
    assert main([str(run)]) == 0
    out = run / "curves.png"
    assert capsys.readouterr().out.strip() == str(out)
    width, height = _png_size(out)
    assert width > 800 and height > 400


@pytest.mark.parametrize("suffix, magic", [(".pdf", b"%PDF"), (".svg", b"<?xml")])
def test_two_runs_in_one_figure_of_the_format_out_names(tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    a = _run(tmp_path, "a")
    b = _run(tmp_path, "b", epochs=7, mode="adaqp", finished=False)
    out = tmp_path / "figures" / f"compare{suffix}"
    assert main([str(a), str(b), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(magic)
    assert not (a / "curves.png").exists()


def test_labels_name_the_folder_mode_and_unfinished_runs(tmp_path):
    runs = read_runs(
        [
            _run(tmp_path, "a"),
            _run(tmp_path, "b", mode="adaqp", finished=False),
            _run(tmp_path, "c", mode=None),
        ]
    )
    assert [r.label for r in runs] == ["a (vanilla)", "b (adaqp, unfinished)", "c"]
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    same = [_run(tmp_path / "x", "run"), _run(tmp_path / "y", "run")]
    assert [r.label for r in read_runs(same)] == [f"{p} (vanilla)" for p in same]


def test_training_time_is_the_running_sum_of_epoch_times(tmp_path):
    (run,) = read_runs([_run(tmp_path, "a", epochs=3)])
    assert [r.epoch for r in run.records] == [1, 2, 3]
    assert run.train_time_s() == pytest.approx([0.1, 0.3, 0.6])


def _corrupt(line: str):
    def write(run: Path) -> None:
        with open(run / "metrics.jsonl", "a") as f:
            f.write(line + "\n")
            f.write(json.dumps(_record(9)) + "\n")

    return write


BAD_INPUTS = {
    "missing folder": (lambda run: None, "nowhere", "nowhere: no such folder"),
    "no metrics": (
        lambda run: (run / "metrics.jsonl").unlink(),
        None,
        "no metrics.jsonl",
    ),
    "not json": (_corrupt("{not json"), None, "line 5 is not an epoch record"),
    "not a record": (_corrupt('{"epoch": 5}'), None, "line 5 is not an epoch record"),
    "not an object": (_corrupt("[1, 2]"), None, "not a JSON object"),
    "loss not a number": (
        _corrupt(json.dumps({**_record(5), "train_loss": "low"})),
        None,
        "train_loss is 'low', not a number",
    ),
    "empty": (
        lambda run: (run / "metrics.jsonl").write_text(""),
        None,
        "is empty: the run trained no epoch",
    ),
    "corrupt config": (
        lambda run: (run / "config.json").write_text("{"),
        None,
        "config.json is not JSON",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_each_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, case):
    damage, other_path, message = BAD_INPUTS[case]
    good = _run(tmp_path, "good")
    bad = _run(tmp_path, "bad")
    damage(bad)
    bad_arg = str(tmp_path / other_path) if other_path else str(bad)
    assert main([str(good), bad_arg]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert message in captured.err
    assert not (good / "curves.png").exists()


def test_an_out_of_another_format_is_refused(tmp_path, capsys):
    run = _run(tmp_path, "a")
    assert main([str(run), "--out", str(tmp_path / "curves.jpg")]) == 2
    assert "must be one of .png, .pdf, .svg" in capsys.readouterr().err


def test_a_last_line_still_being_written_is_left_out(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = _run(tmp_path, "a", finished=False)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(_record(5))[:40])  # no newline: the writer is mid-line
    (parsed,) = read_runs([run])
    assert [r.epoch for r in parsed.records] == [1, 2, 3, 4]
    assert main([str(run)]) == 0
    assert "line 5 is incomplete, left out" in capsys.readouterr().err
    # Only the last line may be incomplete: an earlier one is corrupt.
    (run / "metrics.jsonl").write_text(json.dumps(_record(1))[:40] + "\n" + json.dumps(_record(2)))
    assert main([str(run)]) == 2
    assert "line 1 is not an epoch record" in capsys.readouterr().err


def test_a_run_without_test_accuracy_still_plots(tmp_path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "a"
    run.mkdir()
    lines = [json.dumps(_record(e, test_acc=None)) for e in (1, 2)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main([str(run)]) == 0
    _png_size(run / "curves.png")


def test_without_matplotlib_it_names_the_package_and_the_fix(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # ``import matplotlib`` fails
    run = _run(tmp_path, "a")
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: matplotlib is not installed") and err.count("\n") == 1
    assert "bash launch/setup.sh --bench" in err and "pip install matplotlib" in err
    assert not (run / "curves.png").exists()


def test_help_imports_neither_matplotlib_nor_torch():
    code = (
        "import sys\nfrom adaqp.plot import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as exc:\n    assert exc.code == 0\n"
        "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "RUN_DIR" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_without_matplotlib_another_python_is_told_to_use_the_venv_that_has_it(
    tmp_path, capsys, monkeypatch
):
    """Under the system python it said to run setup.sh --bench though .venv had matplotlib."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(sys, "prefix", "/usr")  # not .venv's interpreter
    checkout = tmp_path / "checkout"
    venv = checkout / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setattr(deps, "_ROOT", checkout)
    run = _run(tmp_path, "a")

    assert main([str(run)]) == 2  # .venv without matplotlib: install it, then use .venv
    err = capsys.readouterr().err
    assert "bash launch/setup.sh --bench" in err and f"then use {venv / 'bin' / 'python'}" in err

    package = venv / "lib" / "python3.11" / "site-packages" / "matplotlib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: matplotlib is not installed for ") and err.count("\n") == 1
    assert f"use {venv / 'bin' / 'python'} (or activate it" in err
    assert "setup.sh" not in err and not (run / "curves.png").exists()
