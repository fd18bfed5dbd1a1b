"""Tests for adaqp.quant.rows: stochastic per-row quantization at one width."""

from __future__ import annotations

import pytest
import torch

from adaqp.quant import rows as R
from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.mixed import dequantize_mixed, mixed_buffer_bytes, quantize_mixed
from adaqp.quant.pack import pack, packed_row_bytes, unpack
from adaqp.quant.rows import QuantizedRows, dequantize, quantize
from tests.quant.helpers import (
    DEVICES,
    _gen,
    _grid_fraction,
    _keys,
    _levels,
    _mean_error_ok,
    _parse_mixed,
    _skip_compiled_off_cpu,
    _test_rows,
)

# --------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_unbiased(device: str, bits: int, kernel_path: str):
    _skip_compiled_off_cpu(kernel_path, device)
    x = _test_rows(device)
    rows, dim = x.shape
    n = 2000
    # Rows are quantized independently, so n stacked copies are n independent draws.
    xhat = dequantize(quantize(x.repeat(n, 1), bits, keys=_keys(bits, x.repeat(n, 1)))).view(
        n, rows, dim
    )
    mean_err = (xhat.double() - x.double()).mean(0).cpu()
    step, f = _grid_fraction(x.cpu(), bits)
    assert _mean_error_ok(mean_err, step, f, n)
    if bits == 2:
        # The criterion has teeth: deterministic round-to-nearest is biased and must fail it.
        nearest = (
            x.cpu().amin(1, keepdim=True)
            + ((x.cpu().double() - x.cpu().amin(1, keepdim=True).double()) / step[:, None]).round()
            * step[:, None]
        )
        assert not _mean_error_ok(nearest - x.cpu().double(), step, f, n)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_variance_matches_analytic_and_bound(bits: int, kernel_path: str):
    levels = _levels(bits)
    g = _gen(99)
    random_rows = torch.randn(3, 32, generator=g)
    # Worst case: every interior element halfway between grid points (f = 1/2), step 1.
    half = torch.cat([torch.tensor([0.0, float(levels)]), torch.full((30,), 0.5)])
    half[2:] += torch.arange(30) % levels  # (k + 1/2), still in [0, L]
    x = torch.cat([random_rows, half[None]])
    rows, dim = x.shape
    n = 4000
    copies = x.repeat(n, 1)
    xhat = (
        dequantize(quantize(copies, bits, keys=_keys(7 + bits, copies))).view(n, rows, dim).double()
    )
    empirical = xhat.var(0, unbiased=True).sum(1)  # [R] total variance per row

    step, f = _grid_fraction(x, bits)
    p = f * (1 - f)
    analytic = step**2 * p.sum(1)
    # Exact variance of the unbiased sample variance, (mu4 - sigma^4 (n - 3) / (n - 1)) / n, of a
    # step-scaled Bernoulli(f) per element, summed over the row's independent elements.
    mu4 = step[:, None] ** 4 * p * (1 - 3 * p)
    sigma4 = (step[:, None] ** 2 * p) ** 2
    sd = torch.sqrt(((mu4 - sigma4 * (n - 3) / (n - 1)) / n).sum(1))
    slack = 1e-6 * step**2 * dim
    assert torch.all((empirical - analytic).abs() <= 5 * sd + slack)
    assert torch.all(empirical <= dim * step**2 / 4 + 5 * sd + slack)
    # The half-grid row attains the bound for its 30 interior elements.
    assert analytic[-1].item() == pytest.approx(30 * step[-1].item() ** 2 / 4)


def _every_draw(keys, cols: int, device) -> torch.Tensor:
    """A stand-in for ``centred_lanes16`` that gives every value of the row keyed ``c`` the
    draw ``c mod 2**16`` (less ``2**15``, as the torch path takes its draws).

    Quantizing one row repeated 2**16 times, keyed by index, then takes each draw once per
    value, so the mean over the copies is the exact expectation over the noise.
    """
    draws = torch.from_numpy((keys.rows % 2**16).astype("int64")) - 2**15
    return draws.to(device=device, dtype=torch.int16)[:, None].expand(-1, cols)


