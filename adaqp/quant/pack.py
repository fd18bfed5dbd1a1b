"""Bit packing of integer quantization codes, and the exact wire sizes that follow from it.

Codes are packed along the feature axis, ``8 // b`` codes per byte (``b`` in
:data:`~adaqp.quant.bits.SUPPORTED_BITS`, each of which divides 8, so codes never straddle
bytes), the first code of a byte in its least significant bits. Each row is padded to whole
bytes, so a packed row has :func:`packed_row_bytes` bytes and rows stay independently
addressable. A message of one
width adds its row metadata, float32 ``(m, M)``: 8 bytes a row (:func:`message_bytes`).

Pure tensor functions: they run unchanged on any device and allocate on the input's device.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from adaqp.quant.bits import SUPPORTED_BITS

METADATA_BYTES_PER_ROW = 8  # float32 minimum + float32 maximum


def check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bit width {bits!r}; expected one of {SUPPORTED_BITS}")


def packed_row_bytes(dim: int, bits: int) -> int:
    """Bytes of one packed row of ``dim`` codes at ``bits`` bits: ``ceil(dim * bits / 8)``."""
    check_bits(bits)
    if dim < 0:
        raise ValueError(f"dim must be non-negative, got {dim}")
    return (dim * bits + 7) // 8


def message_bytes(num_rows: int, dim: int, bits: int) -> int:
    """Exact wire size of ``num_rows`` rows at one width: packed payload + 8 metadata bytes/row."""
    if num_rows < 0:
        raise ValueError(f"num_rows must be non-negative, got {num_rows}")
    return num_rows * (packed_row_bytes(dim, bits) + METADATA_BYTES_PER_ROW)


def _check_codes(codes_RD: Tensor) -> None:
    if codes_RD.dim() != 2 or codes_RD.dtype != torch.uint8:
        raise ValueError(
            f"pack expects a 2-D uint8 tensor, got {tuple(codes_RD.shape)} {codes_RD.dtype}"
        )


def _pack_slots(codes_RD: Tensor, bits: int) -> Tensor:
    """:func:`pack` by strided column slices, for any byte order (the slower, plainer way)."""
    per_byte = 8 // bits
    # Code slot j of every byte is the strided column slice j::per_byte; slot 0 always has the
    # full byte count, later slots may be one short (the padded tail), so OR them into a prefix.
    packed = codes_RD[:, 0::per_byte].clone()
    for slot in range(1, per_byte):
        column = codes_RD[:, slot::per_byte]
        packed[:, : column.shape[1]] |= column << (slot * bits)
    return packed


def padded_dim(dim: int) -> int:
    """``dim`` rounded up to whole int64 words of 8 one-byte codes."""
    return -(-dim // 8) * 8


def pack_words_(codes_RW: Tensor, bits: int, out_RB: Tensor) -> Tensor:
    """Pack codes into ``out_RB``, using ``codes_RW`` as scratch (its contents are lost).

    Args:
        codes_RW: contiguous uint8 ``[R, W]`` codes, ``W`` a multiple of 8, zero past ``D``.
        bits: bit width, in :data:`SUPPORTED_BITS`.
        out_RB: uint8 ``[R, ceil(D * bits / 8)]`` to fill.
    """
    if bits == 8 or codes_RW.numel() == 0:
        return out_RB.copy_(codes_RW[:, : out_RB.shape[1]])
    if sys.byteorder != "little":
        return out_RB.copy_(_pack_slots(codes_RW, bits)[:, : out_RB.shape[1]])
    per_byte = 8 // bits
    # Code j of a word sits in byte lane j (little-endian). Step k ORs every lane with the lane
    # 2**k above it, shifted down to sit just above the 2**k codes the lane already holds; after
    # log2(per_byte) steps lane i·per_byte holds codes i·per_byte ... (i+1)·per_byte - 1 (other
    # lanes hold leftovers, never read). Bit 63 is 0 before every shift (codes are < 2**bits, and
    # a lane fills its top bit only at the last step), so the signed shift brings in zeros.
    words = codes_RW.view(torch.int64)
    shifted = torch.empty_like(words)
    shift = 8 - bits
    for _ in range(per_byte.bit_length() - 1):  # log2(per_byte) steps
        torch.bitwise_right_shift(words, shift, out=shifted)
        words.bitwise_or_(shifted)
        shift *= 2
    lanes = codes_RW.view(codes_RW.shape[0], -1, per_byte)[:, :, 0]
    return out_RB.copy_(lanes[:, : out_RB.shape[1]])


def pack(codes_RD: Tensor, bits: int) -> Tensor:
    """Pack integer codes along the feature axis, ``8 // bits`` codes per byte.

    Code ``j`` of a row lands in byte ``j // (8 // bits)`` at bit offset
    ``(j % (8 // bits)) * bits``; the tail of a row's last byte is zero padding.

    Args:
        codes_RD: uint8 ``[R, D]`` codes, each ``< 2**bits`` (not checked: larger codes would
            spill into their neighbours' bits).
        bits: bit width, in :data:`SUPPORTED_BITS`.

    Returns:
        uint8 ``[R, ceil(D * bits / 8)]``.
    """
    check_bits(bits)
    _check_codes(codes_RD)
    if bits == 8:
        return codes_RD.contiguous()
    rows, dim = codes_RD.shape
    packed = codes_RD.new_empty(rows, packed_row_bytes(dim, bits))
    if codes_RD.numel() == 0:
        return packed
    padded = codes_RD.new_zeros(rows, padded_dim(dim))  # packing works in place on a copy
    padded[:, :dim] = codes_RD
    return pack_words_(padded, bits, packed)


def unpack_table(bits: int, device: torch.device) -> Tensor:
    """``[256]`` words whose bytes are the ``8 // bits`` codes of each byte value, in order."""
    per_byte = 8 // bits
    values = torch.arange(256, dtype=torch.int32, device=device)
    shifts = torch.arange(0, 8, bits, dtype=torch.int32, device=device)
    codes = ((values[:, None] >> shifts) & ((1 << bits) - 1)).to(torch.uint8)
    # Viewing the bytes as one wider integer keeps their memory order on any byte order.
    word = {2: torch.int16, 4: torch.int32, 8: torch.int64}[per_byte]
    return codes.view(word).view(256)


def unpack(packed_RB: Tensor, bits: int, dim: int) -> Tensor:
    """Inverse of :func:`pack`.

    Args:
        packed_RB: uint8 ``[R, ceil(dim * bits / 8)]``.
        bits: bit width, in :data:`SUPPORTED_BITS`.
        dim: number of codes per row ``D``.

    Returns:
        uint8 ``[R, D]`` codes (a view into a padded buffer when ``D`` is not a whole number of
        bytes; it is not necessarily contiguous).
    """
    row_bytes = packed_row_bytes(dim, bits)
    if packed_RB.dim() != 2 or packed_RB.dtype != torch.uint8 or packed_RB.shape[1] != row_bytes:
        raise ValueError(
            f"unpack expects uint8 [R, {row_bytes}] for dim={dim}, bits={bits}; "
            f"got {tuple(packed_RB.shape)} {packed_RB.dtype}"
        )
    if bits == 8:
        return packed_RB
    return unpack_with(unpack_table(bits, packed_RB.device), packed_RB, bits, dim)


def unpack_with(table: Tensor, packed_RB: Tensor, bits: int, dim: int) -> Tensor:
    """:func:`unpack` for ``bits < 8`` with a table from :func:`unpack_table`."""
    # One table lookup per byte yields all of its codes at once, as one word of 8 // bits bytes.
    index = packed_RB.reshape(-1).to(torch.int32)
    words = torch.index_select(table, 0, index)
    row_codes = packed_RB.shape[1] * (8 // bits)
    return words.view(torch.uint8).view(packed_RB.shape[0], row_codes)[:, :dim]
