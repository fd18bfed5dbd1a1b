"""Exchange policies: everything about a halo exchange except moving the rows.

The transport (``adaqp/comm.py``) moves rows for a key with a plan. A policy, owned by
the trainer, decides the rest: which plan a key gets, what is traced for the bit-width
assigner, whether a layer waits for a fresh exchange or takes a buffered one, and the
switch between training and evaluation (evaluation is always fresh and full precision).

=========================  ====================  ==========================================
policy                     modes                 training-time exchanges
=========================  ====================  ==========================================
``ExchangePolicy``         vanilla, adaqp-p,     float32, waited for
                           nocomm
``AdaptivePolicy``         adaqp-q, adaqp        planned widths (``BitWidthPlanner``), traced
``StalePolicy``            onebit                low-bit, bounded staleness
                                                 (``adaqp/staleness.py``)
=========================  ====================  ==========================================

Layers call ``pending = policy.start(key, rows)`` and later ``pending.wait()``. The
trainer calls ``begin_epoch(epoch, counters)``, runs the step inside ``with
policy.training():``, then ``end_epoch(epoch)``, and ``close()`` once at the end.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch

from adaqp.comm import BitPlan, ExchangeKey, HaloTransport, PendingExchange
from adaqp.metrics import EpochCounters
from adaqp.planner import BitWidthPlanner


class Pending(Protocol):
    """What ``ExchangePolicy.start`` returns: ``wait()`` gives the rows to use."""

    def wait(self) -> torch.Tensor: ...


class _Counted:
    """A fresh exchange whose landing is recorded in the epoch's counters."""

    __slots__ = ("_handle", "_counters")

    def __init__(self, handle: PendingExchange, counters: EpochCounters):
        self._handle = handle
        self._counters = counters

    def wait(self) -> torch.Tensor:
        first = not self._handle.waited
        rows = self._handle.wait()
        if first:
            self._counters.record_landing(self._handle, self._handle.wait_s)
        return rows


class ExchangePolicy:
    """Synchronous, full precision: every exchange is launched and waited for.

    Args:
        transport: this rank's halo transport.
    """

    max_staleness_bound = 0
    """The largest staleness this policy may use (for reducing its histograms)."""

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

    def start(self, key: ExchangeKey, rows_RD: torch.Tensor) -> Pending:
        """Launches the exchange of ``rows_RD`` (the rows to send, peer by peer)."""
        if not self._training:
            return self.transport.start(rows_RD, key)
        handle = self._launch(key, rows_RD)
        return _Counted(handle, self._counters)

    def _launch(self, key: ExchangeKey, rows_RD: torch.Tensor) -> PendingExchange:
        out_counts, in_counts = self.transport.counts(key)
        plan = self.plan(key, sum(out_counts), sum(in_counts), rows_RD.shape[1])
        handle = self.transport.start(rows_RD, key, plan)
        self._counters.record_launch(handle)
        return handle

    def end_epoch(self, epoch: int, exchange_s_by_tag: dict[str, float] | None = None) -> float:
        """After the step of ``epoch``: policy upkeep; returns the seconds it took.
        ``exchange_s_by_tag``: the epoch's measured exchange times (all ranks' view)."""
        return 0.0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What a resumed run needs to continue as this one would (for checkpoints)."""
        return {f"transport/{k}": v for k, v in self.transport.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        prefix = "transport/"
        self.transport.load_state_dict(
            {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        )

    def close(self) -> None:
        """Waits for every exchange still in flight (none here)."""

    def report(self, solved_at: int) -> dict:
        """Summary fields this policy adds (see ``metrics.Summary``) for the plans solved
        after epoch ``solved_at``; rank 0's are complete."""
        return {}


class AdaptivePolicy(ExchangePolicy):
    """Quantized training exchanges at the widths a ``BitWidthPlanner`` chooses.

    Args:
        transport: this rank's halo transport.
        planner: owns the plans, the traces and the re-solving.
    """

    def __init__(self, transport: HaloTransport, planner: BitWidthPlanner):
        super().__init__(transport)
        self.planner = planner

    def plan(self, key: ExchangeKey, out_rows: int, in_rows: int, dim: int) -> BitPlan:
        return self.planner.plan(key, out_rows, in_rows, dim)

    def start(self, key: ExchangeKey, rows_RD: torch.Tensor) -> Pending:
        if self._training and self.planner.tracing:
            self.planner.trace(key, rows_RD)
        return super().start(key, rows_RD)

    def end_epoch(self, epoch: int, exchange_s_by_tag: dict[str, float] | None = None) -> float:
        self.transport.at(f"epoch {epoch} bit-width assignment")
        return self.planner.end_epoch(epoch, exchange_s_by_tag)

    def report(self, solved_at: int) -> dict:
        planner = self.planner
        if planner.link_model is None:
            return {}  # uniform and random widths: no cost model, nothing planned by pair
        solution = planner.solutions.get(solved_at, {})
        return {
            "host_of_rank": planner.hosts.tolist(),
            "plan_bits_by_pair": solution.get("pair_bits", {}),
            "predicted_exchange_s_by_tag": dict(sorted(solution.get("predicted_s", {}).items())),
            "calibrated_exchange_s_by_tag": dict(sorted(solution.get("calibrated_s", {}).items())),
            "cost_calibration": dict(solution.get("calibration", {})),
            "fabric_Bps": _finite_or_none(planner.host_model.fabric_Bps)
            if planner.host_model is not None
            else None,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = super().state_dict()
        state.update({f"planner/{k}": v for k, v in self.planner.state_dict().items()})
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        prefix = "planner/"
        self.planner.load_state_dict(
            {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        )


def _finite_or_none(value: float) -> float | None:
    """JSON has no infinity: an unbounded rate is reported as None."""
    return value if math.isfinite(value) else None