def _exact_expectation(x_row: torch.Tensor, bits: int, monkeypatch) -> torch.Tensor:
    """float64 ``E[x̂]`` over all 2**16 draws, for one float32 row ``[D]`` (the torch path;
    the compiled one rounds alike, test_kernels.py)."""
    monkeypatch.setattr(R, "centred_lanes16", _every_draw)
    copies = x_row.repeat(2**16, 1)
    xhat = dequantize(quantize(copies, bits, kernels="torch", keys=_keys(0, copies)))
    monkeypatch.undo()
    return xhat.double().mean(0)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_noise_resolution_bias_bound_is_exact_and_tight(bits: int, monkeypatch):
    # m = 0 and M = L give a step of exactly 1, so t = x with no float rounding anywhere: the
    # only bias left is that of the 16-bit draw, E[q] = round(2**16 t) / 2**16.
    levels = _levels(bits)
    g = _gen(40 + bits)
    k = torch.randint(0, levels, (40,), generator=g).double()
    frac = torch.cat(
        [
            torch.tensor([2.0**-17, 3 * 2.0**-18, 2.0**-18, 2.0**-16, 0.5, 1 - 2.0**-17]),
            torch.rand(34, generator=g, dtype=torch.float64),
        ]
    )
    inner = (k + frac).float()  # the float32 values are the points; with Δ = 1, t = x exactly
    x = torch.cat([torch.tensor([0.0, float(levels)]), inner])
    expected = torch.round(x.double() * 2**16) / 2**16  # round half to even, as rint does
    mean = _exact_expectation(x, bits, monkeypatch)
    assert torch.equal(mean, expected)
    bias = (mean - x.double()).abs()
    assert bool((bias <= 2.0**-17).all())  # the documented bound, Δ / 2**17 with Δ = 1
    assert bias.max().item() == 2.0**-17  # ...attained (at 2**16 t = 1/2): the test has teeth


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_noise_resolution_bias_bound_on_general_rows(bits: int, monkeypatch):
    # Rows at assorted scales and offsets, where t carries float32 rounding as well.
    for r, x in enumerate(_test_rows()):
        mean = _exact_expectation(x, bits, monkeypatch)
        m, big = x.amin().double(), x.amax().double()
        step = (big - m) / _levels(bits)
        # Beyond Δ / 2**17: float32 rounding of σ (a few ulps of σ <= 2**16·L) and of m + q·Δ.
        slack = step * _levels(bits) * 2.0**-21 + 4 * torch.finfo(torch.float32).eps * x.abs().max()
        assert bool(((mean - x.double()).abs() <= step * 2.0**-17 + slack).all()), r


# --------------------------------------------------------------------------- bounds and clamping


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_reconstruction_within_row_range_and_one_step(bits: int, kernel_path: str):
    g = _gen(5)
    scale = torch.logspace(-6, 4, 64)[:, None]
    offset = torch.randn(64, 1, generator=g) * 1e3
    x = torch.randn(64, 45, generator=g) * scale + offset
    q = quantize(x, bits, keys=_keys(6, x))
    xhat = dequantize(q)
    lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    assert torch.equal(q.minimum, lo[:, 0]) and torch.equal(q.maximum, hi[:, 0])
    assert bool((xhat >= lo).all()) and bool((xhat <= hi).all())  # exact, no tolerance
    assert bool((unpack(q.packed, bits, 45) <= _levels(bits)).all())
    # Stochastic rounding picks one of the two neighbouring grid points: error <= one step.
    step = q.step[:, None].double()
    assert bool(((xhat.double() - x.double()).abs() <= step * (1 + 1e-5) + 1e-6 * hi.abs()).all())


def _scaled(x: torch.Tensor, m: torch.Tensor, big: torch.Tensor, bits: int) -> torch.Tensor:
    """σ as both paths compute it in float32: ``(x - m)·(2**16 / Δ)``, or ``(x - m) / Δ·2**16``
    where the reciprocal overflows."""
    step = (big - m) / torch.full_like(big, float(_levels(bits)))
    scale = torch.full_like(step, 2.0**16) / step
    return torch.where(torch.isfinite(scale), (x - m) * scale, (x - m) / step * 2.0**16)


def _overshooting_range(bits: int) -> tuple[float, float]:
    """(m, M) in float32 for which σ of M lands above 2**16·L."""
    levels = _levels(bits)
    m = torch.full((20000,), -0.75)
    big = m + torch.linspace(0.01, 7.0, 20000)
    hits = (_scaled(big, m, big, bits) > levels * 2**16).nonzero()
    assert hits.numel() > 0, "no float32 overshoot found; widen the search"
    i = hits[0, 0]
    return m[i].item(), big[i].item()


