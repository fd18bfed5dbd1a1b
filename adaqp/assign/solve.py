"""Solving an exchange: :func:`solve_assignment` and the fixed schemes (uniform, random).

:func:`solve_assignment` asks :func:`~adaqp.assign.kinds.kind_of` which solvers price its
cost model (:mod:`adaqp.assign.link` or :mod:`adaqp.assign.host`), runs the method asked
for, polishes and canonicalises the result. :func:`solve_exchange` is the planner's entry:
one exchange under a run's :class:`~adaqp.assign.kinds.CostModelKind`.
:func:`first_width` is the width an exchange travels at before anything is traced.

Solvers (:func:`solve_assignment`):

* ``"milp"``: exact, HiGHS through :func:`scipy.optimize.milp`, in two stages
  (:func:`~adaqp.assign.problem.two_stages`): the least ``T`` within the variance budget,
  then the least ``V`` with ``T`` at most the first stage's ``T`` or the window, whichever
  is later (a lexicographic objective is two linear ones). Width of group ``g`` is encoded
  incrementally, ``y[g, k] = [width index >= k]`` for ``k = 1..K-1`` with ``y[g, k] >= y[g, k+1]``
  (equivalent to one-hot ``x[g, b] = y[g, b] - y[g, b+1]`` with ``sum_b x[g, b] = 1``); one
  row bounds ``V`` by the budget. A continuous ``tau = T / T_scale`` (the larger of the
  reference plan's ``T`` and the window) bounds every channel's time (link model),
  or every host's ``N_h + C_h`` with continuous ``N_h >= out_h / beta_out_h``, ``N_h >=
  in_h / beta_in_h`` and ``C_h >= c_r`` for its ranks, and, where the fabric is finite, every
  ``F + C_h`` (host model). On a time limit the better of HiGHS's incumbent and the greedy is
  used. HiGHS does not check its clock inside every root-node heuristic, so on models of
  many thousands of groups it can overrun the limit, and such models rarely finish anyway:
  use the greedy for them, or a group size that keeps groups to a few thousand. The host
  model is harder to prove, and some instances of a few hundred groups do not finish in any
  practical limit (a real integrality gap); the rounded LP is then the usual answer. How
  long the solvers took on which instances is in ``docs/cost-models.md``.
* ``"greedy"``: link model: for every candidate time cap (the window among them), each channel
  independently fills its budget with width upgrades in order of variance decrease per byte (a
  multiple-choice knapsack greedy); the best cap by the objective wins. Host model: the second
  stage's LP relaxation (HiGHS; capped at the first stage's relaxed ``T`` or the window) with
  every group rounded down and to nearest, the best of those and the uniform assignments
  kept. If HiGHS
  returns no LP solution, a pure greedy instead: each group starts at its cheapest width and
  climbs the lower convex hull of its (priced seconds, variance) options; for a grid of caps on
  ``T``, upgrades are taken in order of variance saved per priced second wherever every host
  and the fabric stay within the cap; seconds are priced alike on every resource, then by where
  the best so far sets ``T``. (That greedy alone, being blind to which resources bind, was
  further off the MILP than the rounded LP; see ``tests/assign/test_host.py``.)
* ``"brute"``: enumerates all combinations (refused above ``max_combos``); for tests.

The reference plan (every message at ``reference_bits``) then replaces a MILP or greedy
result that is worse, so no method returns a plan the objective ranks below it. MILP and
greedy results are polished by single-group moves (strict improvements first, then
moves that save bytes, or seconds of the hosts' resources under the host model, without
changing the objective, e.g. for zero-weight messages), and each channel's full-size groups
are sorted to non-increasing widths, which keeps every resource's use and cannot raise
variance: ties between equal weights go to the earlier messages.

Determinism: identical inputs give identical results on one software stack, except when the MILP
(or the greedy's LP, given the same time limit) hits its time limit (where it stops depends on
machine speed): compute on one rank and broadcast.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import numpy as np

from adaqp.assign.channel import Channel
from adaqp.assign.costmodels import CostModel, HostModel, LinkModel
from adaqp.assign.kinds import CostModelKind, kind_of
from adaqp.assign.problem import (
    Assignment,
    HostProblem,
    LinkProblem,
    check_bits,
    check_channels,
    evaluate_assignment,
    sort_full_groups,
)
from adaqp.quant.bits import DEFAULT_ALLOWED_BITS, FULL_PRECISION_BITS

logger = logging.getLogger(__name__)


def solve_assignment(
    channels: Sequence[Channel],
    dim: int,
    link_model: CostModel,
    *,
    reference_bits: int,
    bits: Sequence[int] = DEFAULT_ALLOWED_BITS,
    group_size: int = 100,
    budget: float = 1.0,
    window_s: float = 0.0,
    method: str = "greedy",
    time_limit_s: float = 5.0,
    max_combos: int = 1_000_000,
    polish: bool = True,
) -> Assignment:
    """Choose one width per group of each channel (the objective: :mod:`adaqp.assign.problem`;
    ``T``: :mod:`adaqp.assign.costmodels`).

    Args:
        channels: the exchange's channels (distinct ``(src, dst)`` pairs).
        dim: embedding width ``D``.
        link_model: cost model covering every channel's ranks: a :class:`LinkModel` or a
            :class:`HostModel`.
        reference_bits: the uniform width the run would otherwise send: the variance
            budget is relative to it, and every message at it is always a candidate (it
            joins ``bits`` if absent).
        bits: allowed widths, a subset of ``SUPPORTED_BITS``; with a :class:`HostModel` it
            may also hold ``FULL_PRECISION_BITS``.
        group_size: messages per group after sorting by weight.
        budget: the variance budget, a multiple (> 0) of the reference plan's variance.
        window_s: the exchange's overlap window, in the cost model's seconds (>= 0): time
            within it is hidden, so only ``T`` beyond it counts as exposed.
        method: ``"greedy"`` (the default, as ``quant.solver``'s), ``"milp"`` or
            ``"brute"``.
        time_limit_s: MILP time limit; on expiry the best solution found is used (greedy if none).
        max_combos: brute force refuses larger searches.
        polish: polish MILP/greedy results with local moves (off only to test raw solvers).
    """
    start = time.perf_counter()
    if method not in ("milp", "greedy", "brute"):
        raise ValueError(f"unknown method {method!r}")
    if group_size < 1 or dim < 1 or not time_limit_s > 0:
        raise ValueError("need group_size >= 1, dim >= 1 and time_limit_s > 0")
    channels = tuple(channels)
    check_channels(channels, link_model)
    kind = kind_of(link_model)  # TypeError for anything but a cost model
    widths = tuple(check_bits([*bits, reference_bits]).tolist())
    if not kind.offers_full_precision and FULL_PRECISION_BITS in widths:
        # The link greedy takes each group's upgrades in order of bytes, which 32 bits breaks.
        raise ValueError("full precision (32 bits) is a choice of the HostModel only")
    solvers = kind.solvers
    p = solvers.problem(
        channels, dim, link_model, widths, group_size, reference_bits, budget, window_s
    )
    exact, brute, local = solvers.exact, solvers.brute, solvers.polish

    # The greedy and its polish are bounded by iterations, never by the clock, so that
    # their plans do not depend on the machine's load; only the MILP (and the polish
    # after it) runs to a deadline.

    def greedy(p: LinkProblem | HostProblem) -> np.ndarray:
        return solvers.greedy(p, None)

    def better(a: np.ndarray, b: np.ndarray) -> bool:
        return bool(p.better(p.variance(a), p.time(a), p.variance(b), p.time(b)))

    G, K = p.w.size, p.bits.size
    if G == 0 or K == 1:
        k, status = p.k_reference, "trivial"
    elif method == "brute":
        k, status = sort_full_groups(p, brute(p, max_combos)), "optimal"
    else:
        if method == "greedy":
            k, status = greedy(p), "heuristic"
        else:
            k, status = exact(p, max(start + time_limit_s - time.perf_counter(), 1e-3))
            if status != "optimal":
                # The greedy is cheap: use it when the MILP has nothing, or something worse.
                k_greedy = greedy(p)
                if k is None or better(k_greedy, k):
                    logger.warning("MILP stopped (%s); using the greedy solution", status)
                    k, status = k_greedy, status + "_greedy"
        if better(p.k_reference, k):  # never worse than the reference: it is a candidate
            k, status = p.k_reference, status + "_reference"
        if polish:  # bounded by its moves (POLISH_MOVES); after the MILP also by its clock
            timed = method == "milp"
            k = local(
                p, k, max(start + time_limit_s, time.perf_counter() + 0.05) if timed else math.inf
            )
        k = sort_full_groups(p, k)
    message_bits = p.message_bits(k)
    exposed, var, t = evaluate_assignment(
        channels, dim, message_bits, link_model, window_s=window_s
    )
    elapsed = time.perf_counter() - start
    logger.debug(
        "assigner %s: %s E=%.6gs V=%.6g T=%.6gs in %.3fs", method, status, exposed, var, t, elapsed
    )
    return Assignment(channels, dim, message_bits, exposed, var, t, status, elapsed, method)


def solve_exchange(
    kind: CostModelKind,
    channels: list[Channel],
    dim: int,
    links: LinkModel | None,
    hosts: HostModel | None,
    *,
    bits: Sequence[int],
    **options,
) -> tuple[Assignment, list[np.ndarray]]:
    """One exchange of a run that plans with ``kind``: :func:`solve_assignment` on what
    ``kind`` prices it with (merged channels, the host model, full precision; see
    :meth:`CostModelKind.solver_inputs`), the widths returned per channel of ``channels``,
    in their order. ``links``/``hosts``: the run's profiled models (``options``: those of
    :func:`solve_assignment`)."""
    solve_channels, model, widths, members = kind.solver_inputs(channels, links, hosts, bits)
    result = solve_assignment(solve_channels, dim, model, bits=widths, **options)
    return result, kind.widths(result.bits, members, channels)


def uniform_assignment(
    channels: Sequence[Channel],
    dim: int,
    width: int,
    *,
    link_model: CostModel | None = None,
    window_s: float = 0.0,
) -> Assignment:
    """Every message at ``width`` bits (``FULL_PRECISION_BITS`` for unquantized float32); its
    cost where a cost model is given."""
    check_bits([width])
    return _fixed(channels, dim, _uniform_widths(channels, width), link_model, window_s, "uniform")


def _uniform_widths(channels: Sequence[Channel], width: int) -> list[np.ndarray]:
    """Every message of every channel at ``width`` bits."""
    return [np.full(c.num_messages, width, np.int8) for c in channels]


def random_assignment(
    channels: Sequence[Channel],
    dim: int,
    bits_choices: Sequence[int],
    seed: int,
    *,
    link_model: CostModel | None = None,
    window_s: float = 0.0,
) -> Assignment:
    """Each message at a width drawn uniformly from ``bits_choices`` (seeded, channel order)."""
    choices = check_bits(bits_choices).astype(np.int8)
    rng = np.random.default_rng(seed)
    widths = [rng.choice(choices, size=c.num_messages) for c in channels]
    return _fixed(channels, dim, widths, link_model, window_s, "random")


def _fixed(
    channels: Sequence[Channel],
    dim: int,
    widths: list[np.ndarray],
    link_model: CostModel | None,
    window_s: float,
    method: str,
) -> Assignment:
    start = time.perf_counter()
    channels = tuple(channels)
    check_channels(channels, link_model)
    exposed, var, t = evaluate_assignment(channels, dim, widths, link_model, window_s=window_s)
    elapsed = time.perf_counter() - start
    return Assignment(channels, dim, tuple(widths), exposed, var, t, method, elapsed, method)


def first_width(
    model: HostModel, counts: np.ndarray, dim: int, initial_bits: int
) -> tuple[int, dict[int, float]]:
    """The width of an exchange before anything is traced, under the host model:
    ``initial_bits`` (the planner's: the run's uniform width), or full precision where
    the model predicts it no slower (it is then better in variance and in time alike, so
    a fast network is not slowed down by quantizing). ``counts[src, dst]``: messages src
    sends dst. Returns the width and the predicted time at each width considered. Every
    rank gets the same answer from the same collective profile."""
    p = len(counts)
    channels = [
        Channel(src, dst, np.zeros(int(counts[src, dst])))
        for src in range(p)
        for dst in range(p)
        if src != dst
    ]
    times = {
        width: model.exchange_time(channels, dim, _uniform_widths(channels, width))
        for width in dict.fromkeys((initial_bits, FULL_PRECISION_BITS))
    }
    if times[FULL_PRECISION_BITS] <= times[initial_bits]:
        return FULL_PRECISION_BITS, times
    return initial_bits, times
