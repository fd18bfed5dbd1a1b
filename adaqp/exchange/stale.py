"""Bounded-staleness exchange policy (mode ``onebit``; Sylvie, PipeGCN's pipeline).

Training exchanges are quantized to ``staleness.bits`` per value (one bit by default:
each value becomes its row's min or max, with the probability that keeps its mean; 32
sends float32). The exchange for key k at epoch t is launched as soon as its rows exist
and is not waited for. The layer then uses the newest *landed* buffer of k whose
exchange started at an epoch >= t - S; only if none of those has landed does it block,
on the oldest of them (collectives on one group complete in launch order, so that is the
shortest wait). With ``landing = "fixed"`` it always uses the oldest of them, the one
started at t - S (epoch 1's in the first S epochs), so that what a layer reads does not
depend on timing. The bound is 0 in the first ``warmup_epochs`` epochs and, with
``fresh_last_layer``, for the last layer's exchanges. S = 0 is synchronous low-bit
training, and with ``sync_every = K`` every K-th epoch waits for its own exchanges.
Gradients returned to owners follow the same rule.

With ``smoothing = g`` a layer reads, where its bound is above 0, the per-exchange moving
average ``g * avg + (1 - g) * rows`` of the buffers it chose (decoded straight into the
average where the compiled kernels run); a synchronous read restarts the average. Each
buffer enters the average once: when the chosen buffer is the one already blended (no
newer one within the bound has landed, or ``fixed`` reads epoch 1's again), the layer
reads the average unchanged. The chosen buffer only moves forward (older ones are dropped
once a newer one is chosen), so "already blended" is "the same as last time".

Per key::

    epoch:        t-S-1     t-S      ...      t-1       t
    buffers:      (gone)   [h, landed?]  ... [h, landed?] [h just launched]
                           '------- may be used at epoch t -------'

Recorded per key and read: the chosen buffer's age (t minus its start epoch; the bound
bounds it) and the *effective* age of what the layer reads, ``t - m`` with ``m`` the start
epochs of the buffers in the average under their weights (``m <- g * m + (1 - g) * s`` at
each blend, ``m = s`` at a restart and without smoothing). Reading a buffer s epochs old at
every epoch, ``t - m`` settles at ``s + g / (1 - g)`` (10 for s = 1, g = 0.9): the average's
memory, which the bound does not bound. Evaluation never uses buffers (fresh, full
precision).
"""

from __future__ import annotations

from collections import deque

import torch

from adaqp.config import StalenessConfig
from adaqp.exchange.policy import ExchangePolicy, Pending
from adaqp.exchange.transport import BitPlan, ExchangeKey, HaloTransport, PendingExchange
from adaqp.quant.mixed import blend_


class _Buffered:
    """The rows a stale exchange resolves to, chosen when they are needed."""

    __slots__ = ("_policy", "_key", "_epoch")

    def __init__(self, policy: StalePolicy, key: ExchangeKey, epoch: int):
        self._policy = policy
        self._key = key
        self._epoch = epoch

    def wait(self) -> torch.Tensor:
        return self._policy._resolve(self._key, self._epoch)


class _Landed:
    """Rows of an exchange that landed before a checkpoint, restored on resume."""

    __slots__ = ("_rows",)
    waited = True

    def __init__(self, rows: torch.Tensor):
        self._rows = rows

    def is_completed(self) -> bool:
        return True

    def wait(self) -> torch.Tensor:
        return self._rows

    def blend_into(self, average: torch.Tensor, weight: float) -> torch.Tensor:
        return blend_(average, self._rows, weight)

    def release(self) -> None:
        pass

    def release_if_landed(self) -> bool:
        return True


