"""Tests for adaqp.exchange.message: one direction of a planned exchange as one buffer of
peer segments, encoded and decoded in one compiled call where no row is float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaqp.exchange import message
from adaqp.exchange.message import BitPlan, MessageLayout
from adaqp.quant import kernels as K
from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.draws import Draw, RowKeys, draw_key
from adaqp.quant.mixed import blend_
from adaqp.quant.pack import unpack
from adaqp.quant.segment import decode_segment, encode_segment
from tests.quant import draws_reference
from tests.quant.helpers import _gen

COUNTS = [5, 0, 7, 3]  # a peer with nothing to receive among them


def _widths(rows: int, seed: int) -> torch.Tensor:
    pick = torch.randint(len(SUPPORTED_BITS), (rows,), generator=_gen(seed))
    return torch.tensor(SUPPORTED_BITS, dtype=torch.int8)[pick]


def _segments(layout: MessageLayout, buf: torch.Tensor):
    """Per segment: (its first row, its rows, its bytes)."""
    first = 0
    for count, chunk in zip(layout.counts, torch.split(buf, layout.segment_bytes), strict=True):
        yield first, count, chunk
        first += count


@pytest.mark.parametrize("dim", [1, 8, 9, 67])
def test_one_call_writes_every_segment_as_a_message_of_its_own(dim: int):
    rows = sum(COUNTS)
    x = torch.randn(rows, dim, generator=_gen(1)) * 3
    layout = MessageLayout(_widths(rows, 2), COUNTS, dim)
    buf = torch.empty(sum(layout.segment_bytes), dtype=torch.uint8)
    keys = RowKeys.of(3, count=rows)
    message.encode(x, layout, buf, has_full=False, kernels="compiled", keys=keys)
    # One base key for the whole buffer; row r of it draws as row r of one message.
    codes = draws_reference.codes(x, layout.bits_R, np.uint64(3))
    decoded = message.decode(buf, layout, torch.empty(rows, dim), False, "compiled")
    for first, count, chunk in _segments(layout, buf):
        if count == 0:
            assert chunk.numel() == 0
            continue
        own = slice(first, first + count)
        bits_r = layout.bits_R[own]
        # The metadata: the segment's row minima, then maxima, in its first bytes.
        meta = chunk[: 8 * count].clone().view(torch.float32)
        assert torch.equal(meta[:count], x[own].min(1).values)
        assert torch.equal(meta[count:], x[own].max(1).values)
        # Each segment decodes on its own, on either path, to the rows the one call gives.
        for kernels in ("torch", "compiled"):
            alone = torch.empty(count, dim)
            decode_segment(chunk, bits_r, dim, alone, False, kernels)
            assert torch.equal(alone, decoded[own]), kernels
        # And its codes are the stated hash of (seed, row of the whole buffer, column).
        offset = 8 * count
        for bits in SUPPORTED_BITS:
            index = (bits_r == bits).nonzero().squeeze(1)
            if index.numel() == 0:
                continue
            width = -(-dim * bits // 8)
            packed = chunk[offset : offset + index.numel() * width].view(-1, width)
            offset += index.numel() * width
            got = unpack(packed, bits, dim).numpy()
            np.testing.assert_array_equal(got, codes[first + index.numpy()])


def test_one_call_blends_as_decode_then_blend_bit_for_bit():
    rows, dim = sum(COUNTS), 33
    layout = MessageLayout(torch.ones(rows, dtype=torch.int8), COUNTS, dim)
    buf = torch.empty(sum(layout.segment_bytes), dtype=torch.uint8)
    message.encode(torch.randn(rows, dim), layout, buf, False, "compiled")
    average = torch.randn(rows, dim, generator=_gen(5))
    expected = blend_(
        average.clone(), message.decode(buf, layout, torch.empty(rows, dim), False, "compiled"), 0.1
    )
    got = message.decode(buf, layout, average, False, "compiled", blend=0.1)
    assert got is average and torch.equal(got, expected)


def test_torch_path_and_float32_rows_encode_segment_by_segment():
    rows, dim = sum(COUNTS), 9
    x = torch.randn(rows, dim, generator=_gen(6))
    widths = _widths(rows, 7)
    widths[::3] = 32  # some rows at full precision: each segment on its own
    layout = MessageLayout(widths, COUNTS, dim)
    for kernels in ("torch", "compiled"):
        buf = torch.empty(sum(layout.segment_bytes), dtype=torch.uint8)
        keys = RowKeys.of(8, count=rows)
        message.encode(x, layout, buf, has_full=True, kernels=kernels, keys=keys)
        expected = torch.empty(sum(layout.segment_bytes), dtype=torch.uint8)
        for first, count, chunk in _segments(layout, expected):
            if count:
                own = slice(first, first + count)
                seg_keys = keys.take(own)
                encode_segment(x[own], widths[own], chunk, True, kernels, seg_keys)
        assert torch.equal(buf, expected), kernels
        decoded = message.decode(buf, layout, torch.empty(rows, dim), True, kernels)
        assert torch.equal(decoded[widths == 32], x[widths == 32]), kernels


def test_one_call_does_not_depend_on_the_thread_count():
    rows, dim = 600, 64  # 2**15 values and more take the prange kernels with 2 threads
    counts = [200, 100, 300]
    x = torch.randn(rows, dim, generator=_gen(9))
    layout = MessageLayout(_widths(rows, 10), counts, dim)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            buf = torch.empty(sum(layout.segment_bytes), dtype=torch.uint8)
            keys = RowKeys.of(11, count=rows)
            message.encode(x, layout, buf, False, "compiled", keys)
            results.append((buf, message.decode(buf, layout, torch.empty(rows, dim), False, None)))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_a_plan_computes_its_layouts_and_histogram_once():
    plan = BitPlan(_widths(15, 12), _widths(9, 13))
    sent, received = plan.layouts(8, [5, 10], [4, 5])
    assert plan.layouts(8, [5, 10], [4, 5]) == (sent, received)
    assert plan.byte_splits(8, [5, 10], [4, 5]) == (sent.segment_bytes, received.segment_bytes)
    histogram = plan.bits_histogram(8)
    assert sum(histogram.values()) == 15 * 8
    histogram.clear()  # a copy: the cached one stays
    assert sum(plan.bits_histogram(8).values()) == 15 * 8


def test_a_row_sent_to_several_peers_is_quantized_once_per_width():
    dim, counts = 19, [6, 6]
    sources = torch.tensor([0, 1, 2, 3, 4, 5, 3, 1, 0, 9, 2, 7])  # node 2: two widths
    widths = torch.tensor([1, 2, 4, 8, 1, 2, 8, 2, 1, 4, 2, 1], dtype=torch.int8)
    h = torch.randn(10, dim, generator=_gen(14))
    x = h.index_select(0, sources)
    layout = MessageLayout(widths, counts, dim, sources)
    buf = torch.empty(sum(layout.segment_bytes), dtype=torch.uint8)
    keys = RowKeys.of(15, count=12)
    message.encode(x, layout, buf, False, "compiled", keys)
    rows = message.decode(buf, layout, torch.empty(12, dim), False, "compiled")
    codes = draws_reference.codes(x, widths, np.uint64(15))
    offsets = layout.compiled.offsets
    repeats = {6: 3, 7: 1, 8: 0}  # row: the earlier row of the same node and width
    for r in range(12):
        first = repeats.get(r, r)
        size = -(-dim * int(widths[r]) // 8)
        own = buf[offsets[r] : offsets[r] + size]
        assert torch.equal(own, buf[offsets[first] : offsets[first] + size]), r
        got = unpack(own.view(1, -1), int(widths[r]), dim).numpy()[0]
        np.testing.assert_array_equal(got, codes[first])  # drawn as the first row
        assert torch.equal(rows[r], rows[first]), r
    # Node 2 at widths 4 and 2 (rows 2 and 10): each quantized on its own.
    assert not torch.equal(rows[2], rows[10])
    # Without sources every row draws its own codes.
    alone = torch.empty_like(buf)
    message.encode(x, MessageLayout(widths, counts, dim), alone, False, "compiled", keys)
    assert not torch.equal(alone, buf)


def test_a_buffer_or_rows_of_another_shape_are_refused_not_written_past():
    layout = MessageLayout(torch.ones(12, dtype=torch.int8), [6, 6], 16)
    size = sum(layout.segment_bytes)
    x = torch.randn(12, 16)
    with pytest.raises(ValueError, match=f"uint8 \\[{size}\\] buffer"):
        message.encode(x, layout, torch.empty(size - 1, dtype=torch.uint8), False, None)
    buf = torch.empty(size, dtype=torch.uint8)
    with pytest.raises(ValueError, match="float32 rows"):
        message.encode(torch.randn(11, 16), layout, buf, False, None)
    message.encode(x, layout, buf, False, None)
    with pytest.raises(ValueError, match="float32 rows"):
        message.decode(buf, layout, torch.empty(12, 15), False, None)


@pytest.mark.parametrize("kernels", ["compiled", "torch"])
@pytest.mark.parametrize("has_full", [False, True])
def test_a_nodes_row_is_rounded_alike_in_any_message(kernels: str, has_full: bool):
    """Keyed by global ids, a node's row gets the same codes whichever rank sends it to
    whichever peer: the same rows in another order and other segments (one call or one call
    a segment, float32 rows among them or not) decode to the same rows, node by node."""
    rows, dim = sum(COUNTS), 9
    ids = np.random.default_rng(2).choice(1000, rows, replace=False)
    x = torch.randn(rows, dim, generator=_gen(6))
    widths = _widths(rows, 7)
    if has_full:
        widths[::4] = 32
    keys = RowKeys.of(draw_key(0, 5, 1, Draw.FORWARD), ids)
    order = np.random.default_rng(3).permutation(rows)
    decoded = []
    for perm, counts in ((np.arange(rows), COUNTS), (order, [2, 9, 4])):
        layout = MessageLayout(widths[perm], counts, dim)
        buf = torch.empty(sum(layout.segment_bytes), dtype=torch.uint8)
        message.encode(x[perm], layout, buf, has_full, kernels, keys.take(perm))
        out = message.decode(buf, layout, torch.empty(rows, dim), has_full, kernels)
        decoded.append(torch.empty_like(out).index_copy_(0, torch.from_numpy(perm), out))
    assert torch.equal(decoded[0], decoded[1])
    assert not torch.equal(decoded[0], x)  # quantized: the comparison can fail


@pytest.mark.parametrize("dim", [1, 9, 67])
def test_the_one_call_hands_the_planner_its_trace_bit_for_bit(dim: int):
    """The quantizer takes every row's minimum and maximum anyway: from them the one call
    fills the rows' squared ranges, which the planner's trace would otherwise take in a
    pass of its own (``squared_ranges``), the same bits, repeated rows and a constant and
    negative row among them. Where rows go segment by segment it fills nothing."""
    sources = torch.tensor([0, 1, 2, 3, 4, 5, 3, 1, 0, 9, 2, 7, 6, 8, 1])  # repeats
    h = torch.randn(10, dim, generator=_gen(dim)) * 1e3
    h[6], h[8] = 2.5, -h[8].abs()
    x = h.index_select(0, sources)
    widths = _widths(len(sources), dim + 1)
    layout = MessageLayout(widths, COUNTS, dim, sources)
    buf = torch.empty(sum(layout.segment_bytes), dtype=torch.uint8)
    squared = torch.full((len(sources),), -1.0, dtype=torch.float64)
    keys = RowKeys.of(4, count=len(sources))
    assert message.encode(x, layout, buf, False, "compiled", keys, squared)
    reference = K.squared_ranges(x, "torch")
    torch.testing.assert_close(squared, reference, rtol=0, atol=0)
    assert squared[12] == 0  # the constant row
    # The buffer is the one it would be without the ranges.
    plain = torch.empty_like(buf)
    message.encode(x, layout, plain, False, "compiled", keys)
    assert torch.equal(plain, buf)
    # Float32 rows in the plan, or the torch path: segment by segment, nothing filled.
    untouched = torch.full_like(squared, -1.0)
    full = widths.clone()
    full[::4] = 32
    full_layout = MessageLayout(full, COUNTS, dim, sources)
    out = torch.empty(sum(full_layout.segment_bytes), dtype=torch.uint8)
    assert not message.encode(x, full_layout, out, True, "compiled", squared_out=untouched)
    assert not message.encode(x, layout, buf, False, "torch", squared_out=untouched)
    assert (untouched == -1).all()
