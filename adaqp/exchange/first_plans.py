"""The plans a quantized run starts with, before anything is solved: which pairs send
float32 and which send the run's uniform width.

Under the uniform scheme these are the run's plans throughout; under the adaptive scheme
they run during the first cycle, while the traces are taken. ``quant.full_precision``
decides float32:

- ``auto`` (the default): by topology. Messages between ranks of one host (torchrun's
  node, else the hostname: :func:`~adaqp.assign.profile.host_of_rank`) travel as
  float32; messages between hosts at the width. No stopwatch takes part, so the same
  command gives the same numerics on any machine and under any load.
- ``never``: every message at the width.
- ``profile`` (with the host cost model): a start-up profile predicts, per exchange,
  whether float32 is no slower than the width (``first_width``), and the whole
  exchange goes as it predicts.

Widths are kept by pair, ``[P, P]`` (``widths[src, dst]``), and each rank's
:class:`~adaqp.exchange.message.BitPlan` is its row and column of them, expanded to the
messages of each peer (every message of the exchange: the transport cuts a plan to the
rows that travel). What is priced and reported counts only the messages that travel: a
layer whose training step computes only the rows its loss reads sends fewer
(``sent_counts``).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from adaqp.assign import HostModel, first_width
from adaqp.config import QuantConfig
from adaqp.exchange.message import BitPlan
from adaqp.exchange.transport import Direction, ExchangeKey
from adaqp.quant.bits import FULL_PRECISION_BITS, bits_text

logger = logging.getLogger(__name__)


class FirstPlans:
    """Each exchange's first widths by pair, and this rank's plans from them.

    Args:
        config: the quant section.
        hosts: int64 ``[P]``: the host of each rank.
        counts: per direction, int ``[P, P]``: messages src sends dst.
        rank: this rank.
        sent: per layer whose training exchanges move fewer messages than ``counts``
            (``HaloTransport.select``), the counts of those that travel, as ``counts``.
    """

    def __init__(
        self,
        config: QuantConfig,
        hosts: np.ndarray,
        counts: dict[Direction, np.ndarray],
        rank: int = 0,
        sent: dict[int, dict[Direction, np.ndarray]] | None = None,
    ):
        self.config = config
        self.hosts = hosts
        """int64 ``[P]``: the host of each rank."""
        self.counts = counts
        self.sent = sent or {}
        self.rank = rank
        self.local_pairs = (hosts[:, None] == hosts[None, :]) & ~np.eye(hosts.size, dtype=bool)
        """bool ``[P, P]``: pairs of distinct ranks on one host."""
        self.float32_local = config.full_precision == "auto"
        """Whether messages within a host travel as float32 in every plan, uniform or
        solved (``quant.full_precision = "auto"``)."""
        self.widths_by_key: dict[ExchangeKey, np.ndarray] = {}
        """Per exchange planned so far, int8 ``[P, P]``: its first widths."""

    @property
    def initial_bits(self) -> int:
        """The uniform width (the adaptive scheme's ``initial_bits`` where set)."""
        cfg = self.config
        return cfg.bits if cfg.scheme == "uniform" else cfg.initial_bits or cfg.bits

    def sent_counts(self, key: ExchangeKey) -> np.ndarray:
        """int ``[P, P]``: the messages src sends dst in a training exchange of ``key``."""
        return self.sent.get(key.layer, self.counts)[key.direction]

    def is_local(self, src: int, dst: int) -> bool:
        """Whether src's messages to dst are float32 by topology (never solved)."""
        return bool(self.float32_local and self.local_pairs[src, dst])

    def say(self) -> None:
        """One line: which messages travel as float32, and how to change that."""
        cfg, hosts = self.config, self.hosts
        if cfg.full_precision == "profile":
            return  # the profile's choice is logged where it is made
        p, num_hosts = hosts.size, int(hosts.max()) + 1
        where = (
            f"{p} worker{'s' * (p != 1)} on {num_hosts} host{'s' * (num_hosts != 1)} "
            f"{hosts.tolist()}"
        )
        planned = bits_text(cfg.bits) if cfg.scheme == "uniform" else "the planned widths"
        if self.float32_local:
            logger.info(
                "%s: messages within a host travel as float32, between hosts at %s "
                "(quant.full_precision=never quantizes every message; =profile lets a "
                "start-up profile choose float32 where it predicts it faster)",
                where,
                planned,
            )
        else:
            logger.info("%s: every message at %s (quant.full_precision=never)", where, planned)

    def widths(
        self, key: ExchangeKey, dim: int, profile: HostModel | None = None, say: bool = True
    ) -> np.ndarray:
        """int8 ``[P, P]``: the width of each pair's messages in ``key``'s first plan.

        The uniform width, with float32 within a host under ``"auto"``; with ``profile``
        (the host model of a ``"profile"`` run), float32 for the whole exchange where the
        model predicts that no slower for rows ``dim`` wide."""
        initial, p = self.initial_bits, self.hosts.size
        widths = np.full((p, p), initial, dtype=np.int8)
        if self.float32_local:
            widths[self.local_pairs] = FULL_PRECISION_BITS
        if profile is not None:
            width, times = first_width(profile, self.sent_counts(key), dim, initial)
            widths[:] = width
            if width != initial and say and self.rank == 0:
                logger.info(
                    "%s: full precision%s, the links being faster than quantizing (%.1f ms "
                    'predicted, %.1f ms at %d bits; quant.full_precision = "never" '
                    "quantizes regardless)",
                    key,
                    "" if self.config.scheme == "uniform" else " until the first re-solve",
                    1e3 * times[width],
                    1e3 * times[initial],
                    initial,
                )
        self.widths_by_key.setdefault(key, widths)
        return widths

    def plan(self, key: ExchangeKey, widths: np.ndarray, device) -> BitPlan:
        """This rank's side of ``widths``: each peer's messages at its pair's width."""
        counts, rank = self.counts[key.direction], self.rank
        return BitPlan(
            torch.from_numpy(np.repeat(widths[rank], counts[rank])).to(device),
            torch.from_numpy(np.repeat(widths[:, rank], counts[:, rank])).to(device),
        )

    def pair_bits(self) -> dict[str, float]:
        """``"src->dst"``: the mean width of the messages src sends dst in the first plans
        (every exchange planned so far, weighted by the messages that travel; pairs with
        none left out)."""
        sent = np.zeros((self.hosts.size,) * 2)
        bits = np.zeros_like(sent)
        for key, widths in self.widths_by_key.items():
            counts = self.sent_counts(key)
            sent += counts
            bits += counts * widths
        return {
            f"{src}->{dst}": float(bits[src, dst] / sent[src, dst])
            for src, dst in zip(*np.nonzero(sent), strict=True)
        }
