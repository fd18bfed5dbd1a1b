"""Tests for the compiled quantizer (adaqp.quant.compiled, adaqp.quant.kernels): the path
switch, the wire format against the torch path's, the counter-based draws against a plain
numpy statement of them, the rounding's exact expectation, and independence from threads.

The statistical tests of both paths (unbiasedness, variance, one bit, clamping) are those of
test_rows.py and test_mixed.py, run on each path by the ``kernel_path`` fixture.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from adaqp.config import ConfigError, load_config
from adaqp.quant import kernels as K
from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.draws import RowKeys
from adaqp.quant.mixed import blend_, dequantize_mixed, quantize_mixed
from adaqp.quant.pack import pack, packed_row_bytes, unpack
from adaqp.quant.rows import dequantize, quantize
from tests.quant.draws_reference import codes, draws, round_codes
from tests.quant.helpers import _gen, _keys, _levels, _on_grid_rows, _parse_mixed

DIMS = [1, 3, 7, 8, 9, 33, 64, 67]


def _needs_compiled(path: str) -> None:
    """The compiled side of a test that compares the paths runs where numba can."""
    if path == "compiled" and not K.compiled_available():
        pytest.skip(f"the compiled kernels cannot run here: {K.compiled_module()}")


# --------------------------------------------------------------------------- the switch


def test_the_switch_picks_the_path_by_device():
    assert K.use_compiled("auto", "cpu") and K.use_compiled("compiled", "cpu")
    assert not K.use_compiled("torch", "cpu")
    assert not K.use_compiled("auto", "meta")  # any non-CPU device: the torch path
    with pytest.raises(ValueError, match="CPU tensors"):
        K.use_compiled("compiled", "meta")
    with pytest.raises(ValueError, match="kernels must be one of"):
        K.use_compiled("fast", "cpu")
    previous = K.set_kernels("torch")
    try:
        assert not K.use_compiled(None, "cpu")
        with pytest.raises(ValueError, match="kernels must be one of"):
            K.set_kernels("numba")
    finally:
        K.set_kernels(previous)


def test_config_key_is_validated():
    assert load_config(None, ["quant.kernels=torch"]).quant.kernels == "torch"
    assert load_config(None, []).quant.kernels == "auto"
    with pytest.raises(ConfigError, match="quant.kernels"):
        load_config(None, ["quant.kernels=numba"])


# --------------------------------------------------------------------------- wire format


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_packed_bytes_equal_pack_of_the_same_codes(bits: int, dim: int):
    # On-grid rows (integers spanning [0, L]) quantize to themselves whatever the draw.
    bits_r = torch.full((9,), bits, dtype=torch.int8)
    x = _on_grid_rows(bits_r, max(dim, 2), dim + bits)[:, :dim]
    if dim == 1:
        x = torch.zeros(9, 1)
    q = quantize(x, bits, kernels="compiled", keys=_keys(0, x))
    assert torch.equal(q.packed, pack(x.to(torch.uint8), bits))
    assert torch.equal(q.minimum, x.amin(1)) and torch.equal(q.maximum, x.amax(1))


@pytest.mark.parametrize("dim", DIMS[1:])
def test_mixed_buffer_equals_the_torch_paths_byte_for_byte(dim: int):
    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8)[
        torch.randperm(23, generator=_gen(dim)) % 4
    ]
    x = _on_grid_rows(bits_r, dim, dim)
    compiled = quantize_mixed(x, bits_r, kernels="compiled", keys=_keys(1, x))
    assert torch.equal(compiled, quantize_mixed(x, bits_r, kernels="torch", keys=_keys(1, x)))
    # At an odd offset of a larger buffer, as a slice of an all_to_all send buffer.
    send = torch.zeros(compiled.numel() + 3, dtype=torch.uint8)
    quantize_mixed(x, bits_r, out=send[3:], kernels="compiled", keys=_keys(1, x))
    assert torch.equal(send[3:], compiled) and bool((send[:3] == 0).all())


@pytest.mark.parametrize("dim", [5, 64, 67])
def test_each_path_decodes_the_others_bytes_to_the_same_floats(dim: int):
    g = _gen(dim)
    x = torch.randn(40, dim, generator=g) * torch.logspace(-3, 3, 40)[:, None]
    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8)[torch.randperm(40, generator=g) % 4]
    for writer in ("torch", "compiled"):
        buf = quantize_mixed(x, bits_r, kernels=writer, keys=_keys(2, x))
        ours = dequantize_mixed(buf, bits_r, dim, kernels="compiled")
        theirs = dequantize_mixed(buf, bits_r, dim, kernels="torch")
        assert torch.equal(ours, theirs), writer  # bit for bit, one bit included
    q = quantize(x, 2, kernels="torch", keys=_keys(3, x))
    assert torch.equal(dequantize(q, kernels="compiled"), dequantize(q, kernels="torch"))


# --------------------------------------------------------------------------- the draws


@pytest.mark.parametrize("path", ["torch", "compiled"])
@pytest.mark.parametrize("dim", [1, 6, 37, 64])
def test_codes_are_the_stated_hash_of_seed_row_and_column(dim: int, path: str):
    _needs_compiled(path)
    g = _gen(dim)
    x = torch.randn(50, dim, generator=g) * torch.logspace(-2, 2, 50)[:, None]
    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8)[torch.randperm(50, generator=g) % 4]
    for seed in (0, 7, 12345):
        buf = quantize_mixed(x, bits_r, kernels=path, keys=_keys(seed, x))
        expected = codes(x, bits_r, np.uint64(seed))
        for bits, group in _parse_mixed(buf, bits_r, dim).items():
            rows = (bits_r == bits).numpy()
            got = unpack(group.packed, bits, dim).numpy()
            np.testing.assert_array_equal(got, expected[rows])


def _chi2_below_bound(cells: np.ndarray, count: int) -> bool:
    counts = np.bincount(cells, minlength=count)
    expected = cells.size / count
    chi2 = ((counts - expected) ** 2 / expected).sum()
    return bool(chi2 < count - 1 + 5 * np.sqrt(2 * (count - 1)))


def test_draws_are_uniform_16_bit_lanes():
    # Every 16-bit value about equally often (chi-square on the top byte), and every bit set
    # half the time, across rows, columns and lanes.
    u = draws(np.uint64(2024), 256, 1024).ravel()
    assert _chi2_below_bound(u >> 8, 256)
    ones = np.array([((u >> k) & 1).mean() for k in range(16)])
    assert np.abs(ones - 0.5).max() < 5 * 0.5 / np.sqrt(u.size)


@pytest.mark.parametrize("seed", [0, 2024])
def test_neighbouring_draws_are_uncorrelated(seed: int):
    # The two lanes of a word, neighbouring words of a row, the same column of neighbouring
    # rows: each pair's joint distribution uniform (chi-square over 16 x 16 cells of their
    # top 4 bits) and their correlation within 5 standard errors of 0.
    u = draws(np.uint64(seed), 512, 512).astype(np.int64)
    pairs = {
        "lanes of a word": (u[:, 0::2], u[:, 1::2]),
        "neighbouring words": (u[:, 0:-2:2], u[:, 2::2]),
        "neighbouring rows": (u[:-1], u[1:]),
    }
    for name, (a, b) in pairs.items():
        a, b = a.ravel(), b.ravel()
        assert _chi2_below_bound((a >> 12) * 16 + (b >> 12), 256), name
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(a.size), name


@pytest.mark.parametrize("path", ["torch", "compiled"])
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_rounding_expectation_is_exact_and_the_bias_bound_tight(bits: int, path: str):
    _needs_compiled(path)
    # Over every 16-bit draw, E[q] = rint(2**16 t) / 2**16: the bias is at most 2**-17 (Δ = 1
    # here, so t = x) and attained where 2**16 t is half an integer.
    levels = _levels(bits)
    g = _gen(50 + bits)
    k = torch.randint(0, levels, (40,), generator=g).double()
    frac = torch.cat(
        [
            torch.tensor([2.0**-17, 3 * 2.0**-18, 2.0**-18, 2.0**-16, 0.5, 1 - 2.0**-17]),
            torch.rand(34, generator=g, dtype=torch.float64),
        ]
    )
    t = (k + frac).float().numpy()
    every = np.arange(2**16, dtype=np.uint32)[:, None]
    mean = round_codes(t[None, :] * np.float32(2**16), every).mean(0)
    expected = np.rint(t.astype(np.float64) * 2**16) / 2**16
    np.testing.assert_array_equal(mean, expected)
    bias = np.abs(mean - t.astype(np.float64))
    assert (bias <= 2.0**-17).all() and bias.max() == 2.0**-17
    # Each path rounds exactly so: rows [0, L, t...] have Δ = 1 and t = x, and their codes
    # match the statement above for the keys' draws.
    x = torch.from_numpy(np.concatenate([[0.0, levels], t]).astype(np.float32))[None]
    q = quantize(x, bits, kernels=path, keys=_keys(9, x))
    expected_codes = round_codes(x.numpy() * np.float32(2**16), draws(np.uint64(9), 1, x.shape[1]))
    np.testing.assert_array_equal(unpack(q.packed, bits, x.shape[1]).numpy(), expected_codes)


@pytest.mark.parametrize("path", ["torch", "compiled"])
def test_a_step_whose_reciprocal_overflows_rounds_by_the_quotient(path: str):
    # A normal Δ below 2**16 / float32 max: the codes still span 0..L.
    _needs_compiled(path)
    g = _gen(8)
    x = torch.rand(30, 40, generator=g) * torch.logspace(-35, -34.5, 30)[:, None]
    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8).repeat(8)[:30]
    buf = quantize_mixed(x, bits_r, kernels=path, keys=_keys(3, x))
    expected = codes(x, bits_r, np.uint64(3))
    levels = 2 ** bits_r.numpy().astype(np.int64) - 1
    for bits, group in _parse_mixed(buf, bits_r, 40).items():
        rows = (bits_r == bits).numpy()
        got = unpack(group.packed, bits, 40).numpy()
        np.testing.assert_array_equal(got, expected[rows])
        low, high = x[rows].argmin(1), x[rows].argmax(1)
        assert (got[np.arange(rows.sum()), low] == 0).all()
        assert (got[np.arange(rows.sum()), high] == levels[rows]).all()
    out = dequantize_mixed(buf, bits_r, 40, kernels=path)
    assert bool((out >= x.amin(1, keepdim=True)).all() and (out <= x.amax(1, keepdim=True)).all())


def test_a_call_without_keys_draws_one_base_key_from_the_default_generator():
    # One 64-bit draw a call, rows keyed by index: torch.manual_seed replays it, on either path.
    x, bits_r = torch.randn(30, 9), torch.full((30,), 4, dtype=torch.int8)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        base = torch.empty((), dtype=torch.int64).random_(-(2**63), None).item()
        after = torch.random.get_rng_state()
        keyed = quantize_mixed(
            x, bits_r, kernels="compiled", keys=RowKeys.of(np.int64(base).view(np.uint64), count=30)
        )
        for path in ("compiled", "torch"):
            torch.manual_seed(5)
            assert torch.equal(quantize_mixed(x, bits_r, kernels=path), keyed), path
            assert torch.equal(torch.random.get_rng_state(), after), path


def test_thread_count_does_not_change_the_codes():
    # 2**15 values or more take the prange kernels when torch has more than one thread.
    x = torch.randn(600, 64, generator=_gen(1))
    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8).repeat(150)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            buf = quantize_mixed(x, bits_r, kernels="compiled", keys=_keys(4, x))
            results.append((buf, dequantize_mixed(buf, bits_r, 64, kernels="compiled")))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_strided_inputs_and_outputs():
    x = torch.randn(20, 12, generator=_gen(3))
    bits_r = torch.full((12,), 4, dtype=torch.int8)
    strided = x.t()  # [12, 20], not contiguous
    buf = quantize_mixed(strided, bits_r, kernels="compiled", keys=_keys(0, strided))
    expected = quantize_mixed(
        strided.contiguous(), bits_r, kernels="compiled", keys=_keys(0, strided.contiguous())
    )
    assert torch.equal(buf, expected)
    out = torch.zeros(20, 12).t()
    result = dequantize_mixed(buf, bits_r, 20, out=out, kernels="compiled")
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(out, dequantize_mixed(buf, bits_r, 20, kernels="compiled"))
    with pytest.raises(ValueError, match="unsupported widths"):
        quantize_mixed(x, torch.tensor([3] * 20, dtype=torch.int8), kernels="compiled")
    assert packed_row_bytes(12, 4) == 6


def test_warm_up_loads_every_kernel():
    assert K.warm_up()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dim", [5, 64, 67])
def test_blending_decoder_is_decode_then_blend_bit_for_bit(dim: int, threads: int):
    """The compiled decoder's blend (one pass) writes what a plain decode followed by
    ``blend_`` (torch, each operation rounded) writes, on one thread and on the prange
    kernel (2**15 values or more), into contiguous and strided tensors."""
    rows = 600 if threads > 1 else 40
    g = _gen(dim)
    x = torch.randn(rows, dim, generator=g) * torch.logspace(-3, 3, rows)[:, None]
    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8)[torch.randperm(rows, generator=g) % 4]
    buf = quantize_mixed(x, bits_r, kernels="compiled", keys=_keys(2, x))
    decoded = dequantize_mixed(buf, bits_r, dim, kernels="compiled")
    average = torch.randn(rows, dim, generator=g)
    expected = blend_(average.clone(), decoded, 0.1)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        blended = dequantize_mixed(buf, bits_r, dim, average.clone(), "compiled", blend=0.1)
        strided = average.t().contiguous().t()
        dequantize_mixed(buf, bits_r, dim, strided, "compiled", blend=0.1)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(blended, expected)
    assert torch.equal(strided, expected)
    on_torch = dequantize_mixed(buf, bits_r, dim, average.clone(), "torch", blend=0.1)
    assert torch.equal(on_torch, expected)
    with pytest.raises(ValueError, match="blend needs out"):
        dequantize_mixed(buf, bits_r, dim, kernels="compiled", blend=0.1)


@pytest.mark.parametrize("dim", [0, 1, 7, 64, 67])
def test_squared_ranges_equal_the_torch_paths_bit_for_bit(dim: int):
    """The planner's trace: each row's (max - min)² on both paths, with negative rows, a
    constant row, signed zeros, infinities and a NaN (propagated, as amax/amin do)."""
    x = torch.randn(9, dim, generator=_gen(dim)) * 1e3
    if dim:
        x[1] = 2.5
        x[2, 0], x[3, 0] = -0.0, 0.0
        x[4, -1] = float("inf")
        x[5, 0] = float("-inf")
        x[6, dim // 2] = float("nan")
    previous = K.set_kernels("torch")
    try:
        reference = K.squared_ranges(x)
    finally:
        K.set_kernels("compiled")
    try:
        compiled = K.squared_ranges(x)
        strided = K.squared_ranges(x[::2])
    finally:
        K.set_kernels(previous)
    assert compiled.dtype == torch.float64 and compiled.shape == (9,)
    torch.testing.assert_close(compiled, reference, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(strided, reference[::2], rtol=0, atol=0, equal_nan=True)
    if dim:
        assert compiled[1] == 0 and torch.isnan(compiled[6])


def _compile_pending(**env: str) -> str:
    code = "from adaqp.quant import kernels\nkernels.warm_up()\nprint(kernels.compile_pending())"
    if env:  # asked only: nothing is compiled into this cache
        code = "from adaqp.quant import kernels\nprint(kernels.compile_pending())"
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": root, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_compile_pending_reads_numbas_cache(tmp_path):
    """The trainer's "compiling the CPU kernels" line rests on it: True for an empty cache
    (NUMBA_CACHE_DIR moves it), False once warm_up has filled or loaded the real one."""
    assert _compile_pending(NUMBA_CACHE_DIR=str(tmp_path)) == "True"
    assert _compile_pending() == "False"


def test_numba_is_a_dependency_and_auto_says_once_why_it_falls_back(monkeypatch, caplog):
    """numba comes with the package: its kernels must load here (no test skips for it);
    where they cannot, ``auto`` takes the torch path and one warning names why."""
    assert K.compiled_available(), K.compiled_module()
    monkeypatch.setattr(K, "compiled_module", lambda: "numba is not importable (test)")
    K._warn_fallback.cache_clear()
    with caplog.at_level("WARNING", logger=K.__name__):
        assert not K.use_compiled("auto", "cpu")
        assert not K.use_compiled("auto", "cpu")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "quant.kernels = auto: numba is not importable (test); using the slower torch path"
    ]
    K._warn_fallback.cache_clear()
