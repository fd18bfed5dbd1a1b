"""Each training worker's peak resident memory, predicted from its shape and the config.

A worker's peak comes during backward: everything held across steps, every layer's
tensors saved for backward (the forward pass has just ended), and the gradients backward
has in flight. The prediction is that sum, term by term, in bytes, for a worker with
I inner rows, H halo rows, E in-edges, S send rows (``adaqp.memory.shapes``), F features,
C classes, hidden width D, L layers:

- ``runtime``: the interpreter, torch, the compiled kernels and the process group:
  ``RUNTIME_BYTES``, measured (a worker before it loads its part).
- ``features``: ``4 F I``, and with the layer-0 halo cache (``comm.cache_input_halo``,
  more than one worker) the cached inputs ``4 F (I + H)`` beside them.
- ``graph``: the local CSR (``8 E`` indices, ``8 I`` offsets), ids and degrees of every
  local row (``24 (I + H)``), labels and masks (``11 I``), the send list (``8 S``).
- ``adjacency``: the ``[I, I + H]`` aggregation matrix and its transpose for backward,
  ``12`` bytes per stored entry each (int64 column, float32 value) plus offsets; entries
  are E, plus I self-loops for GCN and GAT. With more than one worker the column split's
  two blocks (inner and halo columns) add ``ADJACENCY_BLOCKS`` times the matrix.
- ``parameters``: weights, their gradients and Adam's two moments, ``16`` bytes each.
- ``activations``: what the forward pass saves for backward, per inner row: the
  aggregated rows a layer's dense transform reads (``4 D_in``; none where a narrowing
  layer transforms first) and, for a hidden layer, the input of its LayerNorm and ReLU
  (``4 D``): the layers' inputs after dropout are computed again in backward, not kept
  (``adaqp/model/recompute.py``).
- ``backward``: the gradients in flight while backward runs a layer: two ``[I, D]`` and
  the halo rows' ``[H, D]`` (``4 D (2 I + H)``).
- ``stale rows`` (onebit, adaqp-s): every layer's last halo rows and gradients kept
  across epochs, ``8 D H L``.

The terms are the code's tensors; ``RUNTIME_BYTES`` is the only figure fitted, and the
reading (docs/memory.md) compares the sum with measured peaks. GAT's attention keeps
per-edge tensors that are not modelled: its prediction is a lower bound, and says so
(``Prediction.note``, ``lower_bound`` in the JSON). The activations
are counted for every inner row, as ``train.compute_rows = "all"`` computes them; the
default computes fewer (``adaqp/graph/loss_rows.py``, how many depends on the graph, which
this prediction does not load), so there it bounds them from above.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaqp.config import Config
from adaqp.config.modes import STALE_MODES
from adaqp.memory.shapes import Shapes, WorkerShape, counted, worker_shapes

RUNTIME_BYTES = 520 * 2**20
"""A worker's resident set before its part's arrays and the activations: Python, torch,
numba's compiled kernels, the model and the process group: fitted to the step's start
less the tensors held (results/bench/memory/training/)."""

ADJACENCY_BLOCKS = 1.0
"""The column split's inner and halo blocks, as a multiple of the adjacency's bytes."""

LOWER_BOUND_MODELS = {
    "gat": "GAT's attention keeps per-edge tensors that the estimate does not count: its "
    "peak is a lower bound (docs/memory.md)",
}
"""Models whose prediction is a lower bound, and why (said with the prediction)."""


@dataclass(frozen=True)
class WorkerEstimate:
    """One worker's predicted peak, by term (bytes)."""

    shape: WorkerShape
    terms: dict[str, int]

    @property
    def peak_memory_bytes(self) -> int:
        return sum(self.terms.values())


