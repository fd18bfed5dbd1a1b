"""Each training worker's peak resident memory, predicted from its shape and the config.

A worker holds, across steps, its runtime, its part and the model; on top of that each
training step and each evaluation make and let go of activations, gradients and exchange
buffers, whose largest sum comes at one moment of one layer. The prediction is

    runtime + held (features, graph, adjacency, index copies, parameters, stale rows)
            + the larger of the step's and the evaluation's peak (``adaqp.memory.step``)
            + what the allocator keeps (``train.allocator``)

in bytes, per worker, for I inner rows, H halo rows, E in-edges, S send rows
(``adaqp.memory.shapes``), F features, C classes, hidden width D, L layers, with the rows
each layer computes and exchanges (``adaqp.memory.layer_rows``: from the partition, exact,
where it exists; else modelled from the training nodes' share and the degree):

- ``runtime``: the interpreter, torch, numba's compiled kernels, the process group and
  what the first steps add outside tensors: ``RUNTIME_BYTES``, the one figure fitted
  (results/bench/memory/phases/).
- ``features``: ``F`` values a row in the dataset's dtype, for the inner rows, or with the
  layer-0 halo cache (``comm.cache_input_halo``, more than one worker) for the inner and
  halo rows in one tensor.
- ``graph``: the local CSR (``8 (I + 1)`` offsets, ``4 E`` int32 indices), global ids
  (``8 (I + H)``), degrees (``4 (I + H)``), labels, masks, the send list (``8 S``).
- ``adjacency``: the aggregation matrix of every row (int32 column and float32 value, 8
  bytes an entry, ``E`` plus I self-loops for GCN and GAT; split into its inner and halo
  column blocks with more than one worker), and the transposes backward reads, one per
  layer that needs an input gradient (each over the entries of the rows that layer
  computes).
- ``index copies``: the input rows' global ids, each layer's send and keep lists.
- ``parameters``: weights, their gradients and Adam's two moments, 16 bytes each.
- ``activations``: the walk of a training step and of an evaluation
  (``adaqp.memory.step``): the tensors each layer keeps for backward, those in hand while
  it runs, the exchange buffers (the rows sent, the rows landed, the payload), backward's
  gradients; the larger of the two peaks, and where it comes (``Prediction.where``).
- ``stale rows`` (onebit, adaqp-s): every layer's last halo rows and gradients kept across
  epochs.
- ``allocator``: under ``train.allocator = "glibc"``, freed tensors under glibc's sliding
  mmap threshold stay in the process: up to once more the step's peak (measured 0.9-1.4x
  at four workers of the 200k workload); under ``"release"``, nothing.

GAT's attention keeps per-edge tensors that are not walked: its prediction is a lower
bound, and says so (``Prediction.note``, ``lower_bound`` in the JSON).
"""

from __future__ import annotations

from dataclasses import dataclass

from adaqp.config import Config
from adaqp.config.modes import OVERLAP_MODES, QUANTIZED_MODES, STALE_MODES
from adaqp.memory.layer_rows import LayerCounts, modelled_layer_counts, partition_layer_counts
from adaqp.memory.shapes import Shapes, WorkerShape, counted, worker_shapes
from adaqp.memory.step import FLOAT, LayerShape, Peak, evaluation, training_step
from adaqp.model.first import transforms_first
from adaqp.process.allocator import planned

RUNTIME_BYTES = 395 * 2**20
"""A worker's resident set outside its tensors: Python, torch, numba's compiled kernels,
the process group, and what the first steps add outside tensors (code paged in, Python's
objects, glibc's own chunks): fitted to the 200k workload's measured phases at one and four
workers (results/bench/memory/phases/)."""

