"""Which exchange policy each training mode runs with: the one place that maps
``comm.mode`` to a policy (``adaqp/exchange/policy.py`` lists them)."""

from __future__ import annotations

from adaqp.config import QUANTIZED_MODES, Config
from adaqp.exchange.adaptive import AdaptivePolicy
from adaqp.exchange.choice import ChoicePolicy
from adaqp.exchange.planner import BitWidthPlanner
from adaqp.exchange.policy import ExchangePolicy
from adaqp.exchange.stale import StalePolicy
from adaqp.exchange.transport import HaloTransport
from adaqp.graph.aggregate import SparseAdjacency
from adaqp.graph.local import LocalGraph
from adaqp.runtime import World


def make_policy(
    config: Config,
    transport: HaloTransport,
    graph: LocalGraph,
    adjacency: SparseAdjacency,
    world: World,
) -> ExchangePolicy:
    """The exchange policy of ``config.comm.mode`` (collective for the quantized modes:
    their planner gathers the exchange sizes and the ranks' hosts)."""
    mode = config.comm.mode
    if mode in QUANTIZED_MODES:
        transport.warm_up()  # the compiled quantizer loads now, not in the first epoch
        planner = BitWidthPlanner(config.quant, transport, graph, adjacency, world)
        if mode == "adaqp-s":
            last = config.model.layers - 1
            return ChoicePolicy(transport, planner, config.staleness, world.device, last)
        return AdaptivePolicy(transport, planner)
    if mode == "onebit":
        last_layer = config.model.layers - 1
        return StalePolicy(transport, config.staleness, world.device, last_layer)
    return ExchangePolicy(transport)
