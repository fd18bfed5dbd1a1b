"""Tests for adaqp.quant.mixed: mixed-width buffers, their layout and the reference path."""

from __future__ import annotations

import pytest
import torch

from adaqp.quant import rows as R
from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.mixed import dequantize_mixed, mixed_buffer_bytes, quantize_mixed
from adaqp.quant.pack import message_bytes, packed_row_bytes
from adaqp.quant.rows import dequantize, quantize
from tests.quant.helpers import (
    DEVICES,
    _gen,
    _grid_fraction,
    _keys,
    _levels,
    _mean_error_ok,
    _on_grid_rows,
    _parse_mixed,
    _skip_compiled_off_cpu,
    _test_rows,
)

# --------------------------------------------------------------------------- mixed widths


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_round_trip_layout_and_order(device: str, kernel_path: str):
    _skip_compiled_off_cpu(kernel_path, device)
    rows, dim = 41, 37
    x = (torch.randn(rows, dim, generator=_gen(11)) * torch.logspace(-2, 2, rows)[:, None]).to(
        device
    )
    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8)[torch.randperm(rows) % 4].to(device)
    buf = quantize_mixed(x, bits_r, keys=_keys(12, x))
    expected_size = 8 * rows + sum(
        int((bits_r == b).sum()) * packed_row_bytes(dim, b) for b in SUPPORTED_BITS
    )
    assert buf.dtype == torch.uint8 and buf.numel() == mixed_buffer_bytes(bits_r, dim)
    assert buf.numel() == expected_size

    # Receive at an odd byte offset of a larger buffer, into a slice of a halo buffer.
    recv = torch.zeros(buf.numel() + 3, dtype=torch.uint8, device=device)
    recv[3:] = buf
    halo = torch.full((rows + 4, dim), -9.0, device=device)
    xhat = dequantize_mixed(recv[3:], bits_r, dim, out=halo[2 : rows + 2])
    assert bool((halo[:2] == -9).all()) and bool((halo[rows + 2 :] == -9).all())

    # Documented layout: each width's section decodes, via the single-width path, to the same
    # values that dequantize_mixed put at those rows' original positions.
    for bits, group in _parse_mixed(buf, bits_r, dim).items():
        idx = (bits_r == bits).nonzero().squeeze(1)
        assert torch.equal(group.minimum, x[idx].amin(1))
        assert torch.equal(group.maximum, x[idx].amax(1))
        assert torch.equal(dequantize(group), xhat[idx])

    # Every row within [m, M] and within one of its own steps of the input.
    step = (x.amax(1) - x.amin(1)) / (2 ** bits_r.float() - 1)
    assert bool((xhat >= x.amin(1, keepdim=True)).all() and (xhat <= x.amax(1, keepdim=True)).all())
    assert bool(((xhat - x).abs() <= step[:, None] * (1 + 1e-5)).all())


def test_mixed_exact_on_grid_matches_per_width(kernel_path: str):
    # Integer rows spanning [0, L_row] sit on their grid (step 1), so quantization is exact and
    # mixed and per-width paths must agree with the input bit for bit.
    bits_r = torch.tensor([8, 1, 4, 2, 2, 8, 1, 4], dtype=torch.int8)
    g = _gen(21)
    dim = 11
    x = torch.stack(
        [
            torch.cat(
                [
                    torch.tensor([0.0, float(_levels(b))]),
                    torch.randint(0, _levels(b) + 1, (dim - 2,), generator=g).float(),
                ]
            )
            for b in bits_r.tolist()
        ]
    )
    xhat = dequantize_mixed(quantize_mixed(x, bits_r, keys=_keys(0, x)), bits_r, dim)
    assert torch.equal(xhat, x)
    for bits in SUPPORTED_BITS:
        idx = (bits_r == bits).nonzero().squeeze(1)
        assert torch.equal(dequantize(quantize(x[idx], bits, keys=_keys(1, x[idx]))), x[idx])


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_mixed_uniform_width_matches_single_width(bits: int, kernel_path: str):
    # With one width the buffer is exactly [minimum | maximum | packed] of quantize() drawn from
    # the same generator state.
    x = torch.randn(9, 13, generator=_gen(31))
    bits_r = torch.full((9,), bits, dtype=torch.int8)
    q = quantize(x, bits, keys=_keys(5, x))
    expected = torch.cat(
        [q.minimum.view(torch.uint8), q.maximum.view(torch.uint8), q.packed.reshape(-1)]
    )
    send = torch.zeros(expected.numel() + 5, dtype=torch.uint8)
    buf = quantize_mixed(x, bits_r, out=send[5:], keys=_keys(5, x))
    assert buf.data_ptr() == send[5:].data_ptr()
    assert torch.equal(buf, expected) and bool((send[:5] == 0).all())