GLIBC_KEPT = 1.0
"""Under ``train.allocator = "glibc"``: the freed memory glibc keeps, as a multiple of the
step's peak (measured 0.9-1.4x at four workers; results/bench/memory/phases/)."""

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
    where: str = ""
    """The moment of the peak (``adaqp.memory.step``'s walk: a step's or an evaluation's
    layer and tensor)."""

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
            "peak_phase_per_worker": [w.where for w in self.workers],
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
        alike = len(
            {(w.shape.num_inner, w.shape.num_halo, w.shape.num_edges) for w in self.workers}
        )
        for w in self.workers[:1] if alike == 1 else self.workers:
            parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in w.terms.items() if v)
            who = "every rank" if alike == 1 and len(self.workers) > 1 else f"rank {w.shape.rank}"
            lines.append(
                f"  {who}: {w.shape.num_inner} inner, {w.shape.num_halo} halo, "
                f"{counted(w.shape.num_edges, 'edge')}: peak "
                f"{w.peak_memory_bytes / 2**30:.2f} GiB ({parts}) at {w.where}"
            )
        at_least = "at least " if self.lower_bound else ""
        lines.append(f"largest worker: {at_least}{self.peak_memory_bytes / 2**30:.2f} GiB")
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join(lines)


def predict(
    config: Config,
    world_size: int,
    halo_per_inner: float | None = None,
    config_path: str = "",
    workers_per_host: int | None = None,
) -> Prediction:
    """Every worker's predicted peak for ``config`` on ``world_size`` workers,
    ``workers_per_host`` of them on each host (None: all on one). Where a quantized mode
    sends float32 between workers of one host (``quant.full_precision = "auto"``) or may
    anywhere (``"profile"``), its exchanges are walked as float rows, the larger."""
    shapes: Shapes = worker_shapes(config, world_size, halo_per_inner)
    model = f"{config.model.name} {config.model.layers} x {config.model.hidden}"
    rows = _layer_counts(config, shapes)
    bits = _exchange_bits(config, workers_per_host or world_size)
    orders = _overlap_orders(config, workers_per_host or world_size)
    keeps = planned(config.train.allocator).threshold_bytes is None  # glibc keeps freed blocks
    # Every worker decides alike whether a layer transforms first, on the rows of all.
    totals = [
        (sum(c[layer].num_in for c, _ in rows), sum(c[layer].num_out for c, _ in rows))
        for layer in range(config.model.layers)
    ]
    workers = [
        _estimate(shape, config, training, whole, bits, orders, keeps, totals)
        for shape, (training, whole) in zip(shapes.workers, rows, strict=True)
    ]
    note = LOWER_BOUND_MODELS.get(config.model.name, "")
    return Prediction(config_path, config.comm.mode, model, workers, shapes.source, note)


def _exchange_bits(config: Config, workers_per_host: int) -> int:
    """The width a training exchange's rows travel at, as the walk takes it: 32 (float rows)
    unless the mode quantizes every message of a worker (``quant.full_precision =
    "never"``, or ``"auto"`` with one worker a host); then ``quant.bits`` (0: the model's
    width, at most 8, what the adaptive scheme may choose)."""
    quant = config.quant
    if config.comm.mode not in QUANTIZED_MODES:
        return 32
    if not (
        quant.full_precision == "never"
        or (quant.full_precision == "auto" and workers_per_host == 1)
    ):
        return 32
    return min(quant.bits or 8, 8)


def _overlap_orders(config: Config, workers_per_host: int) -> tuple[bool, ...]:
    """Whether the step's layers overlap (``comm.overlap``; ``runtime.overlaps``): not in
    the modes that never do or under ``off``; yes under ``on`` or ``auto`` with one worker a
    host; else it depends on the host's cores, and the walk takes the larger of both."""
    if config.comm.mode not in OVERLAP_MODES or config.comm.overlap == "off":
        return (False,)
    if config.comm.overlap == "on" or workers_per_host == 1:
        return (True,)
    return (False, True)


def _cached(config: Config, world_size: int) -> bool:
    return world_size > 1 and config.comm.cache_input_halo


def _layer_counts(
    config: Config, shapes: Shapes
) -> list[tuple[list[LayerCounts], list[LayerCounts]]]:
    """Per worker, the rows each layer computes and exchanges in a training step and in an
    evaluation (every row): from the partition where there is one, else modelled."""
    layers, world_size = config.model.layers, len(shapes.workers)
    cached = _cached(config, world_size)
    if shapes.partition is not None:
        training = partition_layer_counts(
            shapes.partition, layers, cached, config.train.compute_rows
        )
        whole = partition_layer_counts(shapes.partition, layers, cached, "all")
        return list(zip(training, whole, strict=True))
    out = []
    for shape in shapes.workers:
        degree = shape.num_edges / max(shape.num_inner, 1)
        sizes = (shape.num_inner, shape.num_halo, shape.num_send, shape.num_train, degree)
        out.append(
            (
                modelled_layer_counts(*sizes, layers, cached, config.train.compute_rows),
                modelled_layer_counts(*sizes, layers, cached, "all"),
            )
        )
    return out


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


