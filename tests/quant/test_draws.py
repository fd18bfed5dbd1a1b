"""Tests for adaqp.quant.draws: draws keyed by (base key, row key, column), the same on the
compiled and torch paths, and the same for a row whoever draws it.

The compiled quantizer's keyed draws are tied to the numpy statement of
tests/quant/test_kernels.py (a row with key k draws as row k of a message seeded with the
base key); the torch path's words to a numpy statement of the same hash here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaqp.quant import kernels as kernels_module
from adaqp.quant.draws import Draw, RowKeys, draw_key, edge_keys, keep_mask, lanes16, words
from adaqp.quant.mixed import dequantize_mixed, quantize_mixed
from adaqp.quant.pack import unpack
from tests.quant.draws_reference import GAMMA, codes, lowbias32_keyed, mix64
from tests.quant.helpers import _parse_mixed


def _numpy_words(keys: RowKeys, count: int) -> np.ndarray:
    """The module docstring's words in numpy uint32 arithmetic."""
    with np.errstate(over="ignore"):
        mixed = mix64(keys.base + (keys.rows + np.uint64(1)) * GAMMA)[:, None]
        low = (mixed & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        high = (mixed >> np.uint64(32)).astype(np.uint32)
        j = np.arange(count, dtype=np.uint32)[None, :]
        return lowbias32_keyed(low + j * np.uint32(0x9E3779B9), high)


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
    buf = quantize_mixed(big[ids], widths, kernels="compiled", keys=RowKeys.of(base, ids))
    expected = codes(big, torch.full((60,), bits, dtype=torch.int8), base)[ids]
    got = unpack(_parse_mixed(buf, widths, 11)[bits].packed, bits, 11).numpy()
    np.testing.assert_array_equal(got, expected)
    # Another order of the same rows and keys: the same codes, row by row.
    order = rng.permutation(20)
    keys = RowKeys.of(base, ids[order])
    buf = quantize_mixed(big[ids[order]], widths, kernels="compiled", keys=keys)
    got = unpack(_parse_mixed(buf, widths, 11)[bits].packed, bits, 11).numpy()
    np.testing.assert_array_equal(got, expected[order])


def _threshold_rows(
    bits: int, keys: RowKeys, dim: int, clear: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[0, L, x...]`` (so ``Δ = 1`` and ``t = x`` exactly) whose every other value sits
    on the rounding threshold of its own draw ``u`` (:func:`lanes16`): ``x = k + (2**16 - u) /
    2**16`` must round up to ``k + 1`` (``clear``), ``x = k + (2**16 - u - 1) / 2**16`` down to
    ``k``. Every such ``x`` is a float32 (``k < 2**8``, 16 bits of fraction). Returns the rows and
    the codes worked out by hand."""
    levels = (1 << bits) - 1
    rows = len(keys)
    u = lanes16(keys, dim).to(torch.int64)[:, 2:]
    k = torch.randint(0, levels, (rows, dim - 2), generator=torch.Generator().manual_seed(bits))
    numerator = 2**16 - u if clear else 2**16 - u - 1
    inner = (k * 2**16 + numerator).double() / 2**16  # the fraction is numerator / 2**16 < 1...
    # ...but numerator = 2**16 at u = 0 (clear): x is then k + 1, on the grid, code k + 1.
    ends = torch.tensor([0.0, float(levels)], dtype=torch.float64).expand(rows, 2)
    x = torch.cat([ends, inner], dim=1).float()
    assert torch.equal(x.double()[:, 2:], inner)  # exact in float32
    codes = torch.cat([torch.tensor([0, levels]).expand(rows, 2), k + int(clear)], dim=1)
    return x, codes


@pytest.mark.parametrize("path", ["torch", "compiled"])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_a_value_rounds_up_exactly_when_its_draw_clears_its_fraction(bits: int, path: str):
    """Known answers worked out by hand from the rule alone (code ``k + 1`` with probability
    ``f`` for ``x = k + f``, from a uniform 16-bit draw ``u``: up exactly when
    ``u >= 2**16·(1 - f)``), at 16-bit resolution: a value on its draw's threshold rounds up,
    one 2**-16 below it rounds down. A path that reads fewer bits of the draw (the torch path
    read the top 15) misses about a quarter of them."""
    if path == "compiled" and not kernels_module.compiled_available():
        pytest.skip(f"the compiled kernels cannot run here: {kernels_module.compiled_module()}")
    keys = RowKeys.of(draw_key(1, 1, 0, Draw.BACKWARD, 2), np.arange(100, 164))
    widths = torch.full((64,), bits, dtype=torch.int8)
    for clear in (True, False):
        x, expected = _threshold_rows(bits, keys, 50, clear)
        buf = quantize_mixed(x, widths, kernels=path, keys=keys)
        got = unpack(_parse_mixed(buf, widths, 50)[bits].packed, bits, 50).to(torch.int64)
        assert torch.equal(got, expected), (clear, int((got != expected).sum()))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_both_paths_write_the_same_codes_for_the_same_keys(bits: int):
    """Rows at assorted scales and offsets (a step whose reciprocal overflows among them),
    keyed by global ids: the torch path (CUDA's) and the compiled kernels write the same
    bytes. About a million values: a path that differs in the last bit of its draws or in
    an ulp of its scaling differs somewhere."""
    if not kernels_module.compiled_available():
        pytest.skip(f"the compiled kernels cannot run here: {kernels_module.compiled_module()}")
    g = torch.Generator().manual_seed(bits)
    rows, dim = 4096, 255  # an odd width: the last word's high lane unused
    scale = torch.logspace(-36, 6, rows)[torch.randperm(rows, generator=g)][:, None]
    offset = torch.randn(rows, 1, generator=g) * 100
    x = torch.randn(rows, dim, generator=g) * scale + offset * (scale > 1e-3)
    ids = torch.randperm(10 * rows, generator=g)[:rows].numpy()
    keys = RowKeys.of(draw_key(3, 7, 1, Draw.FORWARD), ids)
    widths = torch.full((rows,), bits, dtype=torch.int8)
    compiled = quantize_mixed(x, widths, kernels="compiled", keys=keys)
    torch_path = quantize_mixed(x, widths, kernels="torch", keys=keys)
    assert int((compiled != torch_path).sum()) == 0


@pytest.mark.parametrize("kernels", ["compiled", "torch"])
def test_keyed_rounding_is_unbiased_over_base_keys(kernels: str):
    """Over 128 epochs' base keys (the row keys fixed), values at eight positions between
    grid points reconstruct, on average, to themselves: for each position the mean error
    over 2**18 draws is within 5 standard errors, about 0.5% of a step. A bias of 1% of a
    step fails it (checked below; a rounding that reads its draw 1% too high fails too)."""
    positions = torch.tensor([0.0, 0.1, 0.25, 0.37, 0.5, 0.71, 0.9, 0.99], dtype=torch.float64)
    rows, per_row = 256, 64
    ids = np.arange(rows, dtype=np.uint64) * np.uint64(7919) + np.uint64(12345)
    # Row: [0, 3, values k + f] at 2 bits, so Δ = 1: position f of column j is j mod 8.
    k = torch.arange(per_row - 2) % 3
    frac = positions[torch.arange(per_row - 2) % len(positions)]
    row = torch.cat([torch.tensor([0.0, 3.0], dtype=torch.float64), k + frac])
    x = row.float().expand(rows, per_row).contiguous()
    widths = torch.full((rows,), 2, dtype=torch.int8)
    total = torch.zeros(per_row, dtype=torch.float64)
    epochs = 128
    for epoch in range(epochs):
        keys = RowKeys.of(draw_key(0, epoch, 0, Draw.FORWARD), ids)
        buf = quantize_mixed(x, widths, kernels=kernels, keys=keys)
        total += dequantize_mixed(buf, widths, per_row, kernels=kernels).double().sum(0)
    err = total[2:] / (epochs * rows) - x[0, 2:].double()  # in steps: Δ = 1
    pooled = torch.zeros(len(positions), dtype=torch.float64)
    pooled.index_add_(0, torch.arange(per_row - 2) % len(positions), err)
    counts = torch.bincount(torch.arange(per_row - 2) % len(positions)).double()
    mean = pooled / counts  # per position, over counts·epochs·rows draws
    f = positions.float().double()  # the float32 fraction (1e-8 off f at most)
    se = torch.sqrt(f * (1 - f) / (counts * epochs * rows))
    limit = 5 * se + 2.0**-17  # the rounding's own bias bound, Δ / 2**17
    assert bool((mean.abs() <= limit).all()), (mean, limit)
    assert bool((limit < 0.01).all())  # the test has teeth: a 1% bias would fail it
