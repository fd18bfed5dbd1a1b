"""Which cost model a run plans with: the one owner of that decision.

``quant.cost_model`` names the model and ``quant.scheme`` says whether exchanges are
priced at all. :func:`cost_model_kind` is the only place that reads either for it, and
:func:`kind_of` the only place that matches a model object to its solvers; the planner,
the adaptive policy's report and :func:`~adaqp.assign.solve.solve_assignment` ask the
:class:`CostModelKind` they get:

* ``none`` (the random scheme; the uniform scheme unless ``quant.full_precision =
  "profile"``, the default among them): nothing is profiled, solved or calibrated.
* :data:`UNIFORM_HOST` (the uniform scheme under the host model with
  ``quant.full_precision = "profile"``): the links and hosts are profiled only to
  choose, per exchange, between the uniform width and float32 (float32 where it is
  predicted no slower: links faster than quantizing).
* ``shared`` and ``sender``: the per-pair link profile, with the channels that share a
  link (all of them; each sender's) merged into one, solved under the link model.
* ``link``: every pair its own link; the slowest channel sets the time.
* ``host``: the hosts profiled as well ((de)quantization cost, the fabric's rate) and
  exchanges solved under the :class:`~adaqp.assign.costmodels.HostModel`, with full
  precision one of the widths under ``quant.full_precision = "profile"``.

Under ``quant.full_precision = "auto"`` (the default) which pairs send float32 is not a
cost model's: the planner sends float32 between ranks of one host and plans the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from adaqp.assign.channel import Channel
from adaqp.assign.costmodels import CostModel, HostModel, LinkModel
from adaqp.assign.host import host_brute, host_greedy, host_milp, host_polish
from adaqp.assign.link import link_brute, link_greedy, link_milp, link_polish
from adaqp.assign.problem import HostProblem, LinkProblem
from adaqp.quant.bits import FULL_PRECISION_BITS

if TYPE_CHECKING:
    from adaqp.config import QuantConfig


@dataclass(frozen=True, eq=False)
class Solvers:
    """What :func:`~adaqp.assign.solve.solve_assignment` runs under one type of model.

    Attributes:
        problem: the grouped instance, built as ``problem(channels, dim, model, bits,
            group_size, reference_bits, budget, window_s)``.
        greedy: ``greedy(problem, time_limit_s)`` -> group widths.
        exact: ``exact(problem, time_limit_s)`` -> ``(group widths or None, status)``.
        brute: ``brute(problem, max_combos)`` -> group widths.
        polish: ``polish(problem, group widths, deadline)`` -> group widths.
    """

    problem: type[LinkProblem] | type[HostProblem]
    greedy: Callable[[Any, float], np.ndarray]
    exact: Callable[[Any, float], tuple[np.ndarray | None, str]]
    brute: Callable[[Any, int], np.ndarray]
    polish: Callable[[Any, np.ndarray, float], np.ndarray]


LINK_SOLVERS = Solvers(LinkProblem, link_greedy, link_milp, link_brute, link_polish)
"""Under the link model."""

HOST_SOLVERS = Solvers(HostProblem, host_greedy, host_milp, host_brute, host_polish)
"""Under the host model."""


@dataclass(frozen=True, eq=False)
class CostModelKind:
    """The cost model a run plans with; the attributes are the questions others ask.

    Attributes:
        name: ``"none"``, ``"shared"``, ``"sender"``, ``"link"`` or ``"host"``.
        plans_by_pair: exchanges are priced from the per-pair link profile: the links are
            profiled (and again every ``quant.profile_every`` re-solves), plans solved
            against them, measured exchange times calibrate them, and the report gives
            the plans by pair (False only for ``none``).
        by_host: priced by a :class:`HostModel` (see :attr:`profiles_hosts`,
            :attr:`has_fabric_rate`, :attr:`offers_full_precision`).
        merge: how channels that share a link are merged before solving: ``"shared"``
            (all into one), ``"sender"`` (each sender's into one) or None (not merged).
        full_precision: under the host model, whether float32 is one of the widths
            (``quant.full_precision = "profile"``).
    """

    name: str
    plans_by_pair: bool
    by_host: bool = False
    merge: str | None = None
    full_precision: bool = True

    @property
    def profiles_links(self) -> bool:
        """Whether the links are profiled at start-up (and kept in checkpoints): to plan
        by pair, or to price the uniform width against float32 under the host model."""
        return self.plans_by_pair or self.by_host

    @property
    def profiles_hosts(self) -> bool:
        """Whether the hosts are profiled with the links ((de)quantization timed, the
        fabric's rate probed) and their profile is kept in checkpoints."""
        return self.by_host

    @property
    def has_fabric_rate(self) -> bool:
        """Whether the model has a fabric rate to report."""
        return self.by_host

    @property
    def offers_full_precision(self) -> bool:
        """Whether full precision (float32) is one of the widths: solved among the allowed
        ones, and chosen for a uniform plan (the uniform scheme's, or the adaptive one's
        before its first re-solve) where predicted no slower. (The link greedy takes each
        group's upgrades in order of bytes, which 32 bits breaks.)"""
        return self.by_host and self.full_precision

    @property
    def measures_window(self) -> bool:
        """Whether the planner measures each exchange's overlap window (from the waits
        under the plan that ran) for the objective. Only the host model does: a window
        measured from waits follows the run's timing, so plans under it need not repeat
        bit for bit; the benchmark-only models plan with no window (every second of ``T``
        exposed), and runs under them repeat exactly (the tests of the quantized path use
        ``shared`` for that)."""
        return self.by_host

    @property
    def solvers(self) -> Solvers:
        """The solvers of the model object this kind solves with."""
        return HOST_SOLVERS if self.by_host else LINK_SOLVERS

    def solver_inputs(
        self,
        channels: list[Channel],
        links: LinkModel | None,
        hosts: HostModel | None,
        bits: Sequence[int],
    ) -> tuple[list[Channel], CostModel | None, Sequence[int], list[list[Channel]] | None]:
        """What one exchange's ``channels`` are solved as: ``(channels, model, widths,
        members)``, ``members`` the channels of each merged channel (None: not merged)."""
        if self.by_host:
            # Full precision is one of the choices: an exchange is never planned slower
            # than sending float32.
            if self.offers_full_precision:
                bits = tuple(sorted({*bits, FULL_PRECISION_BITS}))
            return channels, hosts, bits, None
        if self.merge is None:
            return channels, links, bits, None
        merged, model, members = _merge(channels, links, shared=self.merge == "shared")
        return merged, model, bits, members

    def uniform_time(
        self,
        channels: list[Channel],
        dim: int,
        links: LinkModel | None,
        hosts: HostModel | None,
        width: int,
    ) -> float:
        """The predicted ``T`` of every message of ``channels`` at ``width`` bits, priced
        as this kind prices a plan (merged channels, the host model)."""
        solve_channels, model, _, _ = self.solver_inputs(channels, links, hosts, (width,))
        widths = [np.full(c.num_messages, width, np.int8) for c in solve_channels]
        return model.exchange_time(solve_channels, dim, widths)

    @staticmethod
    def widths(
        bits: tuple[np.ndarray, ...], members: list[list[Channel]] | None, channels: list[Channel]
    ) -> tuple[np.ndarray, ...] | list[np.ndarray]:
        """The solved ``bits`` per channel of ``channels`` (``members`` from
        :meth:`solver_inputs`)."""
        return bits if members is None else _split(bits, members, channels)


KINDS = {
    "none": CostModelKind("none", plans_by_pair=False),
    "shared": CostModelKind("shared", plans_by_pair=True, merge="shared"),
    "sender": CostModelKind("sender", plans_by_pair=True, merge="sender"),
    "link": CostModelKind("link", plans_by_pair=True),
    "host": CostModelKind("host", plans_by_pair=True, by_host=True),
}
"""Every kind the adaptive scheme plans with, by name (and ``none``)."""

UNIFORM_HOST = CostModelKind("host", plans_by_pair=False, by_host=True)
"""The uniform scheme under the host model with ``quant.full_precision = "profile"``: the
links and hosts are profiled, and each exchange is sent at the uniform width or, where
the model predicts it no slower, as float32; nothing is solved or calibrated."""


def cost_model_kind(config: QuantConfig) -> CostModelKind:
    """The kind a run's quant section plans with.

    The adaptive scheme: ``quant.cost_model``'s, with float32 among the host model's
    widths only where ``quant.full_precision = "profile"``. The uniform scheme:
    :data:`UNIFORM_HOST` under the host model with ``quant.full_precision = "profile"``
    (a profile then picks float32 where it predicts it no slower), else ``none``: no
    stopwatch decides anything. The random scheme (benchmark-only): ``none``."""
    if config.cost_model == "none" or config.cost_model not in KINDS:
        raise ValueError(f"unknown cost model {config.cost_model!r}")
    profile = config.full_precision == "profile"
    if config.scheme == "uniform":
        return UNIFORM_HOST if config.cost_model == "host" and profile else KINDS["none"]
    if config.scheme != "adaptive":
        return KINDS["none"]
    kind = KINDS[config.cost_model]
    return kind if profile or not kind.by_host else dataclasses.replace(kind, full_precision=False)


def kind_of(model: CostModel) -> CostModelKind:
    """The kind whose solvers price ``model``: ``host`` for a :class:`HostModel`, ``link``
    for a :class:`LinkModel` (merged channels are priced by one too).

    Raises:
        TypeError: ``model`` is neither.
    """
    if isinstance(model, HostModel):
        return KINDS["host"]
    if isinstance(model, LinkModel):
        return KINDS["link"]
    raise TypeError(f"link_model must be a LinkModel or HostModel, got {type(model)}")


def _merge(channels: list[Channel], links: LinkModel, shared: bool):
    """Channels that share one link become one channel (their bytes add up).

    ``shared``: every channel shares one resource (ranks on one host); otherwise each
    sender's channels share its link. A merged channel is filed under ``(src, src + 1)``
    with the median latency and bandwidth of the pairs it covers: each pair was profiled
    alone, i.e. at the full rate of the shared link. Returns the merged channels, their
    link model, and the member channels (in order) of each merged channel.
    """
    p = links.num_ranks
    alpha, beta = np.zeros((p, p)), np.ones((p, p))
    groups: dict[int, list[Channel]] = {}
    for c in channels:
        groups.setdefault(0 if shared else c.src, []).append(c)
    merged, members = [], []
    for src, group in sorted(groups.items()):
        dst = (src + 1) % p
        pairs = tuple(zip(*[(c.src, c.dst) for c in group], strict=True))
        alpha[src, dst] = float(np.median(links.alpha_s[pairs]))
        beta[src, dst] = float(np.median(links.beta_Bps[pairs]))
        merged.append(Channel(src, dst, np.concatenate([c.weights for c in group])))
        members.append(group)
    return merged, LinkModel(alpha, beta), members


def _split(
    merged_bits: tuple[np.ndarray, ...], members: list[list[Channel]], channels: list[Channel]
) -> list[np.ndarray]:
    """Inverse of ``_merge`` for the widths: per original channel, in the original order."""
    widths = {}
    for bits, group in zip(merged_bits, members, strict=True):
        offset = 0
        for c in group:
            widths[c.src, c.dst] = bits[offset : offset + c.num_messages]
            offset += c.num_messages
    return [widths[c.src, c.dst] for c in channels]
