"""The launcher (``adaqp-train``, ``bash launch/train.sh``): its command line, its filter
over torchrun's output (on text torchrun really printed), its exit codes, and real runs."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
from io import BytesIO
from pathlib import Path

import pytest

from adaqp.config import MODES
from adaqp.launcher import Launch, UsageError, main, parse
from adaqp.launcher import args as launcher_args
from adaqp.launcher.output import OutputFilter, Stream, exit_code, read_codes
from adaqp.launcher.run import _silent_failure, record_end
from adaqp.run.placement import Placement
from adaqp.run.rundir import RunDir
from adaqp.run.runfiles import read_status
from adaqp.runtime import usable_cores

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SH = ROOT / "launch" / "train.sh"
CORA = str(ROOT / "configs" / "cora-gcn.toml")
NO_ENV: dict[str, str] = {}

# torchrun 2.13, two workers exiting 2 after printing an error line each.
CONFIG_ERROR = """\
error: model.nope: unknown key
error: model.nope: unknown key
E1201 09:44:20.968000 24011 .venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: 24024) of binary: /work/main/.venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
adaqp.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_09:38:39
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 2 (pid: 20887) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_09:38:39
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 20886) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""  # noqa: E501, W291

# A worker (run with -m, so its traceback starts in runpy too) raising; torchrun stops the
# other with SIGTERM.
WORKER_TRACEBACK = """\
hello from 0
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/tmp/lt/w.py", line 10, in <module>
    raise RuntimeError("boom")
RuntimeError: boom
W1201 09:38:47.091000 20921 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 20991 closing signal SIGTERM
E1201 09:38:47.092000 20921 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 20992) of binary: /work/main/.venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
w.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_09:38:47
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 20991)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 20991
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_09:38:47
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 20992) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""  # noqa: E501, W291

# torchrun given SIGINT (what the launcher forwards at Ctrl-C).
INTERRUPTED = """\
W1201 09:39:31.119000 21483 torch/distributed/elastic/agent/server/api.py:753] Received 2 death signal, shutting down workers
W1201 09:39:31.120000 21483 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 21487 closing signal SIGINT
WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 21488 closing signal SIGINT
interrupted (SIGINT); the newest checkpoint is at epoch 10; continue with: adaqp-train --resume
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 21483 got signal: 2
"""  # noqa: E501


def _filtered(text: str) -> tuple[str, OutputFilter]:
    out = OutputFilter()
    shown = [line for raw in text.splitlines(keepends=True) for line in out.feed(raw)]
    return "".join(shown + out.flush()), out


# The command line.


def test_config_as_first_argument_flag_or_after_flags_and_flags_in_any_order(tmp_path):
    config = tmp_path / "a.toml"
    config.write_text("")
    for argv in (
        [str(config), "--mode", "adaqp", "--epochs", "5"],
        ["--mode", "adaqp", str(config), "--epochs", "5"],
        ["--mode", "adaqp", "--config", str(config), "--epochs", "5"],
        ["--mode", "adaqp", "--epochs", "5", f"--config={config}"],
    ):
        spec = parse(argv, NO_ENV)
        assert spec.config == str(config), argv
        assert spec.train_args == ["--mode", "adaqp", "--epochs", "5"]
        command = spec.torchrun("py")
        assert command[command.index("adaqp.train") :] == [
            *("adaqp.train", "--config", str(config), "--mode", "adaqp", "--epochs", "5"),
        ]


def test_no_config_means_cora_and_values_are_never_taken_for_a_config(tmp_path, monkeypatch):
    spec = parse(["--mode", "adaqp", "--epochs", "5", "--set", "train.lr=0.1"], NO_ENV)
    assert spec.config == "configs/cora-gcn.toml"
    monkeypatch.chdir(tmp_path)  # adaqp-train elsewhere: the checkout's
    assert parse([], NO_ENV).config == CORA
    assert spec.train_args[:6] == ["--mode", "adaqp", "--epochs", "5", "--set", "train.lr=0.1"]
    # Unknown flags pass through with the word after them, for adaqp.train to judge.
    spec = parse([CORA, "--frobnicate", "3", "--seed=4", "--", "x", "--y"], NO_ENV)
    assert spec.train_args == ["--frobnicate", "3", "--seed=4", "x", "--y"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["a.toml", "b.toml"], "unexpected argument 'b.toml'"),
        (["a.toml", "--config", "b.toml"], "two configs given"),
        (["--config"], "--config needs a value"),
        (["--config="], "--config needs a value"),
        (["--epochs"], "--epochs needs a value"),
        (["--nproc", "0"], "--nproc must be an integer >= 1"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be an integer from 0 to 1"),
        (["--master-port=http"], "--master-port must be"),
    ],
)
def test_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        parse(argv, NO_ENV)


def test_a_set_item_without_equals_is_never_taken_for_the_config():
    for argv in (["--set", "model.hidden", "128"], [CORA, "--set", "model.hidden", "128"]):
        with pytest.raises(UsageError, match=r"did you mean --set model\.hidden=128\?$"):
            parse(argv, NO_ENV)


def test_the_train_flags_the_launcher_suggests_are_adaqp_trains():
    from adaqp.train import build_parser

    train_options = {o for o in build_parser().option_names() if o.startswith("--")}
    assert train_options - {"--config", "--help"} == launcher_args.TRAIN_FLAGS


def test_options_default_to_the_environment_and_flags_win():
    env = {"NPROC": "3", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"}
    spec = parse([CORA, "--master-port", "1234", "--restarts=2", "--debug"], env)
    assert (spec.nproc, spec.nnodes, spec.node_rank, spec.master_port) == (3, 2, 1, 1234)
    assert spec.debug and spec.train_args[0] == "--debug"  # the workers get it too
    command = " ".join(spec.torchrun("py"))
    assert "--nnodes 2 --node-rank 1 --rdzv-backend c10d --rdzv-id adaqp" in command
    assert "--rdzv-endpoint 10.0.0.1:1234 --nproc-per-node 3 --max-restarts 2" in command
    spec = parse([CORA, "--nproc-per-node", "2"], {"NPROC": "5", "NNODES": "1"})
    assert spec.nproc == 2 and spec.torchrun("py")[3:4] == ["--standalone"]
    with pytest.raises(UsageError, match="NPROC must be an integer"):
        parse([CORA], {"NPROC": "four"})


@pytest.mark.parametrize(
    "flags",
    [[], ["--out", "d"], ["--set", "metrics.out=d"], ["--overwrite"], ["--resume"], ["--seed=2"]],
)
def test_the_launcher_adds_no_flag_that_could_replace_a_run(tmp_path, flags):
    config = tmp_path / "c.toml"
    config.write_text("")
    assert parse([str(config), *flags], NO_ENV).train_args == flags


def test_paths_on_the_command_line_are_the_users_and_the_defaults_the_checkouts(tmp_path):
    """launch/train.sh runs from the checkout; what the user typed is relative to where."""
    typed_in = tmp_path / "mine"
    typed_in.mkdir()
    env = {launcher_args.CALLER_CWD_ENV: str(typed_in)}
    spec = parse(
        [
            *("c.toml", "--out", "run", "--set", "partition.dir=parts", "--set=data.root=d"),
            *("--set", "train.lr=0.1", "--set", "checkpoint.dir=/abs", "--out=two"),
        ],
        env,
    )
    assert spec.config == str(typed_in / "c.toml")
    assert spec.train_args == [
        *("--out", str(typed_in / "run"), "--set", f"partition.dir={typed_in / 'parts'}"),
        *(f"--set=data.root={typed_in / 'd'}", "--set", "train.lr=0.1"),
        *("--set", "checkpoint.dir=/abs", f"--out={typed_in / 'two'}"),
    ]
    assert parse(["--epochs", "2"], env).config == "configs/cora-gcn.toml"  # the default
    same = {launcher_args.CALLER_CWD_ENV: str(Path.cwd())}
    assert parse(["c.toml", "--out", "run"], same).train_args == ["--out", "run"]


def test_help_lists_every_option_and_answers_without_torch():
    code = (
        "import sys, time; t = time.monotonic(); from adaqp.launcher import main; "
        "rc = main(['--help']); assert 'torch' not in sys.modules, 'torch imported'; "
        "print('took', time.monotonic() - t); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    for flag, (_, env, default) in launcher_args.OPTIONS.items():
        assert flag in proc.stdout and f"{env}, default {default}" in proc.stdout, flag
    for text in ("--config FILE", "--debug", "--resume", "--overwrite", "-v2"):
        assert text in proc.stdout
    for text in ("--mode", "--epochs", "--seed", "--out", "--set", "examples:"):
        assert text in proc.stdout
    assert "0 success, 1 a failed run, 2 a usage or config error, 130 interrupted" in proc.stdout
    assert ", ".join(MODES) in proc.stdout  # the launcher's copy of the modes is current
    assert float(proc.stdout.rsplit("took", 1)[1]) < 1.0


def test_the_launcher_imports_only_the_standard_library():
    """And adaqp.cli (deps: what is missing where torch is; handoff: the variables it sets
    for the workers; parser: the wording of usage errors; configs: of a missing config),
    adaqp.process.cores (the workers' share of the cores) and adaqp.memory.limits,
    themselves stdlib only; once torchrun has ended, adaqp.run.rundir (which records a
    killed run's end), whose import loads no third-party package."""
    stdlib_only = ("adaqp.cli.deps", "adaqp.cli.handoff", "adaqp.cli.parser", "adaqp.cli.configs")
    stdlib_only += ("adaqp.process.cores", "adaqp.memory.limits")
    once_ended = ("adaqp.run.rundir",)
    for path in [
        *(ROOT / "adaqp" / "launcher").glob("*.py"),
        *(ROOT.joinpath(*name.split(".")).with_suffix(".py") for name in stdlib_only),
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                top = name.partition(".")[0]
                ours = name.startswith("adaqp.launcher") or name in stdlib_only + once_ended
                assert top in sys.stdlib_module_names or ours, (path, name)
    code = "import sys, adaqp.launcher, adaqp.run.rundir\n"
    code += "print(sorted(m for m in sys.modules if m.partition('.')[0] in ('torch', 'numpy')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert loaded.stdout.strip() == "[]", loaded


def test_train_sh_help_and_a_missing_config_stop_before_torchrun(tmp_path):
    proc = subprocess.run(["bash", str(TRAIN_SH), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: bash {TRAIN_SH} [CONFIG]")
    proc = subprocess.run(
        ["bash", str(TRAIN_SH), "--epochs", "3", "nope.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # no configs/ here: the checkout's are listed
    )
    assert proc.returncode == 2
    names = ", ".join(sorted(p.name for p in (ROOT / "configs").glob("*.toml")))
    assert proc.stderr == (
        f"error: config file {tmp_path / 'nope.toml'} not found; the configs in "
        f"{ROOT / 'configs'}/: {names}\n"
    )
    assert "cora-gcn.toml" in names
    assert main(["--nproc", "x", CORA]) == 2


@pytest.mark.parametrize(
    "dataset, message",
    [
        ("coraa", "error: data.dataset: unknown dataset 'coraa'; available: cora, citeseer"),
        ("ogbn-arxiv", "error: ogbn-arxiv: missing raw/edge.csv.gz, raw/node-feat.csv.gz ..."),
    ],
)
def test_a_dataset_that_cannot_be_read_is_one_line_before_any_worker(tmp_path, dataset, message):
    """A config error, not a worker failure: exit 2 and one line, in about the time Python
    takes to start, and nothing written (no run folder, partition or download folder)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    argv = ["bash", str(TRAIN_SH), "--nproc", "2", "--out", str(tmp_path / "run")]
    argv += ["--set", f"data.dataset={dataset}", "--set", f"data.root={tmp_path / 'data'}"]
    argv += ["--set", f"partition.dir={tmp_path / 'parts'}"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert "torchrun" not in proc.stderr and "rank" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


# torchrun's output, filtered.


def test_torchrun_report_is_left_out_and_one_error_line_stays():
    shown, out = _filtered(CONFIG_ERROR)
    assert shown == "error: model.nope: unknown key\n"
    assert out.failures == [(0, 2), (1, 2)]  # the root cause first
    assert out.idle


def test_a_workers_traceback_stays_whole():
    shown, out = _filtered(WORKER_TRACEBACK)
    assert shown == "".join(WORKER_TRACEBACK.splitlines(keepends=True)[:7])
    assert out.failures == [(1, 1), (0, -15)] and out.tracebacks == 1


def test_ctrl_c_leaves_only_the_workers_message():
    shown, _ = _filtered(INTERRUPTED)
    assert shown == INTERRUPTED.splitlines(keepends=True)[3]


# torchrun given SIGINT while it waits for the other hosts in the rendezvous.
INTERRUPTED_IN_RENDEZVOUS = """Traceback (most recent call last):
  File "/x/torch/distributed/elastic/rendezvous/utils.py", line 181, in _delay
    time.sleep(seconds)
KeyboardInterrupt
"""


def test_ctrl_c_in_the_rendezvous_shows_no_traceback():
    shown, out = _filtered(INTERRUPTED_IN_RENDEZVOUS)
    assert shown == "" and out.tracebacks == 0
    # A worker's own traceback still shows, whatever raised it.
    worker = INTERRUPTED_IN_RENDEZVOUS.replace("KeyboardInterrupt", "KeyboardInterrupt: in eval")
    assert _filtered(worker)[0] == worker


def test_debug_free_filter_never_drops_other_output():
    text = "a\nTraceback (most recent call last):\n  File 'x'\n10:00 [rank 1] log\n  b\n"
    assert _filtered(text)[0] == text  # an interleaved line ends the held block: shown
    assert _filtered("Traceback (most recent call last):\n  File 'x'\n")[0].count("File") == 1
    text = "error: a\nerror: b\nerror: a\nwarn\n"
    assert _filtered(text)[0] == "error: a\nerror: b\nwarn\n"
    # Each rank refuses a checkpoint naming its keys: the error and its keys shown once.
    refusal = "error: checkpoint c does not fit this run:\n  a: 1, this run 2\n  b: x\n"
    assert _filtered(refusal * 3)[0] == refusal
    assert _filtered(refusal + "10:00 [rank 1] log\n  b: x\n")[0].endswith("log\n  b: x\n")


def test_errors_that_point_at_another_ranks_are_shown_only_without_it():
    """A full disk on one rank: the others say 'a peer failed; see its log'. Shown: the
    cause alone, whatever the order; the pointers only where no rank said more."""
    cause = "error: rank 3: checkpoint at epoch 1 could not be written to c: [Errno 28] full\n"
    pointers = [
        f"error: rank {r}: checkpoint at epoch 1 could not be written to c (a peer failed; "
        "see its log)\n"
        for r in (1, 2)
    ]
    for text in (pointers[0] + cause + pointers[1], cause + "".join(pointers)):
        shown, out = _filtered(text)
        assert shown == cause and out.leftovers() == []
    shown, out = _filtered("".join(pointers) + pointers[0])
    assert shown == "" and out.leftovers() == pointers  # each once, at the end
    partition = "error: rank 0 could not prepare the partition at p; see its log\n"
    assert _filtered(partition)[1].leftovers() == [partition]


def test_stream_passes_progress_bars_at_once_and_filters_lines():
    read_end, write_end = os.pipe()
    stream = Stream(read_end, OutputFilter())
    stream.out = BytesIO()
    stream.start()
    os.write(write_end, b"\rtrain:  10%|#\rtrain:  20%|##")
    deadline = time.monotonic() + 10
    while b"20%" not in stream.out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.out.getvalue() == b"\rtrain:  10%|#\rtrain:  20%|##"  # before its newline
    # torchrun's log line after the bar is judged alone, then the bar closes.
    os.write(write_end, INTERRUPTED.splitlines(keepends=True)[0].encode() + b"\r30%\n")
    os.write(write_end, CONFIG_ERROR.encode() + b"caf\xc3\xa9 \xff\nend")
    os.close(write_end)
    stream.join(timeout=10)
    os.close(read_end)
    assert stream.out.getvalue() == (
        b"\rtrain:  10%|#\rtrain:  20%|##\r30%\nerror: model.nope: unknown key\n"
        b"caf\xc3\xa9 \xff\nend"
    )
    assert stream.mid_line  # "end" did not end its line


# Exit codes.


@pytest.mark.parametrize(
    ("codes", "torchrun", "interrupted", "expected"),
    [
        ({0: 0, 1: 0}, 0, False, 0),
        ({0: 2, 1: 2}, 1, False, 2),
        ({0: 130, 1: 1}, 1, False, 1),  # rank 0 stopped by torchrun after rank 1 failed
        ({0: 130, 1: 2}, 1, False, 2),
        ({0: 130, 1: 130}, 1, False, 130),
        ({0: 1, 1: 1}, 1, True, 130),  # Ctrl-C at the launcher
        ({0: 0}, 1, False, 1),  # a rank without a code
        ({}, 1, False, 1),
    ],
)
def test_exit_code_aggregation(codes, torchrun, interrupted, expected):
    assert exit_code(codes, torchrun, interrupted) == expected


def test_codes_are_read_and_silent_failures_explained(tmp_path):
    (tmp_path / "rank-0.code").write_text("2\n")
    (tmp_path / "rank-1.code").write_text("")  # cut short
    assert read_codes(tmp_path) == {0: 2}
    _, out = _filtered(WORKER_TRACEBACK)
    assert _silent_failure(out, {}, 1) == "rank 1 failed with exit code 1 (its traceback is above)"
    _, out = _filtered(CONFIG_ERROR.replace("exitcode  : 2 (pid: 20886)", "exitcode  : -9"))
    assert "rank 0 ended with signal SIGKILL without a message" in _silent_failure(out, {}, 1)
    # Rank 0 stopped by torchrun (130) before it printed rank 1's config error.
    assert "rank 1 ended with exit code 2" in _silent_failure(OutputFilter(), {0: 130, 1: 2}, 1)
    assert "torchrun ended with exit code 1" in _silent_failure(OutputFilter(), {}, 1)


# How a run ended whose rank 0 could not say so.


def _lost_run(tmp_path: Path, monkeypatch) -> tuple[Path, Path, dict]:
    """A started run whose rank 0 ended without recording it (status "running", the lock
    free); returns (the launcher's folder, the run's, its status)."""
    status_dir = tmp_path / "status"
    status_dir.mkdir()
    monkeypatch.setenv("ADAQP_STATUS_DIR", str(status_dir))  # rank 0 names its run there
    out = tmp_path / "run"
    run = RunDir.claim(Placement(out), job="job-a")
    # While rank 0 lives (its lock held), the launcher changes nothing.
    assert record_end(status_dir, [(0, -signal.SIGKILL)], 1, False) is None
    run.close()
    return status_dir, out, read_status(out)


def test_a_run_whose_rank_0_was_killed_ends_failed_naming_the_signal(tmp_path, monkeypatch):
    status_dir, out, running = _lost_run(tmp_path, monkeypatch)
    assert running["status"] == "running"
    assert record_end(status_dir, [(0, -signal.SIGKILL)], 1, False) == out.resolve()
    status = read_status(out)
    assert status["status"] == "failed"
    assert status["error"] == "rank 0 was killed (SIGKILL), likely out of memory"
    assert status["recorded_by"] == "launcher"
    assert {k: status[k] for k in running if k not in ("status", "updated_at")} == {
        k: v for k, v in running.items() if k not in ("status", "updated_at")
    }  # every field kept: the job, rank 0's pid and host, the start


def test_the_launcher_records_only_what_rank_0_could_not(tmp_path, monkeypatch):
    status_dir, out, _ = _lost_run(tmp_path, monkeypatch)

    def rank_0_ends(exc: BaseException | None) -> None:
        run = RunDir.claim(Placement(out, overwrite=True))
        run.end(exc)
        run.close()

    # No report of a signal (--debug leaves torchrun's report unread): still not running.
    record_end(status_dir, [], 1, False)
    assert read_status(out)["error"] == "rank 0 ended without recording how (torchrun: exit code 1)"
    # A run rank 0 recorded as failed or complete keeps its own account.
    for exc, status in ((RuntimeError("a peer died"), "failed"), (None, "complete")):
        rank_0_ends(exc)
        assert record_end(status_dir, [(1, -signal.SIGKILL)], 1, False) is None
        assert read_status(out)["status"] == status and "recorded_by" not in read_status(out)
    # torchrun stopped rank 0 (interrupted) after rank 1 was killed: failed, naming it.
    rank_0_ends(KeyboardInterrupt("SIGTERM"))
    record_end(status_dir, [(1, -signal.SIGKILL), (0, -signal.SIGTERM)], 1, False)
    assert read_status(out)["error"] == "rank 1 was killed (SIGKILL), likely out of memory"
    # After Ctrl-C, a run rank 0 could not mark is interrupted; any other signal is named.
    RunDir.claim(Placement(out, overwrite=True)).close()
    record_end(status_dir, [(0, -signal.SIGKILL)], 1, True)
    assert read_status(out)["status"] == "interrupted"
    RunDir.claim(Placement(out, overwrite=True)).close()
    record_end(status_dir, [(0, -signal.SIGSEGV)], 1, False)
    assert read_status(out)["error"] == "rank 0 was ended by signal SIGSEGV"


# The launcher around a stand-in for torchrun.

FAKE_TORCHRUN = """\
import os, signal, subprocess, sys, time
from pathlib import Path
status = Path(os.environ["ADAQP_STATUS_DIR"])
(status.parent / (status.name + ".env")).write_text(os.environ["ADAQP_COMMAND"])
(status.parent / (status.name + ".omp")).write_text(os.environ.get("OMP_NUM_THREADS", "unset"))
if sys.argv[1] == "stubborn":  # ignores Ctrl-C, as does a worker of its own session
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (status.parent / (status.name + ".worker")).write_text(str(worker.pid))
    (status / "started").write_text("")
    time.sleep(60)
if sys.argv[1] == "fail":
    (status / "rank-0.code").write_text("2")
    sys.stderr.write(sys.argv[2])
    sys.exit(1)
signals = []
signal.signal(signal.SIGINT, lambda signum, frame: signals.append(signum))
(status / "started").write_text("")
deadline = time.monotonic() + 60
while not signals and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(3)  # while the test sends another
(status.parent / (status.name + ".signals")).write_text(str(len(signals)))
(status / "rank-0.code").write_text("130")
sys.stderr.write(sys.argv[2])
sys.exit(1)
"""


def _fake_launch(monkeypatch, tmp_path, mode: str, text: str) -> Path:
    script = tmp_path / "fake_torchrun.py"
    script.write_text(FAKE_TORCHRUN)
    monkeypatch.setattr(Launch, "torchrun", lambda self: [sys.executable, str(script), mode, text])
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("ADAQP_LAUNCH_SCRIPT", "launch/my train.sh")
    return tmp_path


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--seed x", "argument --seed: invalid int value: 'x'"),
        ("--resume --overwrite", "argument --overwrite: not allowed with argument --resume"),
        ("--bogus", "unrecognized arguments: --bogus"),
        ("--epoch 5", "unrecognized arguments: --epoch 5; did you mean --epochs?"),
        # The workers refuse it; the launcher knows its own option.
        ("--nprocs 2", "unrecognized arguments: --nprocs 2; did you mean --nproc?"),
        # Not "config file 128 not found": the launcher took 128 for the config.
        (
            "--set model.hidden 128",
            '--set takes KEY=VALUE: "model.hidden" has no "="; did you mean --set '
            "model.hidden=128?",
        ),
        ("--epochs -1", "--epochs (train.epochs): must be at least 1, got -1"),
        ("--mode adaq", "--mode (comm.mode): must be one of vanilla,"),
        ("--set comm.mode=adaq", "comm.mode: must be one of vanilla,"),
        ("--set model.hiden=3", "model.hiden: unknown key"),
    ],
)
def test_flags_and_configs_the_workers_would_refuse_stop_before_torchrun(
    flags, message, monkeypatch, capfd
):
    """adaqp.train --check judges them first: one line, exit 2, no worker started (they
    used to load torch first, and argparse's refusals ended with 'rank 1 ended with exit
    code 2 without a message')."""
    import adaqp.launcher

    def launch(*_):
        raise AssertionError("torchrun started")

    monkeypatch.setattr(adaqp.launcher, "launch", launch)
    assert main([CORA, *flags.split()]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}"), err


def test_train_check_starts_nothing(tmp_path):
    out = tmp_path / "run"
    argv = ["--config", CORA, "--out", str(out), "--set", f"partition.dir={tmp_path / 'p'}"]
    ok = subprocess.run(
        [sys.executable, "-m", "adaqp.train", *argv, "--check"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and not ok.stdout and not ok.stderr, ok
    assert not out.exists() and not (tmp_path / "p").exists()
    code = f"import sys\nfrom adaqp.train import main\nmain({[*argv, '--check']!r})\n"
    code += "print('torch' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert loaded.stdout.strip() == "False", loaded  # a second, not torch's load


def test_failure_passes_the_workers_code_and_cleans_up(monkeypatch, tmp_path, capfd):
    _fake_launch(monkeypatch, tmp_path, "fail", CONFIG_ERROR)
    assert main([CORA, "--epochs", "3"]) == 2
    err = capfd.readouterr().err
    assert err.splitlines()[0].startswith("starting 4 workers on 1 host: ")
    assert err.splitlines()[1:] == ["error: model.nope: unknown key"]
    (command,) = tmp_path.glob("adaqp-status-*.env")
    assert command.read_text() == f"bash 'launch/my train.sh' {CORA} --epochs 3"
    assert not [p for p in tmp_path.glob("adaqp-status-*") if p.is_dir()]  # removed


@pytest.mark.parametrize(("nproc", "user"), [(2, None), (1, None), (2, "3")])
def test_torchrun_gets_the_workers_thread_count(monkeypatch, tmp_path, nproc, user):
    """Set in torchrun's environment (unset, torchrun prints a banner about it on every
    run): the usable cores shared among the workers, unless the user set a count."""
    if user is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", user)
    _fake_launch(monkeypatch, tmp_path, "fail", CONFIG_ERROR)
    assert main([CORA, "--nproc", str(nproc)]) == 2
    (omp,) = tmp_path.glob("adaqp-status-*.omp")
    assert omp.read_text() == (user or str(max(1, usable_cores() // nproc)))


WORKER = """\
import os, sys
import torch
sys.path.insert(0, os.environ["ROOT"])
from adaqp.runtime import thread_count
threads = thread_count(0, os.environ, int(os.environ["LOCAL_WORLD_SIZE"]))
print(f"rank {os.environ['RANK']} threads {threads}", flush=True)
"""


@pytest.mark.distributed
def test_torchrun_says_nothing_about_omp_and_the_workers_get_their_share(
    monkeypatch, tmp_path, capfd
):
    """torchrun's four-line OMP_NUM_THREADS banner came on every run of two workers."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("ROOT", str(ROOT))
    standalone = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*standalone, "--nproc-per-node", "2", str(script)]
    monkeypatch.setattr(Launch, "torchrun", lambda self: command)
    assert main([CORA, "--nproc", "2"]) == 0
    out, err = capfd.readouterr()
    assert "OMP_NUM_THREADS" not in err and "*****" not in err, err
    share = max(1, usable_cores() // 2)
    assert sorted(out.split("\n"))[-2:] == [f"rank {r} threads {share}" for r in (0, 1)], out


def test_a_host_of_several_says_whom_it_waits_for(monkeypatch, tmp_path, capfd):
    _fake_launch(monkeypatch, tmp_path, "fail", CONFIG_ERROR)
    flags = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--nproc", "1"]
    assert main([CORA, *flags]) == 2
    lines = capfd.readouterr().err.splitlines()
    assert lines[0].startswith("starting 1 worker on host 1 of 2: ")
    assert lines[1] == (
        "waiting for all 2 hosts at 10.0.0.1:29500 (rendezvous adaqp): run the same command "
        "on each, with its own --node-rank"
    )


def test_ctrl_c_is_forwarded_once_and_exits_130(monkeypatch, tmp_path, capfd):
    _fake_launch(monkeypatch, tmp_path, "sleep", INTERRUPTED)

    def interrupt():
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("adaqp-status-*/started")) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the stand-in waits 3 s: the launcher is still there
        os.kill(os.getpid(), signal.SIGINT)

    # What was there before: Python's handler, or SIG_IGN where the suite itself was
    # started in the background by a shell without job control.
    before = signal.getsignal(signal.SIGINT)
    threading.Thread(target=interrupt, daemon=True).start()
    assert main([CORA]) == 130
    err = capfd.readouterr().err
    assert "stopping the workers" in err and "interrupted (SIGINT)" in err
    assert "Traceback" not in err and "SignalException" not in err
    (forwarded,) = tmp_path.glob("adaqp-status-*.signals")
    assert forwarded.read_text() == "1"  # once
    assert signal.getsignal(signal.SIGINT) is before  # restored


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_what_does_not_stop_after_ctrl_c_is_killed(monkeypatch, tmp_path, capfd):
    _fake_launch(monkeypatch, tmp_path, "stubborn", "")
    monkeypatch.setattr("adaqp.launcher.run.STOP_GRACE_S", 0.5)

    def interrupt():
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("adaqp-status-*/started")) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    started = time.monotonic()
    assert main([CORA]) == 130
    assert time.monotonic() - started < 30
    assert "did not stop in time: killing them" in capfd.readouterr().err
    (worker,) = tmp_path.glob("adaqp-status-*.worker")
    deadline = time.monotonic() + 10
    while _alive(int(worker.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(int(worker.read_text()))  # in a session of its own, killed too


# Real runs (torchrun, two gloo workers on Cora).


def _env() -> dict[str, str]:
    unset = ("NPROC", "NNODES", "RESTARTS", "OMP_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(NPROC="2", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


@pytest.mark.distributed
@pytest.mark.slow
def test_train_sh_runs_cora_and_a_config_error_is_one_line_exit_2(tmp_path):
    out, parts = tmp_path / "run", tmp_path / "p"
    common = ["--set", f"partition.dir={parts}", "--set", "metrics.progress=false"]
    run = subprocess.run(
        ["bash", str(TRAIN_SH), "--epochs", "3", CORA, "--out", str(out), *common],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stderr.startswith(f"starting 2 workers on 1 host: {CORA}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 3
    assert summary["threads"] == max(1, usable_cores() // 2)  # the cores shared by 2
    assert "OMP_NUM_THREADS" not in run.stderr  # torchrun's banner: the launcher set it
    assert "test acc" in run.stdout and "Traceback" not in run.stderr

    # One worker, nothing set: it trains on every usable core (torchrun would say 1).
    one = subprocess.run(
        ["bash", str(TRAIN_SH), "--epochs", "2", CORA, "--out", str(tmp_path / "one")]
        + ["--set", f"partition.dir={tmp_path / 'p1'}", "--set", "metrics.progress=false"],
        cwd=tmp_path,
        env={**_env(), "NPROC": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stdout + one.stderr
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["threads"] == usable_cores()

    bad = subprocess.run(
        ["bash", str(TRAIN_SH), "--config", CORA, "--set", "model.nope=1", *common],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = bad.stdout + bad.stderr
    assert bad.returncode == 2, log
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.nope" in errors[0], log
    assert "ChildFailedError" not in log and "Traceback" not in log, log


def _past_epoch(out: Path, epoch: int, epochs: int) -> bool:
    """Whether the run of ``epochs`` epochs in ``out`` has logged ``epoch``."""
    try:
        config = json.loads((out / "config.json").read_text())
        logged = len((out / "metrics.jsonl").read_text().splitlines())
    except (OSError, ValueError):
        return False
    return config["train"]["epochs"] == epochs and logged >= epoch


@pytest.mark.distributed
@pytest.mark.slow
def test_no_command_deletes_a_run_it_was_not_asked_to(tmp_path):
    """A finished run in the default folder survives a second command that differs only in
    epochs and --set (it goes to -v2); Ctrl-C there is 130 with the command that resumes
    it; the same command again goes to -v3; and a command whose partition folder holds
    other files is refused, exit 2, before anything on disk changes."""
    launcher = [sys.executable, "-m", "adaqp.launcher", CORA]
    common = ["--set", f"partition.dir={tmp_path / 'p'}", "--set", "metrics.progress=false"]
    base = tmp_path / "results" / "runs" / "cora-gcn-vanilla-p2"

    def run(*flags: str, extra: list[str] = common) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*launcher, *flags, *extra],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )

    def files(folder: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
        }

    first = run("--epochs", "2")
    assert first.returncode == 0, first.stderr
    assert (base / "summary.json").exists() and str(base.relative_to(tmp_path)) in first.stdout
    finished = files(base)

    second = base.with_name(base.name + "-v2")
    long = [*launcher, "--epochs", "100000", "--set", "checkpoint.every=2", *common]
    proc = subprocess.Popen(long, cwd=tmp_path, env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not _past_epoch(second, 3, epochs=100000):
            assert time.monotonic() < deadline and proc.poll() is None, "no third epoch"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "SignalException" not in err, err
    assert "python -m adaqp.launcher" in err and "--resume" in err, err
    assert f"--out {second.relative_to(tmp_path)}" in err, err
    assert files(base) == finished
    assert json.loads((second / "status.json").read_text())["status"] == "interrupted"
    interrupted = files(second)
    assert any(name.startswith("checkpoints/") for name in interrupted)

    again = run("--epochs", "3")
    assert again.returncode == 0, again.stderr
    assert (base.with_name(base.name + "-v3") / "summary.json").exists()

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    started = time.monotonic()
    refused = run("--epochs", "3", extra=["--set", f"partition.dir={other}"])
    took = time.monotonic() - started
    assert refused.returncode == 2, refused.stderr
    assert "not an AdaQP partition" in refused.stderr and "Traceback" not in refused.stderr
    assert took < 30, f"the refusal took {took:.1f} s: were the workers started?"
    assert files(base) == finished and files(second) == interrupted
    assert not base.with_name(base.name + "-v4").exists()
