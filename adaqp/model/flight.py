"""The halo exchange inside a layer's autograd graph: the nodes that start it and land it,
and the transform whose weight gradients wait for the halo gradients to travel.

``Propagation`` (``adaqp/model/layers.py``) puts ``ExchangeStart`` before a layer's
local work and ``ExchangeLand`` after it; autograd, which runs the nodes recorded last
first, then sends the halo gradients (``ExchangeLand.backward``) before the local work's
gradients are made and waits for its own (``ExchangeStart.backward``) after them. Where
the layer's inner rows' product handed its input gradient to the flight
(``InFlight.hand_inner_grad``: the product, in any layer that exchanges), the landed
gradients are added into it where it is, with no second ``[I, D]`` tensor; elsewhere
(another linear aggregation) they come back as a sparse gradient of the rows sent (their
rows' ids and values), which autograd adds into the input's other gradients out of
place, as it did ``index_select``'s scattered rows.

Shapes: I inner rows, S rows sent to peers, H halo rows, D features, O output features.
"""

from __future__ import annotations

import torch
from torch import nn

from adaqp.exchange.policy import ExchangePolicy, Pending
from adaqp.exchange.transport import ExchangeKey


class InFlight:
    """The exchange between its two autograd nodes: the pending forward exchange, then
    the pending backward one."""

    def __init__(self, policy: ExchangePolicy, layer: int, selected: bool):
        self.policy = policy
        self.layer = layer
        self.selected = selected
        """Whether the layer computes only the rows its loss reads, and its exchanges move
        their halo rows (the transport's selection for the layer)."""
        self.pending: Pending | None = None
        self.num_params = 0
        """The transform's parameters whose gradients are deferred (weight, bias)."""
        self.deferred: tuple[torch.Tensor, torch.Tensor] | None = None
        """The transform's ``(input, output gradient)``, left by ``DeferredLinear``."""
        self.param_grads: tuple[torch.Tensor | None, ...] = ()
        self.inner_grad: torch.Tensor | None = None
        """The gradient of the rows sent from, made by the inner rows' product and handed
        here (``hand_inner_grad``) for ``ExchangeStart``'s backward to add the landed
        gradients into."""
        self.landed_back = False
        """``ExchangeStart``'s backward has run: a gradient handed later goes to autograd."""
        self.hold_launch = False
        """The exchange is not overlapped: ``ExchangeStart`` keeps the rows to send for
        :meth:`launch` (it starts after the local work), and ``ExchangeLand``'s backward
        waits for the halo gradients at once (they land before the local gradients)."""
        self._held: torch.Tensor | None = None

    def launch(self) -> None:
        """Starts the forward exchange whose rows ``ExchangeStart`` held (no-op otherwise)."""
        rows_SD, self._held = self._held, None
        if rows_SD is not None:
            key = ExchangeKey.forward(self.layer)
            self.pending = self.policy.start(key, rows_SD, self.selected)

    def hand_inner_grad(self, grad_ID: torch.Tensor) -> bool:
        """A :data:`~adaqp.graph.aggregate.GradHand`: keeps the inner rows' product's input
        gradient where the landed gradients are still to come (autograd runs that product's
        backward first: it was recorded after ``ExchangeStart``)."""
        if self.landed_back:
            return False
        self.inner_grad = grad_ID
        return True

    def settle_deferred(self) -> None:
        """The transform's weight (and bias) gradients from ``deferred``, into
        ``param_grads``; the ``[I, D]`` and ``[I, O]`` rows they came from are let go."""
        if self.deferred is None:  # no gradient reached the transform
            self.param_grads = (None,) * self.num_params
            return
        (x_ID, grad_IO), self.deferred = self.deferred, None
        grad_weight = grad_IO.t().mm(x_ID)
        bias = (grad_IO.sum(0),) if self.num_params == 2 else ()
        self.param_grads = (grad_weight, *bias)


