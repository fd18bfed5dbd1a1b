"""Staleness as the planner's choice (mode ``adaqp-s``): per exchange, fresh or stale.

Mode ``adaqp`` never uses stale rows; ``onebit`` always does. ``adaqp-s`` runs ``adaqp``
(planned widths, central/marginal overlap) and chooses per exchange key between

- *fresh*: the planner's widths, waited for as in ``adaqp``; and
- *stale*: the ``[staleness]`` section's rows (``bits`` wide, at most ``bound`` epochs
  late, smoothed), as in ``onebit``.

Epoch 1 runs every key as ``onebit`` does its first epoch: the stale rows' width,
waited for (nothing older exists), so that a key the first choice makes stale has read
no other rows than ``onebit``'s, and its moving average starts from them (where every
key goes stale, ``adaqp-s`` then trains exactly as ``onebit``). The first choice comes
after epoch 1, the later ones every ``staleness.choose_every`` epochs (on their own
cycle, not the planner's); the keys it leaves fresh use the planner's widths from epoch
2. A key goes stale when

- **it pays**: its fresh exchange held the ranks up (``comm_wait_by_tag``, the part of
  the exchange that overlap did not hide) for at least ``staleness.min_hidden_fraction``
  of the epoch, over the epochs since the last choice (at the first choice: epoch 1's
  wait at the stale width, which a wider fresh exchange would only lengthen). An
  exchange that lands inside its overlap window gains nothing from staleness and stays
  fresh;
- and, from the second choice on, **it is cheap**: the rows it sends moved by at most
  ``staleness.max_drift`` per epoch. The first choice goes on the wait alone: rows
  cannot be judged after one epoch, and a synchronous start before smoothed stale rows
  costs accuracy that stale rows from the start do not (docs/staleness.md).

A stale key stays stale: while it is stale its fresh wait is not observed (nor its drift
measured: where every key is stale an epoch costs what ``onebit``'s does), and a switch
back would restart its moving average, so a key near the limit would flip back and forth
(docs/staleness.md).

The drift compares the mean rows of the cycle's two halves, ``m_1`` and ``m_2``:
``|m_2 - m_1| / |m_2|`` (over all ranks' rows) divided by the epochs between their
centres, less the part that the epochs' own noise (dropout, quantization) adds,
estimated from the spread within each half: differences of single epochs would measure
that noise, which a stale row does not add to, not how far the rows move. The sums cover
at most ``DRIFT_ROWS`` rows per rank, evenly spaced (the same every epoch), so that
measuring costs little beside the exchange. Two halves of two epochs measure the drift
noisily: a choice pools the figures of every cycle so far, each earlier cycle weighted
by ``DRIFT_DECAY`` (about the last two cycles).

A fresh key's reads count in ``staleness_by_tag`` at age 0, as ``onebit``'s synchronous
reads do, so that ``effective_staleness`` means one thing in both modes: the mean age of
every training read (docs/staleness.md#what-a-run-reports).

The decision's inputs are reduced over the ranks (the epoch time too: each rank times
its own), and rank 0's decision is broadcast, so every rank switches the same keys at the
same epoch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from adaqp.config import StalenessConfig
from adaqp.exchange.adaptive import AdaptivePolicy
from adaqp.exchange.counters import EpochCounters
from adaqp.exchange.planner import BitWidthPlanner
from adaqp.exchange.policy import ExchangePolicy, Pending, substate
from adaqp.exchange.stale import StalePolicy
from adaqp.exchange.transport import ExchangeKey, HaloTransport, PendingExchange

logger = logging.getLogger(__name__)

DRIFT_ROWS = 1024
"""At most this many of an exchange's rows per rank enter its drift sums."""
DRIFT_DECAY = 0.5
"""Weight of the pooled drift figures against one more cycle's."""


def _no_sums() -> list[list]:
    """A key's cycle sums before any epoch: per half, [sum of the rows sent, epochs, sum of
    their squared norms]."""
    return [[None, 0, 0.0], [None, 0, 0.0]]


