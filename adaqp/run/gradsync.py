"""Gradient all-reduce overlapped with the backward pass, one bucket per layer.

Every rank holds the whole model and computes gradients from its own part of the graph;
an optimiser step needs their per-element sum over ranks. ``GradientBuckets`` groups the
parameters into buckets (one per GNN layer: ``convs[l]`` plus ``norms[l]``) and launches
a bucket's asynchronous all-reduce as soon as the last of its gradients has been
accumulated, while autograd is still working on earlier layers, as DDP's buckets do::

    buckets = GradientBuckets(gnn_layer_groups(model), timeout_s=600)
    optimizer.zero_grad(set_to_none=True)
    buckets.start()                  # arms the hooks for this step
    loss.backward()                  # layer L-1's bucket goes out while L-2 runs ...
    times = buckets.finish()         # waits, writes the sums back into p.grad
    optimizer.step()

Collectives pair up across ranks by the order in which they are issued, so buckets are
always launched in one fixed order, the reverse of ``groups`` (the last layer first,
as backward reaches it first). A bucket that is complete early waits for the buckets
before it in that order; ``finish()`` launches whatever backward did not. A missing
gradient on one rank therefore costs overlap, never a mismatched collective. (A
parameter that never gets a gradient holds its bucket, and every bucket after it, back
to ``finish()``: put such parameters in group 0, which goes out last anyway.)

Parameters without a gradient: a parameter whose ``p.grad`` is None when its bucket
goes out contributes zeros, and a one-element flag per parameter travels in the same
buffer. After ``finish()``, a parameter that had a gradient on any rank holds the sum
(also on ranks where it had none); one that had a gradient on no rank keeps
``p.grad is None``, as single-process training would leave it. ``p.grad`` is read when
the bucket launches, so zero gradients with ``set_to_none=True`` for an unused parameter
to count as unused; a stale gradient from an earlier step would be summed.

Layout of one bucket's buffer (dtype and device of its parameters, K parameters)::

    | p_0.grad (numel_0) | p_1.grad (numel_1) | ... | p_{K-1}.grad | flag_0 ... flag_{K-1} |

where ``flag_k`` is 1 where this rank has a gradient for ``p_k``, else 0 (summed over
ranks, so nonzero means some rank had one).

``enabled=False`` keeps one flat blocking all-reduce of every bucket, launched in
``finish()`` (the behaviour before buckets, for comparison), with the same treatment of
missing gradients, so both give the same sums.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

logger = logging.getLogger(__name__)


class GradientSyncError(RuntimeError):
    """A gradient all-reduce failed or timed out; names the rank, the bucket and the step."""


@dataclass(frozen=True)
class AllReduceTimes:
    """What one step's gradient synchronisation cost."""

    blocked_s: float
    """Seconds spent inside ``finish()``: the all-reduce time the backward pass did not hide."""
    exchange_s: tuple[float, ...]
    """Per bucket (indexed like ``groups``; one entry when disabled): seconds from launch
    to completion as the host saw it. On a device backend completion can be reported when
    the work is queued, so these are only meaningful for host transports such as gloo."""
    num_buckets: int
    """Buckets all-reduced this step (1 when disabled)."""
    num_launched_early: int
    """Buckets launched during backward, before ``finish()`` (0 when disabled)."""


def gnn_layer_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """One group per GNN layer: ``convs[l]``'s parameters plus ``norms[l]``'s, if any.

    Trainable parameters outside ``convs`` and ``norms`` join group 0, which is launched
    last, so they are synchronised whenever backward reaches them.
    """
    convs, norms = model.convs, model.norms
    groups = []
    for layer, conv in enumerate(convs):
        params = list(conv.parameters())
        if layer < len(norms):
            params += list(norms[layer].parameters())
        groups.append([p for p in params if p.requires_grad])
    grouped = {id(p) for group in groups for p in group}
    groups[0] += [p for p in model.parameters() if p.requires_grad and id(p) not in grouped]
    return [group for group in groups if group]


class _Bucket:
    """One group's parameters, its per-step readiness and its in-flight all-reduce."""

    def __init__(self, index: int, params: list[nn.Parameter]):
        self.index = index
        self.params = params
        self.numels = [p.numel() for p in params]
        self.ready = [False] * len(params)
        self.num_pending = len(params)
        self.buffer: torch.Tensor | None = None
        self.had_grad: list[bool] = []
        self.work: dist.Work | None = None
        self.launched_at = 0.0
        # Written by the transport's thread when this launch completes: a fresh box per
        # launch, so a late callback cannot touch a later step's figures.
        self.done_at: list[float | None] = [None]
        self.exchange_s = 0.0

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.num_pending = len(self.params)
        self.buffer = self.work = None
        self.had_grad = []