@dataclass(frozen=True)
class Prediction:
    """Every worker's predicted peak, and what it was computed from."""

    config_path: str
    mode: str
    model: str
    workers: list[WorkerEstimate]
    source: str
    note: str = ""
    """Why the prediction is only a lower bound (``LOWER_BOUND_MODELS``); empty where it
    is not."""

    @property
    def peak_memory_bytes(self) -> int:
        return max(w.peak_memory_bytes for w in self.workers)

    @property
    def lower_bound(self) -> bool:
        """Whether the real peak may lie above the prediction (see ``note``)."""
        return bool(self.note)

    def host_bytes(self, ranks: range) -> int:
        """What the workers ``ranks`` (one host's) need together."""
        return sum(self.workers[r].peak_memory_bytes for r in ranks)

    def as_json(self) -> dict:
        return {
            "config": self.config_path,
            "nproc": len(self.workers),
            "mode": self.mode,
            "model": self.model,
            "source": self.source,
            "peak_memory_bytes": self.peak_memory_bytes,
            "lower_bound": self.lower_bound,
            "note": self.note or None,
            "peak_memory_bytes_per_worker": [w.peak_memory_bytes for w in self.workers],
            "terms_per_worker": [w.terms for w in self.workers],
            "shape_per_worker": [
                {
                    "num_inner": w.shape.num_inner,
                    "num_halo": w.shape.num_halo,
                    "num_edges": w.shape.num_edges,
                    "num_send": w.shape.num_send,
                }
                for w in self.workers
            ],
        }

    def text(self) -> str:
        lines = [
            f"{self.config_path}: {counted(len(self.workers), 'worker')}, {self.mode}, "
            f"{self.model}; from {self.source}"
        ]
        for w in self.workers:
            parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in w.terms.items() if v)
            lines.append(
                f"  rank {w.shape.rank}: {w.shape.num_inner} inner, {w.shape.num_halo} halo, "
                f"{counted(w.shape.num_edges, 'edge')}: peak "
                f"{w.peak_memory_bytes / 2**30:.2f} GiB ({parts})"
            )
        at_least = "at least " if self.lower_bound else ""
        lines.append(f"largest worker: {at_least}{self.peak_memory_bytes / 2**30:.2f} GiB")
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join(lines)


def predict(
    config: Config, world_size: int, halo_per_inner: float | None = None, config_path: str = ""
) -> Prediction:
    """Every worker's predicted peak for ``config`` on ``world_size`` workers."""
    shapes: Shapes = worker_shapes(config, world_size, halo_per_inner)
    model = f"{config.model.name} {config.model.layers} x {config.model.hidden}"
    workers = [WorkerEstimate(s, worker_terms(s, config)) for s in shapes.workers]
    note = LOWER_BOUND_MODELS.get(config.model.name, "")
    return Prediction(config_path, config.comm.mode, model, workers, shapes.source, note)


def _widths(config: Config, shape: WorkerShape) -> list[int]:
    """Each layer's input width, then the output's: F, D, ..., D, C."""
    m = config.model
    hidden = m.heads * m.hidden if m.name == "gat" else m.hidden
    return [shape.graph.feature_dim] + [hidden] * (m.layers - 1) + [shape.graph.num_classes]


def _num_params(config: Config, widths: list[int]) -> int:
    per_layer = 2 if config.model.name == "sage" else 1  # SAGE: root and neighbour weights
    weights = sum(per_layer * a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))
    norms = 2 * sum(widths[1:-1]) if config.model.layernorm else 0
    return weights + norms


def worker_terms(shape: WorkerShape, config: Config) -> dict[str, int]:
    """The predicted peak of one worker, by term (see the module docstring)."""
    i, h, e, s = shape.num_inner, shape.num_halo, shape.num_edges, shape.num_send
    widths = _widths(config, shape)
    f, d = widths[0], max(widths[1:-1], default=widths[-1])
    distributed = shape.world_size > 1
    cached = distributed and config.comm.cache_input_halo
    entries = e + (i if config.model.name in ("gcn", "gat") else 0)
    matrix = 12 * entries + 8 * (i + 1)
    transpose = 12 * entries + 8 * (i + h + 1)
    blocks = int(ADJACENCY_BLOCKS * matrix) if distributed else 0
    labels = 4 * i * shape.graph.num_classes if shape.graph.multilabel else 8 * i
    saved = 0  # bytes per inner row
    for layer, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        # A layer that narrows transforms first (comm.transform_first; not layer 0 on a
        # cached input): its aggregation's input needs no keeping. Else its transform
        # keeps the aggregated rows.
        first = config.comm.transform_first and b < a and not (layer == 0 and cached)
        saved += 0 if first else 4 * a
        saved += 4 * b if layer < len(widths) - 2 else 0  # a hidden layer's norm input
    return {
        "runtime": RUNTIME_BYTES,
        "features": 4 * f * i + (4 * f * (i + h) if cached else 0),
        "graph": 8 * e + 8 * (i + 1) + 24 * (i + h) + labels + 3 * i + 8 * s,
        "adjacency": matrix + transpose + blocks,
        "parameters": 16 * _num_params(config, widths),
        "activations": i * saved,
        "backward": 4 * d * (2 * i + h),
        "stale rows": 8 * d * h * config.model.layers if config.comm.mode in STALE_MODES else 0,
    }
