"""The training modes, and which of the exchange's sections each one reads.

One home for the lists of modes that other modules ask (``comm.mode`` is checked against
:data:`MODES`; the trainer picks its exchange policy by these lists; a checkpoint's
fingerprint covers the sections a mode reads, :func:`reads_quant`,
:func:`reads_staleness`).
"""

from __future__ import annotations

MODES = ("vanilla", "adaqp-q", "adaqp-p", "adaqp", "adaqp-s", "onebit", "nocomm")
"""Training modes: full precision and synchronous (vanilla), quantized messages (adaqp-q),
central/marginal overlap (adaqp-p), or both (adaqp); adaqp whose planner also chooses
per exchange between fresh rows and stale ones (adaqp-s); one-bit messages under bounded
staleness (onebit, see the staleness section). ``nocomm`` is benchmark-only: it skips the
halo exchange (halo rows are zeros) to measure the compute-only epoch time."""

QUANTIZED_MODES = ("adaqp-q", "adaqp", "adaqp-s")
"""Modes whose training messages travel at ``[quant]``'s widths, which the planner
chooses (uniform, or solved under the adaptive scheme): they read the whole ``[quant]``
section."""
OVERLAP_MODES = ("adaqp-p", "adaqp", "adaqp-s", "onebit")
"""Modes that may aggregate central rows while the exchange is in flight (``comm.overlap``)."""
STALE_MODES = ("onebit", "adaqp-s")
"""Modes that may use halo rows (and gradients) from earlier epochs: they read
``[staleness]``, and ``quant.seed`` for the stochastic rounding of their low-bit rows."""


def reads_quant(mode: str) -> bool:
    """Whether ``mode`` reads ``[quant]`` beyond its seed (the widths, the planner's
    settings): the quantized modes. Vanilla, adaqp-p and nocomm send float32 rows."""
    return mode in QUANTIZED_MODES


def reads_staleness(mode: str) -> bool:
    """Whether ``mode`` reads ``[staleness]`` (and ``quant.seed``): the stale modes."""
    return mode in STALE_MODES
