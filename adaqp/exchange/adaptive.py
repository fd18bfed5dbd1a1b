"""The adaptive exchange policy (modes ``adaqp-q`` and ``adaqp``): training exchanges at
the bit widths the planner beside it (``adaqp/exchange/planner.py``) chooses.

Kept apart from ``policy.py`` so that a layer, which needs only the ``ExchangePolicy``
interface, does not import the planner and the solver stack under it.
"""

from __future__ import annotations

import math

import torch

from adaqp.exchange.planner import BitWidthPlanner
from adaqp.exchange.policy import ExchangePolicy, substate
from adaqp.exchange.transport import BitPlan, ExchangeKey, HaloTransport, PendingExchange
from adaqp.quant.kernels import squared_ranges


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

    def _launch(
        self,
        key: ExchangeKey,
        rows_RD: torch.Tensor,
        ranges: bool = False,
        selected: bool = False,
    ) -> PendingExchange:
        """A training exchange, traced where the planner traces: from the rows' minima and
        maxima that the quantizer takes anyway where it can, else in a pass of its own."""
        traced = self.planner.tracing
        handle = super()._launch(key, rows_RD, ranges or traced, selected)
        if traced:
            squared = handle.squared_ranges
            selection = self.transport.selection(key, selected)
            if selection is not None:
                # Fewer rows travel than the plan covers: the others count as exact.
                if squared is None:
                    squared = squared_ranges(rows_RD, self.transport.kernels).cpu()
                rows = sum(self.transport.counts(key)[0])
                squared = selection.whole(squared, rows, key.direction.sends_inner)
            self.planner.trace(key, rows_RD, squared)
        return handle

    def end_epoch(
        self,
        epoch: int,
        exchange_s_by_tag: dict[str, float] | None = None,
        wait_s_by_tag: dict[str, float] | None = None,
        epoch_s: float = 0.0,
    ) -> float:
        self.transport.at(f"epoch {epoch} bit-width assignment")
        return self.planner.end_epoch(epoch, exchange_s_by_tag, wait_s_by_tag)

    def report(self, solved_at: int) -> dict:
        planner, kind = self.planner, self.planner.cost_kind
        solution = planner.solutions.get(solved_at, {})
        widths = {
            "host_of_rank": planner.hosts.tolist(),
            # The uniform scheme's first plans hold for the whole run.
            "plan_bits_by_pair": solution.get("pair_bits") or planner.first.pair_bits(),
        }
        if not kind.plans_by_pair:
            return widths  # no cost model: nothing predicted or calibrated
        return {
            **widths,
            "predicted_exchange_s_by_tag": dict(sorted(solution.get("predicted_s", {}).items())),
            "calibrated_exchange_s_by_tag": dict(sorted(solution.get("calibrated_s", {}).items())),
            "cost_calibration": dict(solution.get("calibration", {})),
            "fabric_Bps": _finite_or_none(planner.host_model.fabric_Bps)
            if kind.has_fabric_rate
            else None,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = super().state_dict()
        state.update({f"planner/{k}": v for k, v in self.planner.state_dict().items()})
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.planner.load_state_dict(substate(state, "planner/"))


def _finite_or_none(value: float) -> float | None:
    """JSON has no infinity: an unbounded rate is reported as None."""
    return value if math.isfinite(value) else None
