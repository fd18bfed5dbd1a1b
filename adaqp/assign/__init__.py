"""Bit-width assignment for halo messages: trade quantization variance against exchange time.

Rank 0's planner (``adaqp/exchange/planner.py``) hands every exchange's channels and
their variance weights to this package and gets one width per message back. Everything
here is a pure function of its inputs except :mod:`~adaqp.assign.profile`, whose
profiling is collective. Where each piece lives:

* :mod:`~adaqp.assign.channel`: what an exchange carries: :class:`Channel` and the wire
  bytes of one row at each width (:func:`~adaqp.assign.channel.row_bytes_table`).
* :mod:`~adaqp.assign.problem`: the problem: :class:`Assignment`,
  :func:`evaluate_assignment`, the objective and the grouped instances the solvers share.
* :mod:`~adaqp.assign.costmodels`: what predicts an exchange's time: :class:`LinkModel`,
  :class:`HostModel`, the ``CostModel`` type, and :func:`fit_alpha_beta`.
* :mod:`~adaqp.assign.kinds`: which cost model a run plans with, the one owner of that
  decision: :func:`cost_model_kind` turns ``quant.scheme``/``quant.cost_model`` into a
  :class:`CostModelKind` that the planner, the policy and the solver ask, and
  :func:`kind_of` matches a model object to its solvers; channels that share a link
  are merged there.
* :mod:`~adaqp.assign.link`, :mod:`~adaqp.assign.host`: the solvers (MILP, greedy,
  brute force, polish) under the link and the host model.
* :mod:`~adaqp.assign.solve`: :func:`solve_assignment` (methods, polishing,
  determinism), :func:`solve_exchange` (one exchange under a run's kind), the fixed
  schemes (:func:`uniform_assignment`, :func:`random_assignment`) and
  :func:`first_width` (the width before anything is traced).
* :mod:`~adaqp.assign.profile`: profiling the cluster (collective): the links
  (:func:`profile_links`), which rank runs on which host, the fabric, the
  (de)quantization cost, and the :class:`HostModel` built from them.
* :mod:`~adaqp.assign.calibrate`: fitting the cost model's figures to measured
  exchange times (:func:`fit_calibration`).

Bit widths themselves are defined once, in :mod:`adaqp.quant.bits`.
"""

from __future__ import annotations

from adaqp.assign.calibrate import CALIBRATION_PLANS, fit_calibration
from adaqp.assign.channel import Channel
from adaqp.assign.costmodels import CostModel, HostModel, LinkModel, fit_alpha_beta
from adaqp.assign.kinds import CostModelKind, cost_model_kind, kind_of
from adaqp.assign.problem import Assignment, evaluate_assignment
from adaqp.assign.profile import (
    CHECK_SIZES,
    PROFILE_SIZES,
    host_model,
    host_of_rank,
    profile_fabric,
    profile_links,
    time_quantization,
)
from adaqp.assign.solve import (
    first_width,
    random_assignment,
    solve_assignment,
    solve_exchange,
    uniform_assignment,
)
from adaqp.quant.bits import FULL_PRECISION_BITS

__all__ = [
    "CALIBRATION_PLANS",
    "FULL_PRECISION_BITS",
    "CHECK_SIZES",
    "PROFILE_SIZES",
    "Assignment",
    "Channel",
    "CostModel",
    "CostModelKind",
    "HostModel",
    "LinkModel",
    "cost_model_kind",
    "evaluate_assignment",
    "first_width",
    "fit_alpha_beta",
    "fit_calibration",
    "host_model",
    "host_of_rank",
    "kind_of",
    "profile_fabric",
    "profile_links",
    "random_assignment",
    "solve_assignment",
    "solve_exchange",
    "time_quantization",
    "uniform_assignment",
]