def layer_shapes(
    config: Config,
    shape: WorkerShape,
    counts: list[LayerCounts],
    totals: list[tuple[int, int]] | None = None,
) -> list[LayerShape]:
    """The walk's layers (``adaqp.memory.step``) for one worker and its rows per layer;
    ``totals``: each layer's input and output rows over every worker, which decide whether
    it transforms first (None: this worker's)."""
    widths = _widths(config, shape)
    cached = _cached(config, shape.world_size)
    gat = config.model.name == "gat"
    out = []
    for layer, (count, a, b) in enumerate(zip(counts, widths[:-1], widths[1:], strict=True)):
        allowed = config.comm.transform_first and b <= a and not (layer == 0 and cached)
        num_in, num_out = totals[layer] if totals else (count.num_in, count.num_out)
        rows_first = transforms_first(a, b, num_in, num_out)
        first = gat or (allowed and rows_first)
        local = shape.world_size == 1 or (layer == 0 and cached)
        out.append(
            LayerShape(
                num_out=count.num_out,
                num_in=count.num_in,
                num_halo=0 if local else count.num_halo,
                num_send=0 if local else count.num_send,
                width_in=a,
                width_out=b,
                transform_first=first,
                input_halo=shape.num_halo if layer == 0 and cached else 0,
                last=layer == len(counts) - 1,
                exchanges=not local,
            )
        )
    return out


def _estimate(
    shape: WorkerShape,
    config: Config,
    training: list[LayerCounts],
    whole: list[LayerCounts],
    bits: int,
    orders: tuple[bool, ...],
    glibc_keeps: bool,
    totals: list[tuple[int, int]] | None = None,
) -> WorkerEstimate:
    """One worker's predicted peak, by term (see the module docstring)."""
    i, h, e, s = shape.num_inner, shape.num_halo, shape.num_edges, shape.num_send
    widths = _widths(config, shape)
    f = widths[0]
    cached = _cached(config, shape.world_size)
    mode = config.comm.mode
    model = config.model.name
    dropout = config.model.dropout > 0
    step = training_step(
        layer_shapes(config, shape, training, totals), model, dropout, bits, orders
    )
    evaluated = evaluation(layer_shapes(config, shape, whole), model, orders)
    peak: Peak = max(step, evaluated, key=lambda p: p.bytes)
    entries = e + (i if model in ("gcn", "gat") else 0)
    blocks = 8 * (i + 1) + (8 * (i + 1) if shape.world_size > 1 else 0)
    transposes = 0
    for layer, count in enumerate(training):
        if layer > 0 or not cached:  # a layer whose input needs a gradient
            share = count.num_out / max(i, 1)
            transposes += int(8 * entries * share) + 8 * (count.num_in + count.num_halo + 2)
    labels = 4 * i * shape.graph.num_classes if shape.graph.multilabel else 8 * i
    copies = 8 * (i + h) + sum(8 * (2 * c.num_send + c.num_halo) for c in training)
    stale = 0
    if mode in STALE_MODES:
        stale = sum(
            FLOAT * (c.num_halo + c.num_send) * w
            for c, w in zip(training, widths[1:], strict=False)
        )
    terms = {
        "runtime": RUNTIME_BYTES,
        "features": FLOAT * f * (i + h if cached else i),
        "graph": 8 * (i + 1) + 4 * e + 12 * (i + h) + labels + 3 * i + 8 * s,
        "adjacency": 8 * entries + blocks + transposes + 8 * i,
        "index copies": copies,
        "parameters": 16 * _num_params(config, widths),
        "activations": peak.bytes,
        "stale rows": stale,
        "allocator": int(GLIBC_KEPT * step.bytes) if glibc_keeps else 0,
    }
    return WorkerEstimate(shape, terms, peak.where)
