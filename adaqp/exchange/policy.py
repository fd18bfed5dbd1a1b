"""Exchange policies: everything about a halo exchange except moving the rows.

The transport (``adaqp/exchange/transport.py``) moves rows for a key with a plan. A policy, owned by
the trainer, decides the rest: which plan a key gets, what is traced for the bit-width
assigner, whether a layer waits for a fresh exchange or takes a buffered one, and the
switch between training and evaluation (evaluation is always fresh and full precision).

=========================  ====================  ==========================================
policy                     modes                 training-time exchanges
=========================  ====================  ==========================================
``ExchangePolicy``         vanilla, adaqp-p,     float32, waited for
                           nocomm
``AdaptivePolicy``         adaqp-q, adaqp        planned widths (``BitWidthPlanner``), traced
                                                 (``adaqp/exchange/adaptive.py``)
``ChoicePolicy``           adaqp-s               adaqp, or per key stale low-bit rows
                                                 (``adaqp/exchange/choice.py``)
``StalePolicy``            onebit                low-bit, bounded staleness
                                                 (``adaqp/exchange/stale.py``)
=========================  ====================  ==========================================

Layers call ``pending = policy.start(key, rows, selected)`` and later ``pending.wait()``
(``selected``: the layer computes only the rows its loss reads, and its exchange moves
their halo rows: ``HaloTransport.select``). The
trainer calls ``begin_epoch(epoch, counters)``, runs the step inside ``with
policy.training():``, then ``end_epoch(epoch)``, and ``close()`` once at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch

from adaqp.exchange.counters import EpochCounters
from adaqp.exchange.transport import BitPlan, ExchangeKey, HaloTransport, PendingExchange


def substate(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``state`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


class Pending(Protocol):
    """What ``ExchangePolicy.start`` returns: ``wait()`` gives the rows to use."""

    def wait(self) -> torch.Tensor: ...


class _Counted:
    """A fresh exchange whose landing is recorded in the epoch's counters, and with
    ``counts_read`` its read too, at age 0 (see ``ExchangePolicy.counts_fresh_reads``)."""

    __slots__ = ("_handle", "_counters", "_counts_read")

    def __init__(self, handle: PendingExchange, counters: EpochCounters, counts_read: bool):
        self._handle = handle
        self._counters = counters
        self._counts_read = counts_read

    @property
    def handle(self) -> PendingExchange:
        return self._handle

    def wait(self) -> torch.Tensor:
        first = not self._handle.waited
        rows = self._handle.wait()
        if first:
            self._counters.record_landing(self._handle, self._handle.wait_s)
            if self._counts_read:
                self._counters.record_staleness(str(self._handle.key), 0)
        return rows


class ExchangePolicy:
    """Synchronous, full precision: every exchange is launched and waited for.

    Args:
        transport: this rank's halo transport.
    """

    staleness_bound = 0
    """The largest staleness this policy may use (for reducing its histograms)."""
    counts_fresh_reads = False
    """Whether a fresh exchange's read counts in ``staleness_by_tag`` (at age 0). A policy
    that may read stale rows counts every training read, fresh ones included, so that
    ``effective_staleness`` is the mean age of everything its layers read, whichever mode
    read it (docs/staleness.md#what-a-run-reports); the others report no reads."""

    def __init__(self, transport: HaloTransport):
        self.transport = transport
        self._epoch = 0
        self._training = False
        self._counters = EpochCounters()

    def begin_epoch(self, epoch: int, counters: EpochCounters) -> None:
        """Training exchanges from now on belong to ``epoch`` and count into ``counters``."""
        self._epoch = epoch
        self._counters = counters
        self.transport.at(f"epoch {epoch}")

    def at(self, step: str) -> None:
        """Names the step that exchange errors quote (e.g. "epoch 3 evaluation")."""
        self.transport.at(step)

    @contextmanager
    def training(self) -> Iterator[None]:
        """Exchanges inside are training exchanges (planned, traced, maybe buffered)."""
        self._training = True
        try:
            yield
        finally:
            self._training = False

    def plan(self, key: ExchangeKey, out_rows: int, in_rows: int, dim: int) -> BitPlan | None:
        """The plan of a training exchange of ``dim``-wide rows; None sends float32."""
        return None

    def waits(self, layer: int) -> bool:
        """Whether an exchange of ``layer`` (forward or backward) may hold the layer up now.
        Only then is overlapping worth splitting the layer's rows into central and marginal
        (two smaller products and a concatenation each way)."""
        return True

    def start(self, key: ExchangeKey, rows_RD: torch.Tensor, selected: bool = False) -> Pending:
        """Launches the exchange of ``rows_RD`` (the rows to send, peer by peer; with
        ``selected``, those of the layer's selection)."""
        if not self._training:
            return self.transport.start(rows_RD, key, selected=selected)
        handle = self._launch(key, rows_RD, selected=selected)
        return _Counted(handle, self._counters, self.counts_fresh_reads)

    def _launch(
        self,
        key: ExchangeKey,
        rows_RD: torch.Tensor,
        ranges: bool = False,
        selected: bool = False,
    ) -> PendingExchange:
        """Starts a training exchange at its plan; ``ranges``: the handle carries the sent
        rows' squared ranges where the quantizer reads them (``HaloTransport.start``). The
        plan is the whole exchange's; the transport cuts it to the rows that travel."""
        out_counts, in_counts = self.transport.counts(key)
        plan = self.plan(key, sum(out_counts), sum(in_counts), rows_RD.shape[1])
        handle = self.transport.start(rows_RD, key, plan, ranges, selected=selected)
        self._counters.record_launch(handle)
        return handle

    def end_epoch(
        self,
        epoch: int,
        exchange_s_by_tag: dict[str, float] | None = None,
        wait_s_by_tag: dict[str, float] | None = None,
        epoch_s: float = 0.0,
    ) -> float:
        """After the step of ``epoch``: policy upkeep; returns the seconds it took.
        ``exchange_s_by_tag``: the epoch's measured exchange times, ``wait_s_by_tag`` the
        time they held the ranks up, ``epoch_s`` the step's time (all ranks' view)."""
        return 0.0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What a resumed run needs to continue as this one would (for checkpoints): nothing
        here. The transport has no state to save either: its rounding draws are keyed by
        (seed, epoch, exchange, node), not drawn from a generator (checkpoints from before
        that, which saved generators, are refused by their format version)."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restores what ``state_dict`` saved (nothing here)."""

    def close(self) -> None:
        """Waits for every exchange still in flight (none here)."""

    def report(self, solved_at: int) -> dict:
        """Summary fields this policy adds (see ``adaqp.run.summary.Summary``) for the plans solved
        after epoch ``solved_at``; rank 0's are complete."""
        return {}
