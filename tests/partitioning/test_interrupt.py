"""Ctrl-C and SIGTERM stop partitioning with a non-zero exit, leaving no scratch or partly
written files, at any stage: also during the METIS cut, which traps SIGTERM itself and
holds the interpreter until it returns, and also where SIGINT was inherited as ignored."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adaqp.process import stop

ROOT = Path(__file__).resolve().parents[2]

NUM_NODES = 300_000
"""Large enough that the METIS cut takes seconds (a signal sent as it starts lands in it),
small enough that the run takes tens of seconds on a busy 2-core machine."""
WAIT_S = 300
"""Bound on any one wait: generous, the machine is slow and shared."""


@pytest.fixture
def fresh_stop_record(monkeypatch) -> None:
    """The signals these tests raise are not this test process's stop."""
    monkeypatch.setattr(stop, "_stop_signals", [])


def _blocked() -> set[int]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, ()))


def _trap(signum: int) -> None:
    """What METIS does on SIGTERM: its handler jumps out of the call, the signal stays
    blocked, and the call fails without naming it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    raise RuntimeError("Caught an unknown exception!")


def test_stopping_on_signals_raises_naming_the_signal_and_puts_the_handlers_back(
    fresh_stop_record,
):
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's
    try:
        previous_term = signal.getsignal(signal.SIGTERM)
        with stop.stopping_on_signals():
            assert signal.getsignal(signal.SIGINT) is stop.request_stop  # ignored no more
            with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == previous_term
        assert stop.stop_requested() == "SIGTERM"
    finally:
        signal.signal(signal.SIGINT, previous_int)


def test_a_stop_signal_a_native_call_trapped_becomes_the_stop(fresh_stop_record):
    before = _blocked()
    with (
        stop.stopping_on_signals(),
        pytest.raises(KeyboardInterrupt, match="SIGTERM"),
        stop.redelivering_trapped_signals(),
    ):
        _trap(signal.SIGTERM)
    assert _blocked() == before  # unblocked again: a later SIGTERM still reaches us


def test_a_native_failure_without_a_trapped_stop_signal_stays_the_failure(fresh_stop_record):
    before = _blocked()

    def failure():
        return pytest.raises(RuntimeError, match="unknown exception")

    with stop.stopping_on_signals():
        with failure(), stop.redelivering_trapped_signals():
            raise RuntimeError("Caught an unknown exception!")
        with failure(), stop.redelivering_trapped_signals():  # as METIS out of memory
            _trap(signal.SIGABRT)
    assert _blocked() == before
    assert stop.stop_requested() is None


# --- python -m partition, stopped mid-run -----------------------------------------------


class _Run:
    """``python -m partition`` on a synthetic graph, its stderr collected as it comes."""

    def __init__(self, out: Path, *, sigint_ignored: bool = False) -> None:
        self.out = out
        self.lines: list[str] = []
        command = [
            sys.executable,
            "-m",
            "partition",
            "--dataset",
            "synthetic",
            "--set",
            f"data.synthetic.num_nodes={NUM_NODES}",
            "--set",
            "data.synthetic.feature_dim=16",
            "--num-parts",
            "8",
            "--out",
            str(out),
        ]
        # A background job of a non-interactive shell starts with SIGINT ignored.
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=ignore,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                self.finish()
                pytest.fail(f"never saw {what}; stderr:\n{self.stderr}")
            time.sleep(0.01)

    def logged(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def leftovers(self) -> list[str]:
        parent = self.out.parent
        found = [p for p in parent.glob(".*adaqp-*") if p.name != self.out.name]
        if self.out.is_dir():
            found += list(self.out.glob(".*adaqp-*"))
        return sorted(str(p) for p in found)

    def finish(self) -> int:
        code = self.process.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def run(tmp_path) -> Iterator[Callable[..., _Run]]:
    started: list[_Run] = []

    def start(**kwargs) -> _Run:
        started.append(_Run(tmp_path / "p", **kwargs))
        return started[-1]

    yield start
    for one in started:  # a failed test leaves no process behind
        if one.process.poll() is None:
            one.process.kill()
            one.process.wait()


def _assert_stopped_cleanly(partition: _Run, signum: signal.Signals) -> None:
    """Exit 128 + the signal, the one line saying so, no traceback and nothing left."""
    code = partition.finish()
    assert code == 128 + signum, partition.stderr
    assert f"stopped by {signum.name}; nothing was left behind" in partition.stderr
    assert "Traceback" not in partition.stderr
    assert partition.leftovers() == [] and not partition.out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["scratch", "staging"])
def test_sigterm_leaves_nothing_behind(run, stage):
    """SIGTERM once the spill (take over, cut) or the staging directory (build and write)
    is there: the same clean stop, exit 143."""
    partition = run()
    pattern = ".adaqp-scratch-*" if stage == "scratch" else ".p.adaqp-tmp-*"
    partition.wait_for(pattern, lambda: any(partition.out.parent.glob(pattern)))
    partition.process.send_signal(signal.SIGTERM)
    _assert_stopped_cleanly(partition, signal.SIGTERM)


@pytest.mark.slow
def test_sigterm_during_the_metis_cut_is_a_stop_not_a_metis_failure(run):
    """METIS traps SIGTERM (the cut ends at once with a RuntimeError that does not say
    why); the tool still reports the stop and exits 143."""
    partition = run()
    partition.wait_for("the cut's start", lambda: partition.logged("stage take over"))
    time.sleep(0.5)  # into METIS itself, past the arrays pymetis is handed
    partition.process.send_signal(signal.SIGTERM)
    _assert_stopped_cleanly(partition, signal.SIGTERM)


@pytest.mark.slow
def test_ctrl_c_during_the_cut_stops_the_run(run):
    """Ctrl-C to a run that inherited SIGINT ignored (started in the background by a
    script): it was lost and the run finished with exit 0. It stops the run once the cut
    returns, exit 130."""
    partition = run(sigint_ignored=True)
    partition.wait_for("the cut's start", lambda: partition.logged("stage take over"))
    time.sleep(0.5)  # into METIS itself, past the arrays pymetis is handed
    partition.process.send_signal(signal.SIGINT)
    _assert_stopped_cleanly(partition, signal.SIGINT)