def drift_figures(halves: list[list], cycle: int) -> tuple[float, float, float]:
    """``(D, |m_2|², epochs)`` of one exchange over one cycle, summable over ranks.

    ``halves``: per half of the cycle, ``[sum of the rows sent, epochs, sum of their
    squared norms]``. ``m_1``, ``m_2`` are the halves' mean rows; ``D`` is an unbiased
    estimate of the squared distance between their expectations: ``|m_2 - m_1|²`` less
    what each half's own noise adds to it (its spread around its mean over its epochs,
    divided by their number); the size is ``|m_2|²`` less its noise likewise.
    ``epochs``: between the halves' centres. ``(-1, 0, 0)``
    where a half has fewer than 2 epochs (unknown).
    """
    if min(n for _, n, _ in halves) < 2 or halves[0][0].shape != halves[1][0].shape:
        return -1.0, 0.0, 0.0
    means, noise = [], []
    for total, n, squares in halves:
        mean = total.double() / n
        spread = max(0.0, squares - n * float(mean.pow(2).sum())) / (n - 1)
        means.append(mean)
        noise.append(spread / n)  # what the noise adds to |m|² (and to |m_2 - m_1|²)
    moved = max(0.0, float((means[1] - means[0]).pow(2).sum()) - sum(noise))
    size = max(0.0, float(means[1].pow(2).sum()) - noise[1])
    return moved, size, cycle / 2


def pooled(previous: list[float] | None, new: list[float]) -> list[float]:
    """The drift figures ``(D, |m_2|², epochs)`` pooled over cycles: ``D`` and the size are
    ``new``'s plus the earlier ones' weighted by ``DRIFT_DECAY`` (their ratio a weighted
    mean), the epochs between the halves' centres are ``new``'s (every cycle has the same
    length); an unknown cycle (``D < 0``) adds nothing."""
    if new[0] < 0:
        return previous or list(new)
    if previous is None or previous[0] < 0:
        return list(new)
    return [DRIFT_DECAY * previous[0] + new[0], DRIFT_DECAY * previous[1] + new[1], new[2]]


def choose(
    drift: dict[str, float],
    wait_s: dict[str, float],
    epoch_s: float,
    stale: set[str],
    config: StalenessConfig,
    first: bool = False,
) -> set[str]:
    """The keys to exchange stale: those already ``stale``, and those whose ``wait_s`` is
    at least ``min_hidden_fraction`` of ``epoch_s`` and whose ``drift`` is at most
    ``max_drift`` (the drift is not asked at the ``first`` choice)."""
    chosen = set(stale)
    for tag, moved in drift.items():
        pays = wait_s.get(tag, 0.0) >= config.min_hidden_fraction * epoch_s
        if pays and (first or moved <= config.max_drift):
            chosen.add(tag)
    return chosen


