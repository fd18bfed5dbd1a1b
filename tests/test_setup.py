"""launch/setup.sh: which torch build it installs, and its fallback (with a stand-in pip)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "launch" / "setup.sh"

# A stand-in for the venv's python: logs every call, "has" torch once it was installed,
# refuses the package specs listed in $REFUSE (as an index without them would), and fails
# to compile the kernels where $FAIL_COMPILE is set.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/calls.log"
[[ "$1 $2" == "-m pip" ]] && echo "PIP ${@: -1}"  # on stdout, after setup's own lines
if [[ "$1" == "-c" ]]; then
  [[ -e "$(dirname "$0")/torch-installed" ]] || exit 1
  [[ "$2" == *warm_up* && -n "${FAIL_COMPILE:-}" ]] && exit 1
  [[ "$2" == *print* ]] && echo "torch 2.13.0+fake"
  exit 0
fi
for arg in "$@"; do
  for refused in $REFUSE; do [[ "$arg" == "$refused" ]] && exit 1; done
  [[ "$arg" == torch* ]] && touch "$(dirname "$0")/torch-installed"
done
exit 0
"""


def _setup(tmp_path: Path, *args: str, refuse: str = "", nvidia: bool = False, **env):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    path = os.environ["PATH"]
    if nvidia:
        fake_bin = tmp_path / "bin"
        fake_bin.mkdir(exist_ok=True)
        smi = fake_bin / "nvidia-smi"
        smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H200"\n')
        smi.chmod(0o755)
        path = f"{fake_bin}:{path}"
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "TORCH_CPU_INDEX")}
    environ.update(VENV=str(venv), REFUSE=refuse, PATH=path, **env)
    proc = subprocess.run(
        ["bash", str(SETUP), *args], env=environ, capture_output=True, text=True, timeout=60
    )
    log = venv / "bin" / "calls.log"
    return proc, log.read_text().splitlines() if log.exists() else []


def _installed(calls: list[str]) -> list[str]:
    return [c.split()[-1] for c in calls if c.startswith("-m pip install")]


def _pip_calls(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("-m pip install")]


CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
COMPILE = "-c from adaqp.quant import kernels; kernels.warm_up(parallel=True)"
NO_GPU = pytest.mark.skipif(
    Path("/proc/driver/nvidia/version").exists(), reason="an NVIDIA driver here"
)


@NO_GPU
def test_without_a_gpu_the_cpu_build_is_installed_from_pytorchs_index_too(tmp_path):
    proc, calls = _setup(tmp_path, "--test")
    assert proc.returncode == 0, proc.stderr
    assert _installed(calls) == ["torch==2.13.0+cpu", ".[test,pyg]"]
    # PyTorch's CPU index is asked for torch alone, briefly: out of reach, it costs seconds.
    first = _pip_calls(calls)[0]
    for option in (CPU_INDEX, "--timeout 10", "--retries 0", "--no-deps"):
        assert option in first, first
    assert CPU_INDEX not in _pip_calls(calls)[1]
    assert "torch 2.13.0+fake" in proc.stdout and str(tmp_path / "venv") in proc.stdout


@NO_GPU
def test_an_index_without_the_cpu_build_falls_back_with_a_message(tmp_path):
    proc, calls = _setup(tmp_path, refuse="torch==2.13.0+cpu")
    assert proc.returncode == 0, proc.stderr
    assert _installed(calls) == ["torch==2.13.0+cpu", "torch==2.13.0", "."]
    fallback = _pip_calls(calls)[1]
    assert "--extra-index-url" not in fallback and "--timeout" not in fallback, fallback
    assert (
        "found no torch==2.13.0+cpu in the package index or at https://download.pytorch.org/whl/cpu"
        in proc.stderr
    )
    assert "PIP_EXTRA_INDEX_URL" in proc.stderr


@NO_GPU
def test_the_cpu_index_can_be_changed_or_left_out(tmp_path):
    proc, calls = _setup(tmp_path, TORCH_CPU_INDEX="https://mirror.example/cpu")
    assert proc.returncode == 0, proc.stderr
    assert "--extra-index-url https://mirror.example/cpu" in _pip_calls(calls)[0]
    proc, _ = _setup(tmp_path, "--print-torch-spec", TORCH_CPU_INDEX="https://mirror.example/cpu")
    assert proc.stdout.strip() == (
        "torch==2.13.0+cpu --extra-index-url https://mirror.example/cpu (else torch==2.13.0)"
    )
    (tmp_path / "venv" / "bin" / "torch-installed").unlink()
    (tmp_path / "venv" / "bin" / "calls.log").unlink()
    proc, calls = _setup(tmp_path, TORCH_CPU_INDEX="")
    assert proc.returncode == 0, proc.stderr
    assert _pip_calls(calls)[0].endswith("--disable-pip-version-check torch==2.13.0+cpu")
    proc, _ = _setup(tmp_path, "--print-torch-spec", TORCH_CPU_INDEX="")
    assert proc.stdout.strip() == "torch==2.13.0+cpu (else torch==2.13.0)"


