"""The benchmark-only transport of mode ``nocomm``: the exchange skipped, so that an
epoch's time is its compute alone."""

from __future__ import annotations

import torch

from adaqp.exchange.message import BitPlan
from adaqp.exchange.transport import ExchangeKey, HaloTransport, PendingExchange


class NoCommTransport(HaloTransport):
    """Benchmark-only stand-in that skips the exchange: halo rows and gradients arrive as
    zeros at once, nothing is sent. Training with it is *not* the same model; its epoch
    time is the lower bound that a perfectly hidden exchange could reach."""

    def start(
        self,
        rows_RD: torch.Tensor,
        key: ExchangeKey,
        plan: BitPlan | None = None,
        ranges: bool = False,
        *,
        selected: bool = False,
    ) -> PendingExchange:
        _, in_counts = self.counts(key, self.selection(key, selected))
        recv = rows_RD.new_zeros((sum(in_counts), rows_RD.shape[1]))
        return PendingExchange(self, key, None, recv, bytes_sent=0, bits_histogram={})