def _far_overshooting_range(bits: int) -> tuple[float, float]:
    """(0, M) with σ above 2**16·L by more than the half that rounding to an integer absorbs.

    A normal step puts σ at most an ulp above 2**16·L, which rint takes back to it below 8
    bits; a subnormal step (a range near 1e-43) is coarse enough to overshoot further.
    """
    levels = _levels(bits)
    big = torch.logspace(-44, -40, 4000, dtype=torch.float64).float()
    sigma = _scaled(big, torch.zeros_like(big), big, bits)
    hits = ((big / levels > 0) & (torch.round(sigma) > levels * 2**16)).nonzero()
    assert hits.numel() > 0, "no float32 overshoot found; widen the search"
    return 0.0, big[hits[0, 0]].item()


@pytest.mark.parametrize("path", ["single", "mixed"])
@pytest.mark.parametrize(
    ("bits", "scale"),
    [(4, "normal"), (8, "normal"), (2, "subnormal"), (4, "subnormal"), (8, "subnormal")],
)
def test_clamp_prevents_neighbour_corruption(
    bits: int, path: str, scale: str, monkeypatch: pytest.MonkeyPatch
):
    m, big = (_overshooting_range if scale == "normal" else _far_overshooting_range)(bits)
    # Alternate M (t > L after rounding) with m (code 0) so an L + 1 code at an M position
    # would set a bit of the neighbouring m code (2 and 4 bits) or wrap to 0 (8 bits).
    row = torch.tensor([big, m] * 8 + [big], dtype=torch.float32)
    x = row.repeat(4, 1)
    dim = x.shape[1]
    ends = (torch.full_like(x, m), torch.full_like(x, big))
    assert (_scaled(x, *ends, bits) > _levels(bits) * 2**16).any()  # precondition

    # u = 2**16 - 1 is a legal draw that rounds up whenever rint(σ) is not a multiple of 2**16:
    # the worst case, deterministic.
    calls = []

    def max_noise(keys, cols, device):
        calls.append(cols)
        return torch.full((len(keys), cols), 2**15 - 1, dtype=torch.int16, device=device)

    monkeypatch.setattr(R, "centred_lanes16", max_noise)
    if path == "single":
        q = quantize(x, bits, kernels="torch", keys=_keys(0, x))
    else:
        # The adversarial rows share the buffer with rows at other widths.
        one, other = [b for b in SUPPORTED_BITS if b != bits][:2]
        bits_r = torch.tensor([bits, one, bits, other, bits, bits], dtype=torch.int8)
        x = torch.cat([x[:1], torch.randn(1, dim), x[1:2], torch.randn(1, dim), x[2:]])
        buf = quantize_mixed(x, bits_r, kernels="torch", keys=_keys(0, x))
        group = _parse_mixed(buf, bits_r, dim)[bits]
        x = x[bits_r == bits]
        q = QuantizedRows(group.packed.clone(), group.minimum, group.maximum, bits, dim)
    monkeypatch.undo()
    assert calls, "quantization no longer draws through centred_lanes16; update this test"

    codes = unpack(q.packed, bits, dim)
    assert bool((codes <= _levels(bits)).all())
    assert bool((codes[:, 0::2] == _levels(bits)).all()) and bool((codes[:, 1::2] == 0).all())
    xhat = dequantize(q)
    assert bool((xhat[:, 1::2] == m).all())  # neighbours untouched
    top = min(m + _levels(bits) * q.step[0].item(), big)  # code L, as float32 reconstructs it
    assert torch.equal(xhat[:, 0::2], torch.full_like(xhat[:, 0::2], top))
    if scale == "normal":
        assert torch.allclose(xhat[:, 0::2], torch.full_like(xhat[:, 0::2], big), rtol=1e-6)


def test_clamp_under_real_noise(kernel_path: str):
    # Same adversarial rows with the real draws: ~1M elements with σ above 2**16·L would round
    # to 256 now and then without the clamp (wrapping to code 0).
    m, big = _overshooting_range(8)
    x = torch.tensor([big, m], dtype=torch.float32).repeat(8192, 64)
    xhat = dequantize(quantize(x, 8, keys=_keys(3, x)))
    assert bool((xhat[:, 1::2] == m).all())
    assert torch.allclose(xhat[:, 0::2], torch.full_like(xhat[:, 0::2], big), rtol=1e-6, atol=0)