class ExchangeStart(torch.autograd.Function):
    """Sends the rows ``send_idx`` of ``h_RD``; returns an empty ticket for ``ExchangeLand``.
    Its backward adds the landed gradients into the inner rows' gradient the layer handed
    it (``InFlight.hand_inner_grad``: the product's) and returns that;
    where none was handed it returns them as a sparse gradient of ``h_RD``, which autograd
    adds into the input's other gradients out of place."""

    @staticmethod
    def forward(ctx, h_RD: torch.Tensor, send_idx, flight: InFlight, *params) -> torch.Tensor:
        """``params``: the transform's weight (and bias) whose gradients are deferred."""
        ctx.flight, flight.num_params = flight, len(params)
        ctx.send_idx, ctx.shape = send_idx, h_RD.shape
        # Not kept here: the exchange holds the sent rows until they have left.
        flight._held = h_RD.detach().index_select(0, send_idx)
        if not flight.hold_launch:
            flight.launch()
        return h_RD.new_empty(0)

    @staticmethod
    def backward(ctx, _grad_ticket: torch.Tensor):
        # The halo gradients were sent by ExchangeLand.backward, and the transform's
        # weight gradients computed while they travel: the boundary's are collected.
        flight = ctx.flight
        grads, flight.param_grads = flight.param_grads, ()
        grad_SD, flight.pending = flight.pending.wait(), None
        flight.landed_back = True
        # A row sent to several peers appears once per peer: its landed gradients add up.
        inner, flight.inner_grad = flight.inner_grad, None
        if inner is not None:  # added where the inner rows' gradient is
            return inner.index_add_(0, ctx.send_idx, grad_SD), None, None, *grads
        grad_RD = torch.sparse_coo_tensor(
            ctx.send_idx.unsqueeze(0), grad_SD, ctx.shape, check_invariants=False
        )
        return grad_RD, None, None, *grads


class ExchangeLand(torch.autograd.Function):
    """Waits for the halo rows [H, D]; backward sends their gradients to the owners."""

    @staticmethod
    def forward(ctx, _ticket: torch.Tensor, flight: InFlight) -> torch.Tensor:
        ctx.flight = flight
        halo_HD, flight.pending = flight.pending.wait(), None
        # A new tensor object: the policy may hand out the same buffer again (stale rows
        # reused by a later epoch), and autograd marks what a node returns as its output.
        return halo_HD.view_as(halo_HD)

    @staticmethod
    def backward(ctx, grad_HD: torch.Tensor):
        flight = ctx.flight
        key = ExchangeKey.backward(flight.layer)
        flight.pending = flight.policy.start(key, grad_HD.contiguous(), flight.selected)
        # While they travel: the transform's weight gradients, first of the work autograd
        # runs before ExchangeStart.backward waits, so that its rows are let go before
        # the inner rows' gradients are made (and before the landed rows' buffer is).
        flight.settle_deferred()
        if flight.hold_launch:
            # Not overlapped: landed now, before the inner rows' gradient is made, so that
            # the rows sent are never beside it.
            flight.pending = _Landed(flight.pending.wait())
        return grad_HD.new_empty(0), None


class _Landed:
    """A backward exchange already waited for: ``ExchangeStart``'s backward collects it."""

    def __init__(self, rows: torch.Tensor):
        self._rows = rows

    def wait(self) -> torch.Tensor:
        return self._rows


class DeferredLinear(torch.autograd.Function):
    """``x @ weight.T + bias`` that returns only the input's gradient and leaves
    ``(x, grad)`` in ``flight.deferred``: ``ExchangeStart``'s backward computes the weight
    gradients from them while the layer's halo gradients travel. The weight and bias come
    in detached; ``ExchangeStart`` holds the parameters themselves."""

    @staticmethod
    def forward(ctx, x_ID, weight_OD, bias_O, flight: InFlight):
        ctx.save_for_backward(x_ID, weight_OD)
        ctx.flight = flight
        return nn.functional.linear(x_ID, weight_OD, bias_O)

    @staticmethod
    def backward(ctx, grad_IO: torch.Tensor):
        x_ID, weight_OD = ctx.saved_tensors
        ctx.flight.deferred = (x_ID, grad_IO)
        return grad_IO.mm(weight_OD), None, None, None