class GradientBuckets:
    """Sums gradients over ranks bucket by bucket, overlapping backward.

    Args:
        groups: parameter groups in the order the forward pass uses them (group ``l`` is
            layer ``l``); each becomes one bucket, launched last group first. Every
            parameter requires grad, appears once, and all share one dtype and device.
        enabled: False: no hooks; ``finish()`` runs one flat blocking all-reduce.
        group: process group (default: the world).
        timeout_s: bound on every wait.

    Raises:
        ValueError: an empty group, a repeated parameter, one that does not require grad,
            or mixed dtypes or devices.
    """

    def __init__(
        self,
        groups: Sequence[Sequence[nn.Parameter]],
        enabled: bool = True,
        group: dist.ProcessGroup | None = None,
        timeout_s: float = 600.0,
    ):
        if not groups:
            raise ValueError("groups: need at least one parameter group")
        seen: set[int] = set()
        for g, params in enumerate(groups):
            if not params:
                raise ValueError(f"groups[{g}] is empty")
            for k, p in enumerate(params):
                if not p.requires_grad:
                    raise ValueError(f"groups[{g}][{k}] does not require grad")
                if id(p) in seen:
                    raise ValueError(f"groups[{g}][{k}] appears in more than one place")
                seen.add(id(p))
        first = groups[0][0]
        for g, params in enumerate(groups):
            for k, p in enumerate(params):
                if p.dtype != first.dtype or p.device != first.device:
                    raise ValueError(
                        f"groups[{g}][{k}] is {p.dtype} on {p.device}; every parameter "
                        f"must be {first.dtype} on {first.device}"
                    )
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.enabled = enabled
        self.group = group
        self.timeout_s = timeout_s
        self._buckets = [_Bucket(g, list(params)) for g, params in enumerate(groups)]
        # Launch order: the last group first, as backward reaches it first.
        self._order = list(reversed(self._buckets))
        self._next = 0  # position in _order of the next bucket to launch
        self._armed = False
        self._step = 0
        self._handles = []
        if enabled:
            for bucket in self._buckets:
                for k, p in enumerate(bucket.params):
                    self._handles.append(
                        p.register_post_accumulate_grad_hook(self._make_hook(bucket, k))
                    )

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    @property
    def num_launched(self) -> int:
        """Buckets launched so far in the current step (0 outside ``start``/``finish``)."""
        return self._next if self._armed else 0

    @property
    def armed(self) -> bool:
        """True between ``start()`` and ``finish()``."""
        return self._armed

    def start(self, step: int | None = None) -> None:
        """Arms the hooks for one backward pass. Raises if the last step did not finish.
        ``step``: the number errors give this step (the trainer passes its epoch); by
        default one more than the last."""
        if self._handles is None:
            raise RuntimeError("GradientBuckets.start() after remove()")
        if self._armed:
            raise RuntimeError(
                "GradientBuckets.start() called twice without finish(); "
                f"step {self._step} is still open"
            )
        for bucket in self._buckets:
            bucket.reset()
        if step is not None:
            self._step = step
        self._next = 0
        self._armed = True

    def finish(self) -> AllReduceTimes:
        """Waits for every bucket, writes the sums into ``p.grad``; returns the figures.

        Buckets that backward left incomplete (a parameter without a gradient on this
        rank) are launched here, in the fixed order. Raises ``GradientSyncError`` naming
        the rank and the bucket when an all-reduce fails or outlasts ``timeout_s``.
        """
        if not self._armed:
            raise RuntimeError("GradientBuckets.finish() without start()")
        entered = time.perf_counter()
        num_early = self._next if self.enabled else 0
        # Hooks are inert from here on; anything still missing is launched below.
        self._armed = False
        try:
            if self.enabled:
                while self._next < len(self._order):
                    self._launch(self._order[self._next])
                    self._next += 1
                self._complete(self._order)
                times = tuple(bucket.exchange_s for bucket in self._buckets)
            else:
                times = self._flat()
        finally:
            for bucket in self._buckets:
                bucket.reset()  # no collective handle may outlive the process group
            self._step += 1
        return AllReduceTimes(
            blocked_s=time.perf_counter() - entered,
            exchange_s=times,
            num_buckets=len(self._buckets) if self.enabled else 1,
            num_launched_early=num_early,
        )

    def remove(self) -> None:
        """Detaches the hooks; the object cannot be started again."""
        if self._armed:
            raise RuntimeError("GradientBuckets.remove() between start() and finish()")
        for handle in self._handles or []:
            handle.remove()
        self._handles = None

    def _make_hook(self, bucket: _Bucket, k: int):
        def hook(param: torch.Tensor) -> None:
            if not self._armed:
                return  # evaluation, or a backward outside start()/finish()
            if bucket.ready[k]:
                raise RuntimeError(
                    f"parameter {k} of gradient bucket {bucket.index} received a second "
                    f"gradient in step {self._step}; call backward once between start() "
                    "and finish()"
                )
            bucket.ready[k] = True
            bucket.num_pending -= 1
            # Launch in the fixed order only, so every rank issues the same sequence.
            while self._next < len(self._order) and self._order[self._next].num_pending == 0:
                self._launch(self._order[self._next])
                self._next += 1

        return hook

    def _launch(self, bucket: _Bucket) -> None:
        bucket.buffer, bucket.had_grad = self._flatten(bucket.params)
        bucket.launched_at = time.perf_counter()
        bucket.work = self._all_reduce(bucket.buffer, self._name(bucket))
        box: list[float | None] = [None]
        bucket.done_at = box

        def stamp(_future: torch.futures.Future) -> None:
            # Runs on the transport's thread when the work completes; must not raise.
            box[0] = time.perf_counter()

        bucket.work.get_future().then(stamp)

    def _complete(self, buckets: list[_Bucket]) -> None:
        """Waits for each bucket in launch order and copies its sums back."""
        for bucket in buckets:
            self._wait(bucket.work, self._name(bucket))
            waited = time.perf_counter()
            done = bucket.done_at[0]
            done = waited if done is None else min(done, waited)
            bucket.exchange_s = max(0.0, done - bucket.launched_at)
            self._unflatten(bucket.params, bucket.buffer, bucket.had_grad)

    def _name(self, bucket: _Bucket) -> str:
        return f"gradient bucket {bucket.index} of {len(self._buckets)}"

    def _flat(self) -> tuple[float]:
        params = [p for bucket in self._buckets for p in bucket.params]
        buffer, had_grad = self._flatten(params)
        launched = time.perf_counter()
        work = self._all_reduce(buffer, "flat gradient all-reduce")
        self._wait(work, "flat gradient all-reduce")
        exchange = time.perf_counter() - launched
        self._unflatten(params, buffer, had_grad)
        return (exchange,)

    @torch.no_grad()
    def _flatten(self, params: list[nn.Parameter]) -> tuple[torch.Tensor, list[bool]]:
        """The bucket buffer (see the module docstring) and which params had gradients."""
        numel = sum(p.numel() for p in params)
        first = params[0]
        buffer = torch.empty(numel + len(params), dtype=first.dtype, device=first.device)
        had_grad = [p.grad is not None for p in params]
        offset = 0
        for p in params:
            chunk = buffer[offset : offset + p.numel()]
            if p.grad is None:
                chunk.zero_()
            else:
                chunk.copy_(p.grad.reshape(-1))
            offset += p.numel()
        buffer[numel:].copy_(torch.tensor(had_grad, dtype=buffer.dtype))
        return buffer, had_grad

    @torch.no_grad()
    def _unflatten(
        self, params: list[nn.Parameter], buffer: torch.Tensor, had_grad: list[bool]
    ) -> None:
        numel = len(buffer) - len(params)
        # Reading the flags is a host-device sync point; only needed when a gradient was
        # missing here, to tell "unused on every rank" from "used elsewhere".
        flags = buffer[numel:].tolist() if not all(had_grad) else None
        offset = 0
        for k, p in enumerate(params):
            chunk = buffer[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            if had_grad[k]:
                p.grad.copy_(chunk)
            elif flags[k] != 0:
                p.grad = chunk.clone()

    def _all_reduce(self, buffer: torch.Tensor, what: str) -> dist.Work:
        try:
            return dist.all_reduce(buffer, group=self.group, async_op=True)
        except Exception as exc:
            raise GradientSyncError(
                f"rank {_rank()}: launching {what} at step {self._step} failed: {exc}"
            ) from exc

    def _wait(self, work: dist.Work, what: str) -> None:
        try:
            work.wait(timeout=timedelta(seconds=self.timeout_s))
        except Exception as exc:  # gloo/nccl raise RuntimeError subclasses
            raise GradientSyncError(
                f"rank {_rank()}: {what} at step {self._step} failed "
                f"or timed out after {self.timeout_s:g}s (is a peer dead?): {exc}"
            ) from exc


def _rank() -> int | str:
    """This process's global rank for messages, or '?' outside a process group."""
    return dist.get_rank() if dist.is_initialized() else "?"
