"""The rows a layer's training exchanges move where a step computes only the rows its loss
reads (``adaqp/graph/loss_rows.py``): positions in the partition's send list and halo,
each peer's share counted, and a whole exchange's plan cut to them. The transport
(``HaloTransport.select``) holds one per layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from adaqp.exchange.message import BitPlan


@dataclass(frozen=True)
class Selection:
    """The rows one layer's training exchanges move."""

    send_keep: torch.Tensor
    """int64 [S_l]: positions in the send list."""
    halo_keep: torch.Tensor
    """int64 [H_l]: positions in the halo."""
    send_counts: list[int]
    """Forward rows sent to each peer."""
    recv_counts: list[int]
    """Halo rows received from each peer."""
    send_idx: torch.Tensor
    """int64 [S_l]: the input row each forward row is."""
    send_ids: np.ndarray | None
    """int64 [S_l]: the global ids of the forward rows sent (None: the row index)."""
    halo_ids: np.ndarray | None
    """int64 [H_l]: the global ids of the halo rows received."""
    _cuts: dict[tuple[int, bool], tuple[BitPlan, BitPlan]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(
        cls,
        send_keep: np.ndarray,
        halo_keep: np.ndarray,
        send_counts: list[int],
        recv_counts: list[int],
        send_idx: torch.Tensor,
        send_ids: np.ndarray | None,
        halo_ids: np.ndarray | None,
    ) -> Selection:
        """The selection of the ascending positions ``send_keep`` of a send list of
        ``send_counts`` rows per peer and ``halo_keep`` of a halo of ``recv_counts``."""
        device = send_idx.device
        return cls(
            send_keep=torch.from_numpy(send_keep).to(device),
            halo_keep=torch.from_numpy(halo_keep).to(device),
            send_counts=_per_peer(send_keep, send_counts),
            recv_counts=_per_peer(halo_keep, recv_counts),
            send_idx=send_idx,
            send_ids=None if send_ids is None else send_ids[send_keep],
            halo_ids=None if halo_ids is None else halo_ids[halo_keep],
        )

    def keep(self, sends_inner: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows sent, rows received): positions in the whole exchange of a direction that
        sends inner rows (forward) or not (backward)."""
        if sends_inner:
            return self.send_keep, self.halo_keep
        return self.halo_keep, self.send_keep

    def cut(self, plan: BitPlan, sends_inner: bool) -> BitPlan:
        """A whole exchange's ``plan`` cut to the rows that travel, every row at its width
        (cached while the plan is the same object)."""
        cached = self._cuts.get((id(plan), sends_inner))
        if cached is None or cached[0] is not plan:
            out_keep, in_keep = self.keep(sends_inner)
            cached = (plan, BitPlan(plan.out_bits[out_keep], plan.in_bits[in_keep]))
            self._cuts[(id(plan), sends_inner)] = cached
        return cached[1]

    def whole(self, sent_R: torch.Tensor, num_rows: int, sends_inner: bool) -> torch.Tensor:
        """Per-row values of the rows sent ``[R_l]`` placed in the whole exchange's
        ``[num_rows]`` (zeros for the rows that did not travel)."""
        whole = sent_R.new_zeros(num_rows)
        whole[self.keep(sends_inner)[0].to(whole.device)] = sent_R
        return whole


def _per_peer(keep: np.ndarray, counts: list[int]) -> list[int]:
    """How many of the ascending positions ``keep`` fall in each peer's segment of ``counts``."""
    bounds = np.cumsum([0, *counts])
    return np.diff(np.searchsorted(keep, bounds)).astype(int).tolist()
