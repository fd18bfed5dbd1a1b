"""Fixtures of the adaqp.quant tests: the quantizer path a test runs on."""

from __future__ import annotations

import pytest

from adaqp.quant import kernels

PATHS = ["torch", "compiled"]


@pytest.fixture(params=PATHS)
def kernel_path(request) -> str:
    """Runs the test on each quantizer path (the process default while it runs). numba is a
    dependency: where it is missing the compiled path's tests fail rather than skip."""
    previous = kernels.set_kernels(request.param)
    yield request.param
    kernels.set_kernels(previous)