# --------------------------------------------------------------------------- one bit


def _one_bit_rows() -> torch.Tensor:
    """[6, 24] rows incl. one where m + fl(M - m) rounds away from M (M - m is not exact)."""
    rows = _test_rows()[:, :16]
    rows = torch.cat([rows, torch.randn(1, 16, generator=_gen(3))])
    extreme = torch.cat([torch.tensor([-3.0, 1e-8]), torch.linspace(-2.9, 0.0, 14)])
    x = torch.cat([rows, extreme[None]])
    return torch.cat([x, x[:, :8] * 0.5], dim=1)


def test_one_bit_values_are_row_extremes(kernel_path: str):
    x = _one_bit_rows()
    m, big = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    assert bool(((m + (big - m)) != big).any())  # precondition: m + 1·Δ misses M somewhere
    xhat = dequantize(quantize(x.repeat(50, 1), 1, keys=_keys(9, x.repeat(50, 1)))).view(
        50, *x.shape
    )
    assert bool(((xhat == m) | (xhat == big)).all())
    assert bool((xhat == big).any()) and bool((xhat == m).any())
    bits_r = torch.ones(x.shape[0], dtype=torch.int8)
    xhat = dequantize_mixed(quantize_mixed(x, bits_r, keys=_keys(9, x)), bits_r, x.shape[1])
    assert bool(((xhat == m) | (xhat == big)).all())