@pytest.mark.parametrize("nvidia", [False, True])
def test_print_torch_spec_shows_the_build_and_where_it_is_looked_for(tmp_path, nvidia):
    if not nvidia and Path("/proc/driver/nvidia/version").exists():
        pytest.skip("an NVIDIA driver here")
    proc, calls = _setup(tmp_path, "--print-torch-spec", nvidia=nvidia)
    assert proc.returncode == 0 and not calls, proc.stderr
    expected = "torch==2.13.0" if nvidia else f"torch==2.13.0+cpu {CPU_INDEX} (else torch==2.13.0)"
    assert proc.stdout.strip() == expected


def test_the_cpu_kernels_are_compiled_last_and_a_failure_there_is_only_a_warning(tmp_path):
    proc, calls = _setup(tmp_path, nvidia=True)
    assert proc.returncode == 0, proc.stderr
    assert calls.index(COMPILE) > calls.index(_pip_calls(calls)[-1])  # after AdaQP's install
    assert "compiling the CPU kernels" in proc.stdout
    proc, calls = _setup(tmp_path, nvidia=True, FAIL_COMPILE="1")
    assert proc.returncode == 0 and COMPILE in calls, proc.stderr
    assert "could not compile the CPU kernels now" in proc.stderr


def test_with_an_nvidia_driver_the_default_build_is_installed(tmp_path):
    proc, calls = _setup(tmp_path, nvidia=True)
    assert proc.returncode == 0, proc.stderr
    assert _installed(calls) == ["torch==2.13.0", "."]
    assert "--extra-index-url" not in _pip_calls(calls)[0]


def test_torch_spec_overrides_and_is_not_replaced(tmp_path):
    proc, calls = _setup(tmp_path, refuse="torch==9.9", TORCH_SPEC="torch==9.9")
    assert proc.returncode == 1
    assert _installed(calls) == ["torch==9.9"]  # no fallback behind the user's back
    assert "could not install torch==9.9" in proc.stderr
    proc, _ = _setup(tmp_path, "--print-torch-spec", TORCH_SPEC="torch==9.9")
    assert proc.stdout.strip() == "torch==9.9"


def test_torch_already_there_is_kept_and_unknown_options_are_refused(tmp_path):
    _setup(tmp_path)
    (tmp_path / "venv" / "bin" / "calls.log").unlink()
    proc, calls = _setup(tmp_path)
    assert proc.returncode == 0 and _installed(calls) == ["."]
    (tmp_path / "venv" / "bin" / "calls.log").unlink()
    proc, calls = _setup(tmp_path, "--tset")
    assert proc.returncode == 2 and "unknown option --tset" in proc.stderr and not calls
    proc, calls = _setup(tmp_path, "--bench", "--tset")  # every option is checked
    assert proc.returncode == 2 and "--bench, --print-torch-spec or --help" in proc.stderr
    assert not calls


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_options_and_installs_nothing(tmp_path, flag):
    proc, calls = _setup(tmp_path, flag)
    assert proc.returncode == 0 and not calls, proc.stderr
    assert proc.stdout.startswith("usage: bash launch/setup.sh")
    for text in ("--test", "--bench", "--print-torch-spec", "--help", "TORCH_SPEC", "VENV"):
        assert text in proc.stdout, text


@pytest.mark.parametrize(
    ("flags", "extras"),
    [(["--bench"], ".[bench]"), (["--test", "--bench"], ".[test,pyg,bench]")],
)
def test_bench_installs_the_plotting_extra(tmp_path, flags, extras):
    proc, calls = _setup(tmp_path, *flags, nvidia=True)
    assert proc.returncode == 0, proc.stderr
    assert _installed(calls) == ["torch==2.13.0", extras]


@pytest.mark.parametrize(
    ("flags", "refuse", "steps"),
    [
        (
            ["--test"],
            "torch==2.13.0",
            [("installing torch==2.13.0 ", "torch==2.13.0"), ("installing AdaQP", ".[test,pyg]")],
        ),
        (
            ["--bench"],
            "torch==2.13.0+cpu",
            [
                ("installing torch==2.13.0+cpu", "torch==2.13.0+cpu"),
                ("installing torch==2.13.0 ", "torch==2.13.0"),
                ("installing AdaQP", ".[bench]"),
            ],
        ),
    ],
)
def test_each_step_is_named_before_it_runs(tmp_path, flags, refuse, steps):
    """Setup was silent for about 50 s while pip installed."""
    nvidia = refuse == "torch==2.13.0"
    if not nvidia and Path("/proc/driver/nvidia/version").exists():
        pytest.skip("an NVIDIA driver here")
    proc, _ = _setup(tmp_path, *flags, refuse="" if nvidia else refuse, nvidia=nvidia)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    pips = [i for i, line in enumerate(lines) if line.startswith("PIP ")]
    assert [lines[i].removeprefix("PIP ") for i in pips] == [spec for _, spec in steps]
    for i, (said, _) in zip(pips, steps, strict=True):
        assert lines[i - 1].startswith(said) and lines[i - 1].endswith("..."), lines
    assert "the extras [" + flags[0][2:] in proc.stdout
    assert lines[pips[-1] + 1].startswith("compiling the CPU kernels")

    proc, _ = _setup(tmp_path, *flags, nvidia=True)  # torch there now: kept, and said so
    assert f"torch is installed in {tmp_path / 'venv'} already: kept" in proc.stdout
