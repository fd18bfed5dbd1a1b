"""Fixtures of the adaqp.quant tests: the quantizer path a test runs on."""

from __future__ import annotations

import pytest

from adaqp.quant import kernels

PATHS = ["torch", "compiled"]


@pytest.fixture(params=PATHS)
def kernel_path(request) -> str:
    """Runs the test on each quantizer path (the process default while it runs)."""
    if request.param == "compiled" and not kernels.compiled_available():
        pytest.skip("numba is not importable here")
    previous = kernels.set_kernels(request.param)
    yield request.param
    kernels.set_kernels(previous)