def test_one_bit_unbiased(kernel_path: str):
    # Each value becomes M with probability p = (x - m) / (M - m), else m: mean x and variance
    # (M - m)² p (1 - p). The mean of n draws must sit within 5 standard errors of x.
    x = _one_bit_rows()
    n = 4000
    xhat = (
        dequantize(quantize(x.repeat(n, 1), 1, keys=_keys(10, x.repeat(n, 1))))
        .view(n, *x.shape)
        .double()
    )
    x64 = x.double()
    m, big = x64.amin(1, keepdim=True), x64.amax(1, keepdim=True)
    p = (x64 - m) / (big - m)
    se = (big - m) * torch.sqrt(p * (1 - p) / n)
    # The 16-bit draw can shift p by 2**-17, float32 rounding of p by a few ulps.
    slack = (big - m) * (2.0**-17 + 1e-6)
    err = xhat.mean(0) - x64
    assert bool((err.abs() <= 5 * se + slack).all())
    assert err.sum().abs() <= 4 * torch.sqrt((se**2).sum()) + slack.sum()
    # The frequency of M is p, and the empirical variance matches the analytic one.
    freq = (xhat == big.float().double()).double().mean(0)
    assert bool(((freq - p).abs() <= 5 * torch.sqrt(p * (1 - p) / n) + 1e-6).all())
    var = xhat.var(0)
    analytic = (big - m) ** 2 * p * (1 - p)
    assert bool(((var - analytic).abs() <= 0.1 * (big - m) ** 2 / 4 + 1e-12).all())
    # The criterion has teeth: rounding to the nearest extreme is biased and fails it.
    nearest = torch.where(p >= 0.5, big, m)
    assert not bool(((nearest - x64).abs() <= 5 * se + slack).all())


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_constant_rows_exact(bits: int, kernel_path: str):
    x = torch.tensor([[3.5] * 9, [-2.0] * 9, [0.0] * 9, [1e-30] * 9])
    q = quantize(x, bits, keys=_keys(0, x))
    assert bool((q.packed == 0).all()) and bool((q.step == 0).all())
    assert torch.equal(dequantize(q), x)
    single_column = torch.randn(6, 1)
    assert torch.equal(
        dequantize(quantize(single_column, bits, keys=_keys(0, single_column))), single_column
    )
    mixed = torch.full((4,), bits, dtype=torch.int8)
    assert torch.equal(dequantize_mixed(quantize_mixed(x, mixed, keys=_keys(0, x)), mixed, 9), x)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_empty_inputs(bits: int, kernel_path: str):
    q = quantize(torch.empty(0, 7), bits)
    assert q.packed.shape == (0, packed_row_bytes(7, bits)) and q.nbytes == 0
    assert dequantize(q).shape == (0, 7)
    q = quantize(torch.empty(3, 0), bits)
    assert q.packed.shape == (3, 0) and q.nbytes == 24
    assert dequantize(q).shape == (3, 0)
    none = torch.empty(0, dtype=torch.int8)
    buf = quantize_mixed(torch.empty(0, 5), none)
    assert buf.numel() == 0 == mixed_buffer_bytes(none, 5)
    assert dequantize_mixed(buf, none, 5).shape == (0, 5)
    three = torch.tensor([1, 8, 2], dtype=torch.int8)
    buf = quantize_mixed(torch.empty(3, 0), three)
    assert buf.numel() == 24 == mixed_buffer_bytes(three, 0)
    assert dequantize_mixed(buf, three, 0).shape == (3, 0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rejected(bad: float, kernel_path: str):
    x = torch.randn(4, 5)
    x[2, 3] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize(x, 4)
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_mixed(x, torch.full((4,), 2, dtype=torch.int8))


def test_out_of_float32_range_rejected(kernel_path: str):
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize(torch.tensor([[0.0, 1e300]], dtype=torch.float64), 8)  # inf in float32
    with pytest.raises(ValueError, match="overflows float32"):
        quantize(torch.tensor([[-3e38, 3e38]]), 1)


@pytest.mark.parametrize("bits", [0, 3, 5, 16, 32])
def test_bad_bits_rejected(bits: int, kernel_path: str):
    with pytest.raises(ValueError, match="unsupported bit width"):
        quantize(torch.randn(2, 3), bits)
    with pytest.raises(ValueError, match="unsupported bit width"):
        packed_row_bytes(3, bits)
    with pytest.raises(ValueError, match="unsupported bit width"):
        pack(torch.zeros(2, 3, dtype=torch.uint8), bits)
    bits_r = torch.tensor([2, bits], dtype=torch.int8)
    with pytest.raises(ValueError, match="unsupported widths"):
        quantize_mixed(torch.randn(2, 3), bits_r)
    with pytest.raises(ValueError, match="unsupported widths"):
        mixed_buffer_bytes(bits_r, 3)


def test_bad_shapes_rejected(kernel_path: str):
    with pytest.raises(ValueError):
        quantize(torch.randn(5), 2)
    with pytest.raises(ValueError):
        quantize(torch.arange(6).view(2, 3), 2)
    with pytest.raises(ValueError):
        dequantize(quantize(torch.randn(2, 3), 2), out=torch.empty(3, 2))
    with pytest.raises(ValueError):
        quantize_mixed(torch.randn(2, 3), torch.tensor([2, 2, 2], dtype=torch.int8))
    with pytest.raises(ValueError):
        unpack(torch.zeros(2, 4, dtype=torch.uint8), 2, 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_input_dtypes(dtype: torch.dtype, kernel_path: str):
    x = torch.randn(8, 20, generator=_gen(2)).to(dtype)
    q = quantize(x, 8, keys=_keys(0, x))
    assert q.minimum.dtype == torch.float32 and q.maximum.dtype == torch.float32
    xhat = dequantize(q)
    assert xhat.dtype == torch.float32
    x32 = x.float()
    assert bool(((xhat - x32).abs() <= q.step[:, None] * (1 + 1e-5)).all())


def test_seeded_determinism(kernel_path: str):
    x = torch.randn(50, 33, generator=_gen(8))
    for bits in SUPPORTED_BITS:
        a, b = quantize(x, bits, keys=_keys(42, x)), quantize(x, bits, keys=_keys(42, x))
        assert torch.equal(a.packed, b.packed)
        assert torch.equal(a.minimum, b.minimum) and torch.equal(a.maximum, b.maximum)
        assert not torch.equal(a.packed, quantize(x, bits, keys=_keys(43, x)).packed)
    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8).repeat(13)[:50]
    assert torch.equal(
        quantize_mixed(x, bits_r, keys=_keys(1, x)), quantize_mixed(x, bits_r, keys=_keys(1, x))
    )


def test_dequantize_into_out_slice(kernel_path: str):
    x = torch.randn(6, 10, generator=_gen(4))
    q = quantize(x, 4, keys=_keys(0, x))
    halo = torch.full((10, 10), -7.0)
    result = dequantize(q, out=halo[2:8])
    assert result.data_ptr() == halo[2:8].data_ptr()
    assert torch.equal(halo[2:8], dequantize(q))
    assert bool((halo[:2] == -7).all()) and bool((halo[8:] == -7).all())
