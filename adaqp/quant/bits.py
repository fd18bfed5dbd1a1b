"""The bit widths a halo value can travel at: the one definition every package uses."""

SUPPORTED_BITS: tuple[int, ...] = (1, 2, 4, 8)
"""Quantized widths the wire format can carry."""

FULL_PRECISION_BITS = 32
"""float32: a row sent as it is, never quantized."""

BIT_WIDTHS: tuple[int, ...] = (*SUPPORTED_BITS, FULL_PRECISION_BITS)
"""Every width a value can travel at (32: float32)."""

DEFAULT_ALLOWED_BITS: tuple[int, ...] = (2, 4, 8)
"""The widths the bit-width solvers choose among unless told otherwise, and the adaptive
planner's for GAT (``planner_bits``)."""


def planner_bits(model: str) -> tuple[int, ...]:
    """The widths the adaptive planner chooses among where ``quant.allowed_bits`` is left
    empty: one bit too for GCN and SAGE, not for GAT, whose attention scores also read a
    row's error, which the planner's variance weights do not count (docs/gat.md)."""
    return DEFAULT_ALLOWED_BITS if model == "gat" else (1, *DEFAULT_ALLOWED_BITS)


def uniform_bits(model: str) -> int:
    """The width of every message where the scheme is uniform (the default) and
    ``quant.bits`` is left at 0: each model's best uniform width where it was measured
    (docs/bit-widths.md). 1 bit for GCN, first to Vanilla's accuracy on both benchmark
    clusters and no less accurate than 2 bits on them, Cora or CiteSeer; 2 for SAGE,
    whose accuracy at 1 bit trailed 2 bits' on every seed of the cluster workload (within
    the spread on Cora); 4 for GAT, where the solver's mixed widths (2.83 bits on average)
    lost 3.7 points on the cluster workload and uniform 4 bits kept Vanilla's accuracy on
    one seed (uniform 1 and 2 bits were not run there; on Cora every width is within 0.2
    points of Vanilla: docs/gat.md)."""
    return {"gcn": 1, "sage": 2, "gat": 4}[model]


def bits_text(avg_bits: float) -> str:
    """``32 bits``, ``1 bit``, ``2.35 bits``: a whole width without decimals."""
    text = f"{avg_bits:.0f}" if avg_bits == round(avg_bits) else f"{avg_bits:.2f}"
    return f"{text} bit{'' if text == '1' else 's'}"