def test_mixed_unbiased(kernel_path: str):
    # Per-row levels in the mixed path: every width unbiased in the same buffer.
    x = _test_rows()[:4]
    bits_r = torch.tensor([1, 2, 4, 8], dtype=torch.int8)
    n = 2000
    xs, bs = x.repeat(n, 1), bits_r.repeat(n)
    xhat = dequantize_mixed(quantize_mixed(xs, bs, keys=_keys(77, xs)), bs, x.shape[1]).view(
        n, 4, -1
    )
    mean_err = (xhat.double() - x.double()).mean(0)
    for r, bits in enumerate(bits_r.tolist()):
        step, f = _grid_fraction(x[r : r + 1], bits)
        assert _mean_error_ok(mean_err[r : r + 1], step, f, n)


def test_mixed_size_matches_message_bytes():
    bits_r = torch.tensor([2] * 5 + [8] * 3, dtype=torch.int8)
    assert mixed_buffer_bytes(bits_r, 30) == message_bytes(5, 30, 2) + message_bytes(3, 30, 8)
    assert mixed_buffer_bytes(bits_r.long(), 30) == mixed_buffer_bytes(bits_r, 30)
    assert R.row_step(torch.tensor([1.0]), torch.tensor([4.0]), 3).item() == 1.0
    assert mixed_buffer_bytes(torch.tensor([1]), 9) == 8 + 2


# --------------------------------------------------------------------------- reference and blocks


def test_wire_format_matches_reference(kernel_path: str):
    # The frozen reference is torch operators: the compiled path's bytes are checked against it.
    from adaqp.bench.quant_reference import reference_dequantize_mixed, reference_quantize_mixed

    bits_r = torch.tensor(SUPPORTED_BITS, dtype=torch.int8)[
        torch.randperm(30, generator=_gen(4)) % 4
    ]
    dim = 19
    # On the grid no draw changes a code: both encoders must write the same bytes.
    x = _on_grid_rows(bits_r, dim, 5)
    new = quantize_mixed(x, bits_r, keys=_keys(0, x))
    assert torch.equal(new, reference_quantize_mixed(x, bits_r, _gen(0)))
    # Off the grid each code is floor(t) or floor(t) + 1 on both paths; each decoder reads
    # the other's buffers, and they agree on every row of width > 1 (one bit: exact m or M).
    x = torch.randn(30, dim, generator=_gen(6)) * torch.logspace(-2, 2, 30)[:, None]
    step = (x.amax(1) - x.amin(1)) / (2 ** bits_r.float() - 1)
    new = quantize_mixed(x, bits_r, keys=_keys(1, x))
    old = reference_quantize_mixed(x, bits_r, _gen(1))
    assert torch.equal(new[: 8 * 30], old[: 8 * 30])  # exact float32 metadata
    wide = bits_r > 1
    for buf in (new, old):
        ours = dequantize_mixed(buf, bits_r, dim)
        theirs = reference_dequantize_mixed(buf, bits_r, dim)
        assert torch.equal(ours[wide], theirs[wide])
        assert bool(((ours - theirs).abs() <= 1e-6 * x.abs().amax(1, keepdim=True)).all())
    gap = (dequantize_mixed(new, bits_r, dim) - dequantize_mixed(old, bits_r, dim)).abs()
    ulps = 4 * torch.finfo(torch.float32).eps * x.abs().amax(1, keepdim=True)
    assert bool((gap <= step[:, None] + ulps).all())


@pytest.mark.parametrize("block_values", [40, 100, 1000])
def test_blocks_split_rows_without_changing_layout(block_values: int, monkeypatch):
    # Small CPU blocks, so that blocks end inside runs of one width and rows of several widths
    # share a block; the buffer must not depend on the block size (on the grid, exactly). The
    # torch path's blocks: the compiled one works row by row.
    monkeypatch.setattr(R, "_CPU_BLOCK_VALUES", block_values)
    bits_r = torch.tensor([8, 1, 1, 4, 2, 2, 2, 8, 1, 4, 4, 2, 8, 8, 1], dtype=torch.int8)
    dim = 21
    x = _on_grid_rows(bits_r, dim, 7)
    buf = quantize_mixed(x, bits_r, kernels="torch", keys=_keys(0, x))
    assert torch.equal(dequantize_mixed(buf, bits_r, dim, kernels="torch"), x)
    monkeypatch.undo()
    assert torch.equal(buf, quantize_mixed(x, bits_r, kernels="torch", keys=_keys(0, x)))
    for bits in SUPPORTED_BITS:
        rows = x[bits_r == bits]
        assert torch.equal(dequantize(quantize(rows, bits, keys=_keys(1, rows))), rows)
