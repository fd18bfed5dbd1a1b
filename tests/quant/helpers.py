"""Helpers shared by the tests of adaqp.quant: generators and keys, test rows, statistical
criteria."""

from __future__ import annotations

import pytest
import torch

from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.draws import RowKeys
from adaqp.quant.pack import packed_row_bytes
from adaqp.quant.rows import QuantizedRows

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _skip_compiled_off_cpu(kernel_path: str, device: str) -> None:
    """The compiled kernels run on CPU tensors only (``kernel_path``: the fixture)."""
    if kernel_path == "compiled" and device != "cpu":
        pytest.skip("the compiled kernels run on CPU tensors")


def _gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _keys(seed: int, x: torch.Tensor) -> RowKeys:
    """Keys for the rows of ``x``: keyed by index under the base key ``seed`` (as a plain
    call's :func:`~adaqp.quant.draws.fresh_keys`, but named)."""
    return RowKeys.of(seed, count=x.shape[0])


def _levels(bits: int) -> int:
    return (1 << bits) - 1


def _test_rows(device: str = "cpu") -> torch.Tensor:
    """[5, 16] rows at assorted scales and offsets, incl. an offset where float32 rounding bites."""
    g = _gen(1234)
    base = torch.randn(5, 16, generator=g, dtype=torch.float64)
    scale = torch.tensor([1.0, 1e-3, 50.0, 0.3, 2.0], dtype=torch.float64)[:, None]
    offset = torch.tensor([0.0, 1.0, -20.0, 100.0, 0.5], dtype=torch.float64)[:, None]
    return (base * scale + offset).to(torch.float32).to(device)


def _grid_fraction(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 step [R] and fractional grid position f [R, D] of float32 rows x."""
    x64 = x.double()
    m = x.amin(1).double()
    step = ((x.amax(1) - x.amin(1)) / _levels(bits)).double()  # the float32 step, widened
    t = (x64 - m[:, None]) / step[:, None]
    return step, t - t.floor()


def _mean_error_ok(mean_err: torch.Tensor, step: torch.Tensor, f: torch.Tensor, n: int) -> bool:
    """Per element |mean error| <= 5 standard errors (+ float32 slack), and the pooled z < 4."""
    se = step[:, None] * torch.sqrt(f * (1 - f) / n)
    slack = 1e-5 * step[:, None] + 1e-6  # float32 rounding of t and of m + q*step
    per_element = bool((mean_err.abs() <= 5 * se + slack).all())
    pooled_se = torch.sqrt((se**2).sum())
    pooled = bool(mean_err.sum().abs() <= 4 * pooled_se + slack.sum())
    return per_element and pooled


def _parse_mixed(buf: torch.Tensor, bits_r: torch.Tensor, dim: int) -> dict[int, QuantizedRows]:
    """Split a mixed buffer by the documented layout into one QuantizedRows per width."""
    rows = bits_r.numel()
    minimum = buf[: 4 * rows].clone().view(torch.float32)
    maximum = buf[4 * rows : 8 * rows].clone().view(torch.float32)
    offset, groups = 8 * rows, {}
    for bits in SUPPORTED_BITS:
        idx = (bits_r == bits).nonzero().squeeze(1)
        size = idx.numel() * packed_row_bytes(dim, bits)
        packed = buf[offset : offset + size].view(idx.numel(), packed_row_bytes(dim, bits))
        groups[bits] = QuantizedRows(packed, minimum[idx], maximum[idx], bits, dim)
        offset += size
    assert offset == buf.numel()
    return groups


def _on_grid_rows(bits_r: torch.Tensor, dim: int, seed: int) -> torch.Tensor:
    """Integer rows spanning [0, L_row]: on their grid, so quantization is exact."""
    g = _gen(seed)
    rows = []
    for b in bits_r.tolist():
        inner = torch.randint(0, _levels(b) + 1, (dim - 2,), generator=g).float()
        rows.append(torch.cat([torch.tensor([0.0, float(_levels(b))]), inner]))
    return torch.stack(rows)