class ChoicePolicy(AdaptivePolicy):
    """``adaqp`` whose exchanges the planner may switch to stale low-bit rows one by one.

    Args:
        transport: this rank's halo transport.
        planner: the bit-width planner (widths of the fresh keys).
        config: the staleness section (the stale keys' rows, and the choice's thresholds).
        device: where buffered rows live.
        last_layer: index of the model's last layer.
    """

    counts_fresh_reads = True  # a fresh key's reads count at age 0, as onebit's synchronous ones

    def __init__(
        self,
        transport: HaloTransport,
        planner: BitWidthPlanner,
        config: StalenessConfig,
        device,
        last_layer: int,
    ):
        super().__init__(transport, planner)
        self.config = config
        self.stale = StalePolicy(transport, config, device, last_layer)
        self.staleness_bound = config.bound
        self.stale_keys: set[ExchangeKey] = set()
        # Per key: the last wait seen while fresh (seconds per epoch, mean over the cycle).
        self.fresh_wait_s: dict[str, float] = {}
        self._waits: dict[str, list[float]] = {}
        self._epoch_s: list[float] = []
        # Per key and half of the cycle (0, 1): [sum of the rows sent, epochs, sum of
        # their squared norms].
        self._sums: dict[ExchangeKey, list[list]] = {}
        # Per key: drift_figures summed over ranks, pooled over the cycles so far.
        self._pooled: dict[str, list[float]] = {}
        self.drift: dict[str, float] = {}
        """Per key: the relative drift per epoch measured at the last choice."""
        # Per fresh key: this epoch's exchange (its rows seed the buffer of a key that
        # turns stale).
        self._last_fresh: dict[ExchangeKey, PendingExchange] = {}

    def begin_epoch(self, epoch: int, counters: EpochCounters) -> None:
        super().begin_epoch(epoch, counters)
        self.stale.begin_epoch(epoch, counters)
        self._last_fresh = {}

    @contextmanager
    def training(self) -> Iterator[None]:
        with super().training(), self.stale.training():
            yield

    def waits(self, layer: int) -> bool:
        keys = (ExchangeKey.forward(layer), ExchangeKey.backward(layer))
        if not self._training or any(not self._is_stale(key) for key in keys):
            return True
        return self.stale.waits(layer)

    def _is_stale(self, key: ExchangeKey) -> bool:
        return key in self.stale_keys or self._epoch == 1  # epoch 1: onebit's

    def start(self, key: ExchangeKey, rows_RD: torch.Tensor, selected: bool = False) -> Pending:
        if not self._training:
            return self.transport.start(rows_RD, key, selected=selected)
        # A stale key stays stale: neither traced (a pass over its rows every epoch for a
        # solve whose plan it never uses) nor measured (the choice no longer asks its
        # drift). Where every key is stale, an epoch costs what ``onebit``'s does.
        if key in self.stale_keys:
            return self.stale.start(key, rows_RD, selected)
        self._measure_drift(key, rows_RD)
        if self._epoch == 1:  # onebit's first epoch, measured for the first choice
            return self.stale.start(key, rows_RD, selected)
        pending = ExchangePolicy.start(self, key, rows_RD, selected)  # traced in its launch
        self._last_fresh[key] = pending.handle
        return pending

    def _measure_drift(self, key: ExchangeKey, rows_RD: torch.Tensor) -> None:
        """Adds this epoch's rows (and their squared norm) to its half of the cycle's sums."""
        cycle = self.config.choose_every
        half = int((self._epoch - 1) % cycle >= cycle // 2)
        entry = self._sums.setdefault(key, _no_sums())[half]
        rows = rows_RD.detach()[:: max(1, -(-len(rows_RD) // DRIFT_ROWS))]
        # One gathering copy: the sum and the norm then stream through contiguous rows
        # instead of both reading the strided ones.
        rows = rows.clone(memory_format=torch.contiguous_format)
        entry[0] = rows if entry[0] is None else entry[0].add_(rows)
        entry[1] += 1
        entry[2] += float(torch.linalg.vector_norm(rows)) ** 2

    def end_epoch(
        self,
        epoch: int,
        exchange_s_by_tag: dict[str, float] | None = None,
        wait_s_by_tag: dict[str, float] | None = None,
        epoch_s: float = 0.0,
    ) -> float:
        for key in self._sums:
            tag = str(key)
            if key not in self.stale_keys:
                self._waits.setdefault(tag, []).append((wait_s_by_tag or {}).get(tag, 0.0))
        self._epoch_s.append(epoch_s)
        if epoch == 1 or epoch % self.config.choose_every == 0:
            self._choose(epoch)
        return super().end_epoch(epoch, exchange_s_by_tag, wait_s_by_tag, epoch_s)

    def _choose(self, epoch: int) -> None:
        """Re-decides every key from this cycle's waits and drifts (same on all ranks)."""
        # A stale key has no sums (unknown figures: its pooled drift stays as last measured).
        keys = sorted(set(self._sums) | self.stale_keys, key=str)
        # Per key: drift_figures' three figures, summed over ranks; then the epochs' seconds
        # and their count (each rank timed its own), and the key count.
        cycle = self.config.choose_every
        figures = torch.tensor(
            [x for k in keys for x in drift_figures(self._sums.get(k) or _no_sums(), cycle)]
            + [sum(self._epoch_s), float(len(self._epoch_s)), float(len(keys))],
            dtype=torch.float64,
            device=self.stale.device,  # NCCL takes no CPU tensors
        )
        dist.all_reduce(figures)
        figures = figures.cpu()
        world = self.planner.world
        if int(figures[-1]) != len(keys) * world.world_size:
            raise RuntimeError(f"rank {world.rank}: ranks exchanged different keys")
        self.drift = {}
        for i, key in enumerate(keys):
            tag = str(key)
            self._pooled[tag] = pooled(self._pooled.get(tag), figures[3 * i : 3 * i + 3].tolist())
            moved, size, epochs = self._pooled[tag]
            known = size > 0 and epochs > 0 and moved >= 0
            # Per epoch: the halves' means' relative change over the epochs between them
            # (epochs is summed over ranks like the rest).
            self.drift[tag] = (
                (moved / size) ** 0.5 * world.world_size / epochs if known else math.inf
            )
        for tag, waits in self._waits.items():
            self.fresh_wait_s[tag] = sum(waits) / len(waits)
        epoch_s = max(float(figures[-3]) / max(float(figures[-2]), 1.0), 1e-9)
        stale = {str(k) for k in self.stale_keys}
        tags = choose(self.drift, self.fresh_wait_s, epoch_s, stale, self.config, epoch == 1)
        # Rank 0's choice is every rank's: ranks that disagreed would send one exchange in
        # two formats.
        mask = torch.tensor(
            [str(key) in tags for key in keys], dtype=torch.uint8, device=self.stale.device
        )
        dist.broadcast(mask, src=0)
        chosen = {key for key, on in zip(keys, mask.tolist(), strict=True) if on}
        for key in chosen - self.stale_keys:
            # The next epoch reads this one's rows, as it would had the key been stale
            # already: a first stale epoch that waited for its own exchange would start
            # the moving average one epoch later (docs/staleness.md). (After epoch 1 the
            # stale rows are there already.)
            handle = self._last_fresh.get(key)
            if handle is not None:
                self.stale.seed(key, epoch, handle.wait().clone())
        if epoch == 1:
            for key in set(keys) - chosen:  # fresh from epoch 2: epoch 1's rows are done
                self.stale.forget(key)
        if world.is_main:
            logger.info(
                "epoch %d: stale exchanges %s (drift per epoch %s, fresh wait ms %s)",
                epoch,
                sorted(map(str, chosen)) or "none",
                {
                    t: round(d, 4) if math.isfinite(d) else "unmeasured"
                    for t, d in self.drift.items()
                },
                {t: round(1e3 * w, 1) for t, w in self.fresh_wait_s.items()},
            )
        self.stale_keys = chosen
        self.transport.at(f"epoch {epoch} staleness choice")
        self._waits, self._epoch_s, self._sums = {}, [], {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = super().state_dict()
        state.update({f"stale/{k}": v for k, v in self.stale.state_dict().items()})
        for key in self.stale_keys:
            state[f"choice/stale/{key}"] = torch.ones(1)
        for tag, seconds in self.fresh_wait_s.items():
            state[f"choice/wait/{tag}"] = torch.tensor([seconds], dtype=torch.float64)
        for tag, figures in self._pooled.items():
            state[f"choice/pooled/{tag}"] = torch.tensor(figures, dtype=torch.float64)
        for key, halves in self._sums.items():
            for half, (total, count, squares) in enumerate(halves):
                if count:
                    state[f"choice/sum{half}/{key}"] = total.cpu()
                    state[f"choice/count{half}/{key}"] = torch.tensor(
                        [count, squares], dtype=torch.float64
                    )
        for tag, waits in self._waits.items():
            state[f"choice/waits/{tag}"] = torch.tensor(waits, dtype=torch.float64)
        state["choice/epoch_s"] = torch.tensor(self._epoch_s, dtype=torch.float64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.stale.load_state_dict(substate(state, "stale/"))
        device = self.stale.device
        for name, value in state.items():
            parts = name.split("/", 2)
            if parts[0] != "choice" or len(parts) < 3:
                continue
            kind, rest = parts[1], parts[2]
            if kind == "stale":
                self.stale_keys.add(ExchangeKey.parse(rest))
            elif kind == "wait":
                self.fresh_wait_s[rest] = float(value[0])
            elif kind == "pooled":
                self._pooled[rest] = value.tolist()
            elif kind[:-1] in ("sum", "count"):
                entry = self._sums.setdefault(ExchangeKey.parse(rest), _no_sums())[int(kind[-1])]
                if kind.startswith("sum"):
                    entry[0] = value.to(device)
                else:
                    entry[1], entry[2] = int(value[0]), float(value[1])
            elif kind == "waits":
                self._waits[rest] = value.tolist()
        self._epoch_s = state.get("choice/epoch_s", torch.zeros(0)).tolist()

    def close(self) -> None:
        self.stale.close()
        super().close()

    def report(self, solved_at: int) -> dict:
        report = super().report(solved_at)
        report["stale_exchanges"] = sorted(str(k) for k in self.stale_keys)
        # JSON has no infinity: an exchange without a measurement is reported as None.
        report["drift_by_tag"] = {
            t: d if math.isfinite(d) else None for t, d in sorted(self.drift.items())
        }
        report["fresh_wait_s_by_tag"] = dict(sorted(self.fresh_wait_s.items()))
        return report
