"""Tests for adaqp.quant.pack: bit packing of codes and exact wire sizes."""

from __future__ import annotations

import pytest
import torch

from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.mixed import mixed_buffer_bytes, quantize_mixed
from adaqp.quant.pack import _pack_slots, message_bytes, pack, packed_row_bytes, unpack
from adaqp.quant.rows import quantize
from tests.quant.helpers import DEVICES, _gen, _keys, _levels

# --------------------------------------------------------------------------- sizes and packing


def test_byte_counts_are_exact():
    assert [packed_row_bytes(9, b) for b in SUPPORTED_BITS] == [2, 3, 5, 9]
    assert [packed_row_bytes(0, b) for b in SUPPORTED_BITS] == [0, 0, 0, 0]
    assert packed_row_bytes(16, 1) == 2 and packed_row_bytes(17, 1) == 3
    assert message_bytes(10, 9, 2) == 10 * (3 + 8)
    assert message_bytes(0, 9, 2) == 0
    x = torch.randn(7, 33)
    for bits in SUPPORTED_BITS:
        q = quantize(x, bits, keys=_keys(0, x))
        actual = q.packed.numel() + q.minimum.numel() * 4 + q.maximum.numel() * 4
        assert q.packed.shape == (7, packed_row_bytes(33, bits))
        assert q.nbytes == message_bytes(7, 33, bits) == actual


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("dim", [1, 3, 7, 9, 33])
def test_pack_unpack_round_trip(device: str, bits: int, dim: int):
    g = _gen(dim * 10 + bits, device)
    codes = torch.randint(
        0, _levels(bits) + 1, (6, dim), generator=g, dtype=torch.uint8, device=device
    )
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (6, packed_row_bytes(dim, bits))
    assert torch.equal(unpack(packed, bits, dim), codes)
    # Rows are independently addressable: a row packs to the same bytes on its own.
    for r in (0, 5):
        assert torch.equal(pack(codes[r : r + 1], bits)[0], packed[r])


def test_pack_bit_order_and_padding():
    # First code in the least significant bits; the unused tail of the last byte is zero.
    codes = torch.tensor([[1, 2, 3, 0, 1]], dtype=torch.uint8)
    assert pack(codes, 2).tolist() == [[1 | 2 << 2 | 3 << 4 | 0 << 6, 1]]
    assert pack(torch.tensor([[1, 0, 1]], dtype=torch.uint8), 1).tolist() == [[0b101]]
    assert pack(torch.tensor([[0xA, 0x5, 0xF]], dtype=torch.uint8), 4).tolist() == [[0x5A, 0x0F]]


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("dim", [1, 8, 13, 64, 67])
def test_pack_matches_slot_packing(bits: int, dim: int):
    # The word-shift packer against the plain strided-slice one (kept for big-endian hosts).
    codes = torch.randint(0, 1 << bits, (5, dim), generator=_gen(dim + bits), dtype=torch.uint8)
    assert torch.equal(pack(codes, bits), _pack_slots(codes, bits))
    # pack works on a copy: the caller's codes are left as they were.
    before = codes.clone()
    pack(codes, bits)
    assert torch.equal(codes, before)


@pytest.mark.parametrize("dim", [1, 7, 8, 9, 64, 100])
def test_one_bit_pack_round_trip_and_bytes(dim: int):
    codes = torch.randint(0, 2, (11, dim), generator=_gen(dim), dtype=torch.uint8)
    packed = pack(codes, 1)
    assert packed.shape == (11, -(-dim // 8))
    assert torch.equal(unpack(packed, 1, dim), codes)
    # Code j is bit j % 8 of byte j // 8; the tail of the last byte is zero.
    weights = 2 ** torch.arange(8)
    expected = torch.nn.functional.pad(codes.long(), (0, 8 * packed.shape[1] - dim))
    assert torch.equal(packed.long(), (expected.view(11, -1, 8) * weights).sum(-1))
    # Exact wire size: ceil(D / 8) payload bytes + 8 metadata bytes per row, on every path.
    x = torch.randn(11, dim, generator=_gen(dim))
    q = quantize(x, 1, keys=_keys(1, x))
    per_row = -(-dim // 8) + 8
    assert q.packed.shape == (11, -(-dim // 8))
    assert q.nbytes == message_bytes(11, dim, 1) == 11 * per_row
    bits_r = torch.ones(11, dtype=torch.int8)
    assert (
        quantize_mixed(x, bits_r, keys=_keys(1, x)).numel()
        == mixed_buffer_bytes(bits_r, dim)
        == 11 * per_row
    )
