"""What a training step computes under ``train.compute_rows = "loss"``: the trainer's side
of ``adaqp/graph/loss_rows.py``. At start-up, before the transport is built, the inner rows
are put in ring order (``order_by_loss``); once it is, every layer gets its rows, its
exchanges their selections and a ``Propagation`` of its own (``training_propagation``).
Evaluation keeps the whole graph's ``Propagation``."""

from __future__ import annotations

import numpy as np
import torch

from adaqp.exchange.policy import ExchangePolicy
from adaqp.exchange.transport import SETUP_KEY, HaloTransport
from adaqp.graph.aggregate import SparseAdjacency
from adaqp.graph.local import LocalGraph
from adaqp.graph.loss_rows import (
    ExchangeFlags,
    LayerRows,
    layer_adjacency,
    layer_rows,
    order_by_ring,
    rings,
)
from adaqp.model.layers import LayerPropagations, Propagation


def flag_exchange(transport: HaloTransport | None, device: torch.device) -> ExchangeFlags:
    """Flags on the halo rows to their owners, over ``transport`` (None: one worker, no
    halo and nothing sent), as float32 rows on ``device``."""

    def exchange(halo_flags: np.ndarray) -> np.ndarray:
        if transport is None:
            return np.zeros(0, dtype=bool)
        rows = torch.from_numpy(halo_flags.astype(np.float32)).view(-1, 1).to(device)
        return transport.start(rows, SETUP_KEY).wait()[:, 0].cpu().numpy() > 0.5

    return exchange


def order_by_loss(graph: LocalGraph, num_layers: int, rank: int, distributed: bool) -> np.ndarray:
    """Reorders ``graph``'s inner rows by ring (in place) and returns the rings in the new
    order. Collective where ``distributed``."""
    setup = HaloTransport(rank, graph.send_counts, graph.recv_counts, device=graph.device)
    ring = rings(graph, num_layers, flag_exchange(setup if distributed else None, graph.device))
    order = order_by_ring(graph, ring)
    graph.reorder(order)
    return ring[order]


def training_propagation(
    graph: LocalGraph,
    ring: np.ndarray,
    adjacency: SparseAdjacency,
    transport: HaloTransport | None,
    policy: ExchangePolicy | None,
    num_layers: int,
    **options,
) -> tuple[LayerPropagations, list[LayerRows]]:
    """Each layer's ``Propagation`` over its rows, and the rows; the transport learns which
    rows each layer's training exchanges move. ``options``: ``Propagation``'s (overlap,
    cached_input, linear). Collective."""
    cached = bool(options.get("cached_input"))
    exchange = flag_exchange(transport, graph.device)
    rows = layer_rows(graph, ring, num_layers, cached, exchange)
    propagations = []
    for layer, layer_rows_ in enumerate(rows):
        if transport is not None and layer_rows_.send_keep is not None:
            transport.select(
                layer, layer_rows_.send_keep, layer_rows_.halo_keep, layer_rows_.send_idx
            )
        cut = layer_adjacency(adjacency, layer_rows_, graph.num_inner)
        propagations.append(Propagation(graph, cut, policy, rows=layer_rows_, **options))
    return LayerPropagations(propagations), rows
