"""Tests for adaqp.quant.draws: draws keyed by (base key, row key, column), the same on the
compiled and torch paths, and the same for a row whoever draws it.

The compiled quantizer's keyed draws are tied to the numpy statement of
tests/quant/test_kernels.py (a row with key k draws as row k of a message seeded with the
base key); the torch path's words to a numpy statement of the same hash here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from adaqp.quant.draws import Draw, RowKeys, draw_key, edge_keys, keep_mask, lanes16, words
from adaqp.quant.mixed import dequantize_mixed, quantize_mixed
from adaqp.quant.pack import unpack
from tests.quant.helpers import _parse_mixed
from tests.quant.test_kernels import _codes, _lowbias32_keyed, _mix64

_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def _numpy_words(keys: RowKeys, count: int) -> np.ndarray:
    """The module docstring's words in numpy uint32 arithmetic."""
    with np.errstate(over="ignore"):
        mixed = _mix64(keys.base + (keys.rows + np.uint64(1)) * _GAMMA)[:, None]
        low = (mixed & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        high = (mixed >> np.uint64(32)).astype(np.uint32)
        j = np.arange(count, dtype=np.uint32)[None, :]
        return _lowbias32_keyed(low + j * np.uint32(0x9E3779B9), high)


def test_base_keys_are_a_pure_function_of_their_parts():
    key = draw_key(7, 3, 1, Draw.DROPOUT)
    assert key.dtype == np.uint64 and key == draw_key(7, 3, 1, Draw.DROPOUT)
    others = {
        draw_key(*parts) for parts in [(8, 3, 1, 1), (7, 4, 1, 1), (7, 3, 2, 1), (7, 3, 1, 2)]
    }
    assert key not in others and len(others) == 4
    assert draw_key(7, 3, 1, 4, 0) != draw_key(7, 3, 1, 4, 1)  # the sending rank, for gradients
    assert draw_key(-1) == draw_key(2**64 - 1)  # integers modulo 2**64


def test_torch_words_equal_the_numpy_statement():
    ids = np.array([0, 1, 2, 5, 2**40 + 3, 2**64 - 2], dtype=np.uint64)
    keys = RowKeys(draw_key(0, 1), ids)
    expected = _numpy_words(keys, 9)
    assert torch.equal(words(keys, 9), torch.from_numpy(expected.astype(np.int64)))
    lanes = lanes16(keys, 17)
    low_high = np.stack([expected & 0xFFFF, expected >> 16], -1).reshape(len(ids), -1)[:, :17]
    assert torch.equal(lanes, torch.from_numpy(low_high.astype(np.int32)))
    threshold = 1 << 31
    assert torch.equal(keep_mask(keys, 9, threshold), torch.from_numpy(expected >= threshold))


def test_row_keys_take_and_split_keep_each_rows_key():
    keys = RowKeys.of(draw_key(1), np.array([9, 4, 7, 1]))
    assert len(keys) == 4 and keys.rows.dtype == np.uint64
    assert keys.take(np.array([False, True, True, False])).rows.tolist() == [4, 7]
    assert [k.rows.tolist() for k in keys.split([1, 0, 3])] == [[9], [], [4, 7, 1]]
    assert RowKeys.of(5, count=3).rows.tolist() == [0, 1, 2]
    assert np.array_equal(keys.take([2, 0]).mixed(), keys.mixed()[[2, 0]])


def test_edge_keys_pack_destination_and_source():
    assert edge_keys(np.array([0, 3]), np.array([5, 0])).tolist() == [5, 3 << 32]
    with pytest.raises(ValueError, match="2\\*\\*32"):
        edge_keys(np.array([2**32]), np.array([0]))


@pytest.mark.parametrize("bits", [1, 8])
def test_the_compiled_quantizer_draws_row_k_as_row_k_of_a_seeded_message(bits: int):
    """Row keys replace the row index of the stated draw: a message whose rows carry keys
    ``ids`` is coded as rows ``ids`` of a message seeded with the base key, in any order."""
    rng = np.random.default_rng(3)
    ids = rng.choice(60, 20, replace=False)
    big = torch.randn(60, 11, generator=torch.Generator().manual_seed(4))
    base = draw_key(0, 2, 1, Draw.FORWARD)
    widths = torch.full((20,), bits, dtype=torch.int8)
    buf = quantize_mixed(big[ids], widths, None, kernels="compiled", keys=RowKeys.of(base, ids))
    expected = _codes(big, torch.full((60,), bits, dtype=torch.int8), base)[ids]
    got = unpack(_parse_mixed(buf, widths, 11)[bits].packed, bits, 11).numpy()
    np.testing.assert_array_equal(got, expected)
    # Another order of the same rows and keys: the same codes, row by row.
    order = rng.permutation(20)
    keys = RowKeys.of(base, ids[order])
    buf = quantize_mixed(big[ids[order]], widths, None, kernels="compiled", keys=keys)
    got = unpack(_parse_mixed(buf, widths, 11)[bits].packed, bits, 11).numpy()
    np.testing.assert_array_equal(got, expected[order])


def test_the_torch_path_rounds_with_the_keys_draws():
    """The torch path (CUDA's) takes the top 15 bits of the compiled path's 16-bit draw: its
    codes are its rounding rule (``adaqp/quant/rows.py``) with those draws."""
    x = torch.randn(40, 13, generator=torch.Generator().manual_seed(5))
    keys = RowKeys.of(draw_key(1, 1, 0, Draw.BACKWARD, 2), np.arange(100, 140))
    widths = torch.full((40,), 4, dtype=torch.int8)
    torch_buf = quantize_mixed(x, widths, None, kernels="torch", keys=keys)
    m, top = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    step = (top - m) / 15
    t = torch.minimum((x - m) / step, torch.tensor(15.0))
    rounded = (torch.tensor(2.0**23) + t * 2**15).view(torch.int32) - 0x4B000000
    codes = (rounded + (lanes16(keys, 13) >> 1)) >> 15
    expected = torch.minimum(m + codes.float() * step, top)
    assert torch.equal(dequantize_mixed(torch_buf, widths, 13, kernels="torch"), expected)
    # Generator-free: the same keys give the same bytes, on either path.
    assert torch.equal(quantize_mixed(x, widths, None, kernels="torch", keys=keys), torch_buf)


@pytest.mark.parametrize("kernels", ["compiled", "torch"])
def test_keyed_rounding_is_unbiased_over_base_keys(kernels: str):
    """Over 600 epochs' base keys (every row key fixed), the mean reconstruction of a row is
    the row, within 5 standard errors of the stochastic rounding."""
    x = torch.tensor([[0.0, 0.1, 0.37, 0.5, 0.71, 0.99, 1.0]])
    widths = torch.full((1,), 2, dtype=torch.int8)
    total = torch.zeros_like(x, dtype=torch.float64)
    n = 600
    for epoch in range(n):
        keys = RowKeys.of(draw_key(0, epoch, 0, Draw.FORWARD), np.array([12345]))
        buf = quantize_mixed(x, widths, None, kernels=kernels, keys=keys)
        total += dequantize_mixed(buf, widths, 7, kernels=kernels).double()
    step = 1 / 3
    f = (x.double() / step) % 1
    se = step * torch.sqrt(f * (1 - f) / n)
    assert ((total / n - x.double()).abs() <= 5 * se + 1e-6).all()
    assert math.isfinite(float(total.sum()))
