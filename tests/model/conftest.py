"""Fixtures of the adaqp.model tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Runs the test on one intra-op thread, so that float sums add in one order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