class StalePolicy(ExchangePolicy):
    """Low-bit training exchanges used up to ``config.bound`` epochs late.

    Args:
        transport: this rank's halo transport.
        config: the staleness section (bound, bits, sync_every).
    """

    def __init__(
        self, transport: HaloTransport, config: StalenessConfig, device, last_layer: int = -1
    ):
        super().__init__(transport)
        self.config = config
        self.device = device
        self.last_layer = last_layer
        self.staleness_bound = config.bound
        # Per key, with smoothing on: the moving average of what the layer received.
        self._averages: dict[ExchangeKey, torch.Tensor] = {}
        # Per key: (start epoch of the buffer read last, weighted mean start epoch of what
        # the layer reads); see the module's docstring.
        self._last_read: dict[ExchangeKey, tuple[int, float]] = {}
        self._plans: dict[ExchangeKey, BitPlan] = {}
        # Per key: (epoch started, handle), oldest first; at most bound + 1 entries.
        self._buffers: dict[ExchangeKey, deque[tuple[int, PendingExchange]]] = {}
        # Superseded exchanges not yet known to have landed: waited for before close.
        self._retired: list[PendingExchange] = []
        transport.warm_up()  # every training exchange is quantized: load the kernels now

    def staleness_bound_at(self, epoch: int, key: ExchangeKey) -> int:
        """The staleness allowed at ``epoch`` for ``key`` (0 on synchronous epochs, in
        the warm-up, and for the last layer when it is kept fresh)."""
        config = self.config
        every = config.sync_every
        if every and epoch % every == 0 or epoch <= config.warmup_epochs:
            return 0
        if config.fresh_last_layer and key.layer == self.last_layer:
            return 0
        return config.bound

    def waits(self, layer: int) -> bool:
        """False where both of ``layer``'s exchanges read an earlier epoch's buffer now
        (bound above 0 and one within it exists): nothing to overlap."""
        if not self._training:
            return True
        epoch = self._epoch
        for key in (ExchangeKey.forward(layer), ExchangeKey.backward(layer)):
            oldest = epoch - self.staleness_bound_at(epoch, key)
            if not any(oldest <= started < epoch for started, _ in self._buffers.get(key, ())):
                return True
        return False

    def plan(self, key: ExchangeKey, out_rows: int, in_rows: int, dim: int) -> BitPlan:
        plan = self._plans.get(key)
        if plan is None:
            plan = BitPlan.uniform(self.config.bits, out_rows, in_rows, self.device)
            self._plans[key] = plan
        return plan

    def start(self, key: ExchangeKey, rows_RD: torch.Tensor, selected: bool = False) -> Pending:
        if not self._training:
            return self.transport.start(rows_RD, key, selected=selected)
        handle = self._launch(key, rows_RD, selected=selected)
        self._buffers.setdefault(key, deque()).append((self._epoch, handle))
        return _Buffered(self, key, self._epoch)

    def _resolve(self, key: ExchangeKey, epoch: int) -> torch.Tensor:
        """Rows of the exchange of ``key`` that ``landing`` chooses within the bound at
        ``epoch``."""
        entries = self._buffers[key]
        bound = self.staleness_bound_at(epoch, key)
        oldest = epoch - bound
        while entries and entries[0][0] < oldest:
            self._retire(entries.popleft()[1])
        if not entries:  # cannot happen: this epoch's exchange was just launched
            raise RuntimeError(f"{key}: no exchange at or after epoch {oldest}")
        if self.config.landing == "fixed":
            chosen = 0  # started exactly S epochs ago (or the first there is)
        else:
            landed = [i for i, (_, h) in enumerate(entries) if h.is_completed()]
            # Nothing within the bound has landed: block on the oldest (it lands first).
            chosen = landed[-1] if landed else 0
        started, handle = entries[chosen]
        first = not handle.waited
        blocked = not handle.is_completed()
        rows, mean_start = self._smoothed(key, started, handle, stale_allowed=bound > 0)
        if first:
            self._counters.record_landing(handle, handle.wait_s if blocked else 0.0)
        self._counters.record_staleness(str(key), epoch - started, epoch - mean_start)
        # Older buffers will never be chosen again: a newer one has landed.
        for _ in range(chosen):
            self._retire(entries.popleft()[1])
        self._retired = [h for h in self._retired if not h.release_if_landed()]
        return rows

    def _smoothed(
        self, key: ExchangeKey, started: int, handle: PendingExchange | _Landed, stale_allowed: bool
    ) -> tuple[torch.Tensor, float]:
        """The rows of ``handle`` (started at epoch ``started``), or with smoothing their
        moving average; and the weighted mean start epoch of what that is. The average
        starts at the first rows and restarts at every synchronous read, whose rows are
        used as they are (so that ``bound = 0`` is synchronous training whatever
        ``smoothing`` says). A buffer already in the average leaves it unchanged."""
        g = self.config.smoothing
        last = self._last_read.get(key)
        average = self._averages.get(key)
        if not g:
            rows, mean_start = handle.wait(), float(started)
        elif average is None or not stale_allowed:
            # In place where it exists: a fresh tensor of this size per exchange and epoch
            # costs more than the arithmetic (page faults); the layer used the old one.
            if average is None:
                average = handle.wait().clone()
            else:
                average.copy_(handle.wait())
            rows, mean_start = average, float(started)
        elif last is not None and last[0] == started:
            rows, mean_start = average, last[1]  # blended already: nothing new landed
        else:
            handle.blend_into(average, 1.0 - g)  # decoded straight into the average
            prior = last[1] if last is not None else float(started)
            rows, mean_start = average, g * prior + (1.0 - g) * started
        if g:
            self._averages[key] = average
        self._last_read[key] = (started, mean_start)
        return rows, mean_start

    def seed(self, key: ExchangeKey, epoch: int, rows: torch.Tensor) -> None:
        """Makes ``rows``, landed at ``epoch`` (a fresh exchange's), the buffer of ``key``
        that the next epoch may read: a key that turns stale reads last epoch's rows at
        once instead of waiting for its own."""
        self._buffers.setdefault(key, deque()).append((epoch, _Landed(rows)))

    def forget(self, key: ExchangeKey) -> None:
        """Drops the buffers and the moving average of ``key`` (an exchange that goes
        fresh): should it turn stale again, its average starts over."""
        for _, handle in self._buffers.pop(key, ()):
            self._retire(handle)
        self._averages.pop(key, None)
        self._last_read.pop(key, None)

    def _retire(self, handle: PendingExchange) -> None:
        if not handle.release_if_landed():
            self._retired.append(handle)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every usable buffer, waited for (all ranks checkpoint at the same epoch)."""
        state = super().state_dict()
        for key, entries in self._buffers.items():
            for started, handle in entries:
                state[f"buffer/{key}/{started}"] = handle.wait().cpu()
        for key, average in self._averages.items():
            state[f"average/{key}"] = average.cpu()
        for key, (started, mean_start) in self._last_read.items():
            state[f"read/{key}"] = torch.tensor([started, mean_start], dtype=torch.float64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        buffers: dict[ExchangeKey, list[tuple[int, _Landed]]] = {}
        for name, rows in state.items():
            kind, _, rest = name.partition("/")
            if kind == "buffer":
                key_name, _, started = rest.rpartition("/")
                entry = (int(started), _Landed(rows.to(self.device)))
                buffers.setdefault(ExchangeKey.parse(key_name), []).append(entry)
            elif kind == "average":
                self._averages[ExchangeKey.parse(rest)] = rows.to(self.device)
            elif kind == "read":
                self._last_read[ExchangeKey.parse(rest)] = (int(rows[0]), float(rows[1]))
        self._buffers = {key: deque(sorted(e, key=lambda x: x[0])) for key, e in buffers.items()}

    def close(self) -> None:
        """Waits for every exchange still in flight (no handle may outlive the group)."""
        for handle in self._retired:
            handle.release()
        for entries in self._buffers.values():
            for _, handle in entries:
                handle.release()
        self._retired = []
        self._buffers = {}
