"""``python -m adaqp.train`` as a newcomer meets it: help, figures, folders, Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from adaqp.config import ConfigError
from adaqp.run.summary import _hidden
from adaqp.train import (
    MODE_HELP,
    STATUS_DIR_ENV,
    _report_shared,
    config_from_args,
    format_bytes,
    main,
    parse_args,
    result_line,
    resume_command,
)
from tests.train_command import ROOT, command_env, run_command, train_args, wait_for


def test_help_lists_the_modes_and_exit_codes_without_importing_torch():
    code = (
        "import sys\n"
        "from adaqp.train import main\n"
        "try:\n    main(['--help'])\n"
        "except SystemExit as e:\n    assert e.code == 0\n"
        "print('torch' in sys.modules)\n"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=command_env(), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("False"), proc.stdout  # torch never loaded
    for mode in ("vanilla", "adaqp-q", "adaqp-p", "adaqp", "adaqp-s", "onebit", "nocomm"):
        assert f"\n  {mode} " in proc.stdout
    assert "130 interrupted" in proc.stdout
    assert time.monotonic() - started < 60


def test_a_missing_config_lists_the_configs_here(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError) as refused:
        config_from_args(parse_args(["--config", "configs/cora_gcn.toml"]))
    message = str(refused.value)
    assert message.startswith("config file configs/cora_gcn.toml not found; the configs here: ")
    assert "configs/citeseer-gcn.toml, " in message and "configs/cora-gcn.toml" in message


def test_flags_exclude_each_other_as_documented():
    assert parse_args(["--resume"]).resume and parse_args(["--overwrite"]).overwrite
    with pytest.raises(SystemExit):
        parse_args(["--resume", "--overwrite"])


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (999, "999 B"), (5240, "5.24 kB"), (13552, "13.6 kB"), (2.5e6, "2.5 MB")],
)
def test_bytes_are_shown_in_a_unit_that_keeps_them_apart(n, text):
    assert format_bytes(n) == text


def _summary(mode: str, avg_bits: float = 32.0, staleness_bound: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        avg_bits=avg_bits,
        staleness_bound=staleness_bound,
        final_test_acc=0.45,
        dataset="cora",
        model="gcn",
        mode=mode,
        world_size=2,
        test_acc_at_best_val=0.5,
        best_val_acc=0.6,
        best_epoch=3,
        final_train_loss=1.0,
        epoch_time_s=0.1,
        comm_time_s=0.01,
        halo_bytes_per_epoch=13552,
    )


def test_result_line_names_the_folder_and_marks_nocomm_accuracy():
    line = result_line(_summary("vanilla"), Path("results/runs/x"))
    assert "13.6 kB/epoch" in line and line.endswith("written to results/runs/x")
    assert "not meaningful" not in line
    assert "(nocomm: not meaningful)" in result_line(_summary("nocomm"), Path("o"))
    assert "test acc 0.5000 (best val 0.6000 at epoch 3), final test acc 0.4500" in line


def test_result_line_of_a_quantized_mode_shows_its_bits_and_says_when_they_are_32():
    for mode in ("adaqp", "adaqp-q"):
        line = result_line(_summary(mode, avg_bits=2.345), Path("o"))
        assert "/epoch, 2.35 bits; written" in line and "float32" not in line, line
    line = result_line(_summary("adaqp", avg_bits=32.0), Path("o"))
    assert "32 bits (float32: every message stays within one host;" in line
    assert 'quant.full_precision = "never" quantizes)' in line
    hosts = _summary("adaqp", avg_bits=32.0)
    hosts.host_of_rank = [0, 1]
    assert "32 bits (float32: the start-up profile;" in result_line(hosts, Path("o"))


@pytest.mark.parametrize(
    ("mode", "bits", "bound", "shown"),
    [
        ("vanilla", 32.0, 0, "32 bits"),
        ("adaqp-p", 32.0, 0, "32 bits"),
        ("onebit", 1.0, 1, "1 bit, staleness bound 1"),
        ("onebit", 2.0, 2, "2 bits, staleness bound 2"),
        ("adaqp-s", 1.5, 1, "1.50 bits, staleness bound 1"),
        ("nocomm", 32.0, 0, "no exchange"),
    ],
)
def test_result_line_names_the_precision_and_the_staleness(mode, bits, bound, shown):
    """Vanilla's line named no precision, onebit's no staleness."""
    line = result_line(_summary(mode, avg_bits=bits, staleness_bound=bound), Path("o"))
    assert f"/epoch, {shown}; written" in line, line


def test_adaqp_q_help_says_one_width_unless_the_scheme_is_adaptive():
    """It said widths were chosen per message group, which only quant.scheme=adaptive does."""
    text = MODE_HELP["adaqp-q"]
    assert "all at quant.bits" in text and "quant.scheme=adaptive: a solver's width" in text


def test_hidden_fraction_stays_within_zero_and_one():
    assert _hidden(0.04, 0.042) == 0.0  # a synchronous exchange's wait measured a bit longer
    assert _hidden(0.04, 0.01) == pytest.approx(0.75)
    assert _hidden(0.0, 0.0) == 0.0


def test_resume_command_is_the_users_without_fresh_start_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("ADAQP_COMMAND", "bash launch/train.sh c.toml --overwrite --epochs 9")
    assert resume_command([]) == "bash launch/train.sh c.toml --epochs 9 --resume"
    # A command that named no directory names the one its run took (maybe a -v2).
    run = Path("results/runs/c-vanilla-p4-v2")
    assert resume_command([], run) == (
        "bash launch/train.sh c.toml --epochs 9 --out results/runs/c-vanilla-p4-v2 --resume"
    )
    monkeypatch.setenv("ADAQP_CALLER_CWD", str(tmp_path))  # typed elsewhere: absolute
    assert f"--out {Path.cwd() / run} --resume" in resume_command([], run)
    monkeypatch.setenv("ADAQP_COMMAND", "adaqp-train --out=mine --epochs 9")
    assert resume_command([], Path("mine")) == "adaqp-train --out=mine --epochs 9 --resume"
    monkeypatch.delenv("ADAQP_COMMAND")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert resume_command(["--config", "my run.toml", "--overwrite"]) == (
        "torchrun --nproc-per-node 4 -m adaqp.train --config 'my run.toml' --resume"
    )


def test_default_folders_differ_per_config_file_and_the_start_is_described(tmp_path):
    for stem in ("first", "second"):
        shutil.copy(ROOT / "configs/cora-gcn.toml", tmp_path / f"{stem}.toml")
        proc = run_command(
            [
                sys.executable,
                "-m",
                "adaqp.train",
                "--config",
                f"{stem}.toml",
                "--epochs",
                "4",
                "--set",
                "metrics.progress=false",
                "--set",
                f"partition.dir={tmp_path / 'p'}",
            ],
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        assert f"written to results/runs/{stem}-vanilla-p1" in proc.stdout
        # What trains and how long it will take, before the first results.
        assert "cora: 2708 nodes, 10556 edges, 1433 features, 7 classes" in proc.stderr
        assert "epoch 3 took" in proc.stderr and "for the 1 epoch left" in proc.stderr
    for stem in ("first", "second"):
        assert (tmp_path / "results/runs" / f"{stem}-vanilla-p1" / "summary.json").exists()


def test_a_collective_broken_by_a_stopping_peer_is_part_of_the_stop(tmp_path, monkeypatch, capsys):
    """Ctrl-C reaches every rank; one blocked in an exchange sees it fail (its peer has
    stopped) before its own KeyboardInterrupt: exit 130 and rank 0's resume hint, no
    "error:" line. Without the signal the same error is a failure (exit 1, printed)."""
    from adaqp.exchange.transport import ExchangeError
    from adaqp.process import stop
    from adaqp.run import job

    broken = "rank 0: halo exchange layer1/forward at epoch 9 failed: Connection closed by peer"

    def run(config, **_):
        if signalled:
            with pytest.raises(KeyboardInterrupt):
                stop.request_stop(signal.SIGINT, None)
        raise ExchangeError(broken)

    monkeypatch.setattr(job, "run", run)
    argv = ["--config", str(ROOT / "configs/cora-gcn.toml"), "--out", str(tmp_path / "run")]
    for signalled, code in ((False, 1), (True, 130)):
        monkeypatch.setattr(stop, "_stop_signals", [])
        assert main(argv) == code
        err = capsys.readouterr().err
        if signalled:
            assert "error:" not in err and err.startswith("interrupted (SIGINT); "), err
        else:
            assert err.strip() == f"error: {broken}", err


@pytest.mark.slow
def test_interrupted_run_is_never_deleted_and_the_hint_resumes_it(tmp_path):
    out, parts = tmp_path / "run", tmp_path / "p"
    args = train_args(out, parts, "--epochs", "100000", "--set", "checkpoint.every=1")
    first = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=command_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: list(out.glob("checkpoints/epoch-*/manifest.json")), "a checkpoint")
        first.send_signal(signal.SIGINT)
        _, stderr = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 130, stderr
    hint = next(ln for ln in stderr.splitlines() if ln.startswith("interrupted"))
    assert "continue with:" in hint and hint.endswith("--resume"), hint

    def checkpoint_files() -> list[Path]:
        return sorted(p.relative_to(out) for p in out.rglob("*") if "checkpoints" in p.parts)

    kept = checkpoint_files()
    assert kept

    # The same command again: refused before the run starts (a usage error), nothing lost.
    again = run_command(args, cwd=tmp_path)
    assert again.returncode == 2, again.stderr
    error = [ln for ln in again.stderr.splitlines() if ln.startswith("error:")]
    assert len(error) == 1 and "unfinished run" in error[0] and "--resume" in error[0]
    assert checkpoint_files() == kept
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "interrupted"

    epochs = int(hint.split("at epoch ")[1].split(";")[0])
    resumed = run_command(
        train_args(out, parts, "--epochs", str(epochs + 2), "--resume"), cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_epoch"] == epochs and summary["epochs"] == epochs + 2


@pytest.mark.slow
def test_a_refused_partition_folder_leaves_the_finished_run_in_the_default_folder(tmp_path):
    """A finished run, then a command whose partition folder holds other files: refused
    as a usage error before the run's folder (or any other) is touched."""
    command = [
        *(sys.executable, "-m", "adaqp.train", "--config", str(ROOT / "configs/cora-gcn.toml")),
        *("--set", "metrics.progress=false", "--set", "checkpoint.every=1"),
    ]
    first = run_command(
        [*command, "--epochs", "2", "--set", f"partition.dir={tmp_path / 'p'}"], tmp_path
    )
    assert first.returncode == 0, first.stderr
    out = tmp_path / "results" / "runs" / "cora-gcn-vanilla-p1"
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert out / "summary.json" in before and any("checkpoints" in p.parts for p in before)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    refused = run_command([*command, "--epochs", "3", "--set", f"partition.dir={other}"], tmp_path)
    assert refused.returncode == 2, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "not an AdaQP partition" in errors[0], refused.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_a_shared_error_waits_for_rank_0_to_say_it_under_plain_torchrun(monkeypatch, capsys):
    """Rank 1 stays until torchrun stops it (rank 0 has ended, having printed the error):
    a rank that exited at once let torchrun stop rank 0 before it printed anything."""
    monkeypatch.delenv(STATUS_DIR_ENV, raising=False)

    def stop(signum, frame):  # what torchrun's SIGTERM does to a worker (adaqp.process.stop)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
        started = time.monotonic()
        timer.start()
        _report_shared(1, ValueError("no such folder"), wait_s=60)
        waited = time.monotonic() - started
        timer.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert 0.4 < waited < 30, waited  # it waited, and the stop ended the wait
    assert capsys.readouterr().err == ""  # rank 0 spoke for it
    _report_shared(1, ValueError("no such folder"), wait_s=0.2)  # rank 0 never ended
    assert capsys.readouterr().err == "error: no such folder\n"
    _report_shared(0, ValueError("no such folder"))
    assert capsys.readouterr().err == "error: no such folder\n"
