"""What a training step computes under ``train.compute_rows = "loss"``: the trainer's side
of ``adaqp/graph/loss_rows.py``. At start-up, before the transport is built, the inner rows
are put in ring order (``order_by_loss``); once it is, every layer gets its rows and its
exchanges their selections (``select_rows``), and once the exchange policy is made, a
``Propagation`` of its own (``training_propagation``).
Evaluation keeps the whole graph's ``Propagation``."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from adaqp.exchange.transport import SETUP_KEY, HaloTransport
from adaqp.graph.local import LocalGraph
from adaqp.graph.loss_rows import (
    ExchangeFlags,
    LayerRows,
    layer_adjacency,
    layer_blocks,
    layer_rows,
    order_by_ring,
    rings,
)
from adaqp.model.layers import Propagation


class LayerPropagations:
    """One ``Propagation`` per layer, each on its own rows (a training step that computes
    only the rows its loss reads, ``adaqp/graph/loss_rows.py``); called as one."""

    def __init__(self, propagations: list[Propagation]):
        self.propagations = propagations
        self.overlap = propagations[0].overlap

    def __call__(self, h_RD: torch.Tensor, layer: int, *args, **kwargs) -> torch.Tensor:
        return self.propagations[layer](h_RD, layer, *args, **kwargs)

    def transforms_first(self, layer: int, in_dim: int, out_dim: int) -> bool:
        return self.propagations[layer].transforms_first(layer, in_dim, out_dim)


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


def select_rows(
    graph: LocalGraph,
    ring: np.ndarray | None,
    transport: HaloTransport | None,
    num_layers: int,
    cached_input: bool,
) -> list[LayerRows] | None:
    """Each layer's rows under ``ring`` (``order_by_loss``'s; None: every row, and None is
    returned), the transport told which rows each layer's training exchanges move. Done
    before the exchange policy is made, so that its planner prices those rows only.
    Collective."""
    if ring is None:
        return None
    exchange = flag_exchange(transport, graph.device)
    rows = layer_rows(graph, ring, num_layers, cached_input, exchange)
    for layer, layer_rows_ in enumerate(rows):
        if transport is not None and layer_rows_.send_keep is not None:
            transport.select(
                layer, layer_rows_.send_keep, layer_rows_.halo_keep, layer_rows_.send_idx
            )
    return rows


def global_rows(
    rows: list[LayerRows], device: torch.device, distributed: bool
) -> list[tuple[int, int]]:
    """Each layer's input and output rows summed over the workers (``select_rows``' rows;
    collective where ``distributed``): what decides whether a layer transforms first, so
    that every worker decides alike (``adaqp/model/first.py``)."""
    counts = torch.tensor([[r.num_in, r.num_out] for r in rows], dtype=torch.int64)
    if distributed:
        counts = counts.to(device)
        dist.all_reduce(counts)
    return [(int(a), int(b)) for a, b in counts.cpu().tolist()]


def training_propagation(
    graph: LocalGraph,
    rows: list[LayerRows] | None,
    whole: Propagation,
    num_layers: int,
    totals: list[tuple[int, int]] | None = None,
) -> tuple[Propagation | LayerPropagations, list[int]]:
    """What a training step propagates with, and each layer's rows: with ``rows``
    (``select_rows``'), a ``Propagation`` per layer over its rows, cut from ``whole``
    (every row's, which evaluation runs: the cuts share its arrays where they can), each
    told its layer's rows over every worker (``totals``, ``global_rows``'); else
    ``whole``."""
    if rows is None:
        whole.prepare_backward()
        return whole, [graph.num_inner] * num_layers
    options = {
        "overlap": whole.overlap,
        "cached_input": whole.cached_input,
        "linear": whole.linear,
    }
    propagations = []
    for layer, layer_rows_ in enumerate(rows):
        if whole.adjacency is None:  # a linear aggregation's column blocks
            blocks = layer_blocks(whole.column_blocks, layer_rows_, graph.num_central)
            cut = Propagation(graph, None, whole.policy, rows=layer_rows_, blocks=blocks, **options)
        else:
            adjacency = layer_adjacency(whole.adjacency, layer_rows_, graph.num_inner)
            cut = Propagation(graph, adjacency, whole.policy, rows=layer_rows_, **options)
        if layer > 0 or not whole.cached_input:  # a cached layer 0 has no input gradient
            cut.prepare_backward()
        if totals is not None:
            cut.global_rows = totals[layer]
        propagations.append(cut)
    return LayerPropagations(propagations), [r.num_out for r in rows]
