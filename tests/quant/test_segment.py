"""Tests for adaqp.quant.segment: one peer's segment, quantized rows then float32 rows."""

from __future__ import annotations

import torch

from adaqp.quant.bits import FULL_PRECISION_BITS
from adaqp.quant.mixed import blend_, mixed_buffer_bytes
from adaqp.quant.segment import decode_segment, encode_segment, segment_bytes
from tests.quant.helpers import _gen, _keys


def test_segment_round_trip_on_each_path(kernel_path: str):
    x = torch.randn(9, 13, generator=_gen(0))
    bits_r = torch.tensor([32, 2, 8, 32, 1, 4, 4, 32, 2], dtype=torch.int8)
    full = bits_r == FULL_PRECISION_BITS
    size = segment_bytes(bits_r, 13)
    assert size == mixed_buffer_bytes(bits_r[~full], 13) + 3 * 13 * 4
    out = torch.zeros(size + 1, dtype=torch.uint8)[1:]  # at an odd offset
    encode_segment(x, bits_r, out, True, None, _keys(1, x))
    # Float32 rows close the segment as their bytes, in row order.
    assert torch.equal(out[-3 * 13 * 4 :], x[full].contiguous().view(torch.uint8).reshape(-1))
    got = torch.empty(9, 13)
    decode_segment(out, bits_r, 13, got, True, None)
    assert torch.equal(got[full], x[full])
    step = (x.amax(1) - x.amin(1)) / (2 ** bits_r.float().clamp(max=8) - 1)
    assert bool(((got - x).abs() <= step[:, None] * (1 + 1e-5)).all())
    # All rows at full precision, and none: the plain bytes, and the mixed layout alone.
    everything = torch.full((9,), 32, dtype=torch.int8)
    buf = torch.empty(segment_bytes(everything, 13), dtype=torch.uint8)
    encode_segment(x, everything, buf, True, None)
    decode_segment(buf, everything, 13, got, True, None)
    assert torch.equal(got, x)
    quantized = torch.full((9,), 2, dtype=torch.int8)
    buf = torch.empty(segment_bytes(quantized, 13), dtype=torch.uint8)
    encode_segment(x, quantized, buf, False, None, _keys(2, x))
    assert buf.numel() == mixed_buffer_bytes(quantized, 13)


def test_blending_a_segment_equals_decoding_then_blend(kernel_path: str):
    """``blend=w`` folds the decoded rows into ``out`` exactly as ``blend_`` does after a
    plain decode: mixed widths with float32 rows, quantized rows alone, and on both paths."""
    x = torch.randn(9, 13, generator=_gen(3))
    for bits_r, has_full in (
        (torch.tensor([32, 2, 8, 32, 1, 4, 4, 32, 2], dtype=torch.int8), True),
        (torch.tensor([1, 2, 8, 1, 1, 4, 4, 2, 2], dtype=torch.int8), False),
    ):
        buf = torch.empty(segment_bytes(bits_r, 13), dtype=torch.uint8)
        encode_segment(x, bits_r, buf, has_full, None, _keys(4, x))
        rows = torch.empty(9, 13)
        decode_segment(buf, bits_r, 13, rows, has_full, None)
        average = torch.randn(9, 13, generator=_gen(5))
        expected = blend_(average.clone(), rows, 0.1)
        decode_segment(buf, bits_r, 13, average, has_full, None, blend=0.1)
        assert torch.equal(average, expected)
        assert not torch.equal(expected, rows)  # the test can tell a blend from a decode
