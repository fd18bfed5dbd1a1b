"""The bit widths a halo value can travel at: the one definition every package uses."""

SUPPORTED_BITS: tuple[int, ...] = (1, 2, 4, 8)
"""Quantized widths the wire format can carry."""

FULL_PRECISION_BITS = 32
"""float32: a row sent as it is, never quantized."""

BIT_WIDTHS: tuple[int, ...] = (*SUPPORTED_BITS, FULL_PRECISION_BITS)
"""Every width a value can travel at (32: float32)."""

DEFAULT_ALLOWED_BITS: tuple[int, ...] = (2, 4, 8)
"""The widths the adaptive planner chooses among unless ``quant.allowed_bits`` says otherwise."""
