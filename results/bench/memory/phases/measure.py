"""One training worker's memory phase by phase: start-up, each layer's forward and
backward, the exchanges' buffers, the gradient all-reduce, the optimizer step, evaluation.

    OMP_NUM_THREADS=1 timeout 1200 .venv/bin/torchrun --standalone --nproc-per-node 4 \
        results/bench/memory/phases/measure.py \
        --config configs/scaling-synthetic-signal-gcn.toml --mode vanilla --out DIR

Builds a rank as ``adaqp.run.job`` does (the config's partition, ``LocalGraph``,
``Trainer``; numba's kernels, which the trainer loads with its model, are loaded first so
that the runtime is whole before the part comes), runs ``--warm-up`` plain epochs as
``Trainer.fit`` runs them (a step, an evaluation every ``train.eval_every``), each
recorded as one phase, then one instrumented step and an evaluation, and writes
``rank<r>.json`` under ``--out``. Everything is measured from outside the trainer: hooks
on the model's dropout (called once at the start of each layer), on the model's output and
on each hidden layer's output (their gradients mark where backward crosses a layer),
wrappers on the loss, the transport's ``start`` and its handles' ``wait`` (a layer's
exchange in flight, then landed), the gradient buckets' ``finish`` and the optimizer's
``step``, and saved-tensor hooks (the model's own ``SavedTensors._pack``, wrapped here,
and an outer pair for the loss). ``--trim`` calls glibc's ``malloc_trim(0)`` after every
step and evaluation, as a trainer could; ``--allocator`` is ``train.allocator``
(``release``, the default, or ``glibc``), applied before torch loads as the trainer applies
it; the report records it and every ``MALLOC_*`` variable.

Phases are contiguous: each ends where the next begins. Each phase's record holds

- ``rss_mb``: ``VmRSS`` at its end (``anon_mb``, ``file_mb``: its anonymous and
  file-backed parts); ``peak_mb``: ``VmHWM``, reset at its start through
  ``/proc/self/clear_refs``, so the phase's own peak; ``seconds``: its wall time;
- ``allocated_mb``: the bytes of every live torch storage and numpy buffer, each counted
  once, found through ``gc`` (tensors are tracked objects; arrays are found as what tracked
  objects refer to), split by owner: ``held`` (what the trainer keeps across steps),
  ``saved`` (kept for backward, by layer), ``exchange`` (buffers of exchanges not yet let
  go: rows sent, payload received, rows landed), ``gradients`` (parameters'), ``buckets``
  (all-reduce buffers) and ``other`` (the activations and gradients in hand). Tensors only
  C++ holds (autograd's gradient buffers between two nodes, a send buffer gloo holds) are
  not seen: at these points there are few;
- ``malloc_mb``: glibc's ``mallinfo2``: ``in_use`` (handed out, mmapped chunks included)
  and ``kept_free`` (freed into its arenas, not returned to the system).

Also: every exchange started (``exchanges``: rows, widths, the payload sent and received,
the decoded rows), the storages held across steps by owner, index copies per layer among
them (``held_mb``), and the saved tensors by layer (``saved_mb``).
"""

from __future__ import annotations

from adaqp.process.stages import reset_peak, status_bytes  # standard library only


def _status_mb(field: str) -> float:
    value = status_bytes(field)
    return float("nan") if value is None else value / 2**20


START_RSS_MB = _status_mb("VmRSS")  # the bare interpreter, before numpy and torch

import sys  # noqa: E402

from adaqp.process.allocator import configure  # noqa: E402 - standard library only

# ``train.allocator`` as ``python -m adaqp.train`` applies it: before torch is imported.
ALLOCATOR = configure(
    sys.argv[sys.argv.index("--allocator") + 1] if "--allocator" in sys.argv else "release"
)

import argparse  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
import weakref  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from adaqp.graph.local import LocalGraph  # noqa: E402
from adaqp.model.recompute import SavedTensors  # noqa: E402
from adaqp.partitioning.store import load_part  # noqa: E402
from adaqp.quant.kernels import use_compiled, warm_up  # noqa: E402
from adaqp.run.compute_rows import LayerPropagations  # noqa: E402
from adaqp.run.job import prepare_partition  # noqa: E402
from adaqp.run.preflight import partition_dir  # noqa: E402
from adaqp.run.trainer import Trainer  # noqa: E402
from adaqp.runtime import init_distributed, shutdown  # noqa: E402
from adaqp.train import config_from_args  # noqa: E402

MB = 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _malloc_mb() -> dict[str, float]:
    """glibc's heap: bytes in use (arenas and mmapped chunks) and freed but kept."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {"in_use": (info.uordblks + info.hblkhd) / MB, "kept_free": info.fordblks / MB}


# -- what is alive: storages by pointer ---------------------------------------------------


def _add_tensor(found: dict[int, int], tensor: torch.Tensor) -> None:
    try:
        if tensor.layout == torch.sparse_csr:
            parts = (tensor.crow_indices(), tensor.col_indices(), tensor.values())
        elif tensor.layout == torch.strided:
            parts = (tensor,)
        else:
            return
        for part in parts:
            storage = part.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if ptr and nbytes:
                found[ptr] = max(found.get(ptr, 0), nbytes)
    except (RuntimeError, NotImplementedError):  # a tensor without storage
        pass


def _add_array(found: dict[int, int], array: np.ndarray) -> None:
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    ptr, nbytes = owner.__array_interface__["data"][0], owner.nbytes
    if ptr and nbytes:
        found[ptr] = max(found.get(ptr, 0), nbytes)


def storages(*objs) -> dict[int, int]:
    """Pointer -> bytes of the storages reachable from ``objs`` (tensors, CSR tensors,
    numpy arrays, containers, dataclasses and plain objects, five levels down)."""
    found: dict[int, int] = {}
    # Objects stay referenced while walked: the ids of freed temporaries (a CSR tensor's
    # index views) would be reused.
    stack, seen = [(obj, 0) for obj in objs], {}
    while stack:
        item, depth = stack.pop()
        if id(item) in seen or depth > 5 or item is None:
            continue
        seen[id(item)] = item
        if isinstance(item, torch.Tensor):
            _add_tensor(found, item)
        elif isinstance(item, np.ndarray):
            _add_array(found, item)
        elif isinstance(item, dict):
            stack += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list | tuple | set):
            stack += [(v, depth + 1) for v in item]
        elif hasattr(item, "__dict__") and not isinstance(item, type | types.ModuleType):
            stack += [(v, depth + 1) for v in vars(item).values()]
    return found


def live_storages() -> dict[int, int]:
    """Pointer -> bytes of every torch storage and numpy buffer alive: tensors are objects
    ``gc`` tracks, arrays are found among what tracked objects refer to."""
    found: dict[int, int] = {}
    objs = gc.get_objects()
    # type(), not isinstance: a lazy module attribute warns when its class is asked for.
    for obj in objs:
        if issubclass(type(obj), torch.Tensor):
            _add_tensor(found, obj)
    for start in range(0, len(objs), 4096):
        for ref in gc.get_referents(*objs[start : start + 4096]):
            if issubclass(type(ref), np.ndarray):
                _add_array(found, ref)
    return found


def _ptrs(*tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


# -- who holds what across steps ----------------------------------------------------------


def _transposes(matrices) -> list:
    found = [m.given_transpose for m in matrices] + [m.__dict__.get("_transpose") for m in matrices]
    return [t for t in found if t is not None]


def _matrices(prop) -> list:
    if prop.adjacency is not None:
        return [prop.adjacency]
    return list(prop.__dict__.get("_column_blocks", ()))


def held_owners(trainer: Trainer) -> dict[str, list]:
    """What the trainer keeps across steps, by owner; an earlier owner claims a storage
    that a later one shares (a layer's cut of the matrix shares the whole one's arrays)."""
    graph, whole = trainer.graph, trainer.propagation
    train = trainer.train_propagation
    cuts = train.propagations if isinstance(train, LayerPropagations) else []
    owners: dict[str, list] = {
        "features (and the cached layer-0 input)": [graph.features, trainer.inputs],
        "part arrays (CSR, ids, degrees, labels, masks, send list)": [
            *(graph.indptr, graph.indices, graph.global_ids, graph.halo_global_ids),
            *(graph.in_degree, graph.labels, graph.train_mask, graph.val_mask),
            *(graph.test_mask, graph.send_idx),
        ],
        "global ids of the input rows (dropout keys)": [trainer.input_ids],
        "matrix, every row": [m.forward for m in _matrices(whole)],
        "matrix, every row: transposes": _transposes(_matrices(whole)),
    }
    for layer, cut in enumerate(cuts):
        owners[f"layer {layer}: matrix cut"] = [m.forward for m in _matrices(cut)]
        owners[f"layer {layer}: matrix cut's transposes"] = _transposes(_matrices(cut))
    owners["matrices' row and column ids"] = [_matrices(whole)] + [_matrices(c) for c in cuts]
    for layer, cut in enumerate(cuts):
        owners[f"layer {layer}: rows (send list, kept positions)"] = [cut.rows]
    transport = trainer.transport
    if transport is not None:
        owners["transport: global ids sent and received"] = [transport.send_ids, transport.halo_ids]
        for layer, selection in sorted(transport.selections.items()):
            owners[f"layer {layer}: exchange selection"] = [selection]
    owners["exchange policy (plans, traces)"] = [trainer.policy]
    owners["parameters"] = list(trainer.model.parameters())
    owners["optimizer state"] = [trainer.optimizer.state]
    owners["gradient buckets"] = [trainer.buckets]
    owners["anything else the trainer holds"] = [trainer]
    return owners


def claimed(owners: dict[str, list]) -> dict[str, dict[int, int]]:
    """Each owner's storages, shared ones left to the first owner."""
    taken: set[int] = set()
    out = {}
    for name, objs in owners.items():
        found = {p: n for p, n in storages(*objs).items() if p not in taken}
        taken.update(found)
        out[name] = found
    return out


# -- the instrumented step ----------------------------------------------------------------


class Recorder:
    """Contiguous phases: ``switch(name)`` ends the phase in progress (recording where
    memory stands) and begins ``name``. ``prefix`` ("train", "eval" or None: not
    recording) names the pass the hooks mark."""

    def __init__(self):
        self.phase = "start-up: imports (numpy, torch, adaqp), config"
        self.prefix: str | None = None
        self.records: list[dict] = []
        self.held: set[int] = set()
        self.params: list[torch.nn.Parameter] = []
        self.buckets = None
        self.saved: dict[int, tuple[str, weakref.ref, int]] = {}  # ptr: (layer, tensor, bytes)
        self.exchanges: list[dict] = []
        self._live_exchanges: list[tuple[weakref.ref, list[weakref.ref]]] = []
        self._began = time.perf_counter()

    def switch(self, name: str | None, census: bool = True) -> None:
        seconds = time.perf_counter() - self._began
        record = {
            "phase": self.phase,
            "rss_mb": _status_mb("VmRSS"),
            "anon_mb": _status_mb("RssAnon"),
            "file_mb": _status_mb("RssFile"),
            "peak_mb": max(_status_mb("VmHWM"), _status_mb("VmRSS")),
            "seconds": seconds,
        }
        if census:
            record.update(self.census())
        record["malloc_mb"] = _malloc_mb()
        self.records.append(record)
        reset_peak()  # the census's own temporaries are gone by now
        self.phase = name
        self._began = time.perf_counter()

    def census(self) -> dict:
        live = live_storages()
        for p in self.params:  # a gradient only autograd's C++ side may refer to
            if p.grad is not None:
                _add_tensor(live, p.grad)
        by_owner: dict[str, float] = {}
        left = dict(live)

        def take(name: str, ptrs) -> None:
            nbytes = sum(left.pop(p, 0) for p in ptrs)
            if nbytes:
                by_owner[name] = by_owner.get(name, 0.0) + nbytes / MB

        take("held", self.held)
        for layer, ref, _ in self.saved.values():
            tensor = ref()
            if tensor is not None:
                take(f"saved {layer}", _ptrs(tensor))
        for handle_ref, row_refs in self._live_exchanges:
            handle = handle_ref()
            tensors = [ref() for ref in row_refs]
            if handle is not None:
                tensors += [handle._recv, handle._rows]
            take("exchange", _ptrs(*tensors))
        take("gradients", _ptrs(*(p.grad for p in self.params)))
        if self.buckets is not None:
            take("buckets", _ptrs(*(b.buffer for b in self.buckets._buckets)))
        by_owner["other"] = sum(left.values()) / MB
        return {"allocated_mb": sum(live.values()) / MB, "allocated_by_owner_mb": by_owner}

    # Saved tensors: the model's (its own hooks' pack, wrapped) and the loss's (outer hooks).

    def pack_outer(self, tensor: torch.Tensor) -> torch.Tensor:
        packed = tensor.detach()
        self._log_saved("loss", packed)
        return packed

    def _log_saved(self, layer: str, packed: torch.Tensor) -> None:
        storage = packed.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.held or ptr in self.saved or not storage.nbytes():
            return  # parameters, features: held anyway; a storage saved twice, once
        self.saved[ptr] = (layer, weakref.ref(packed), storage.nbytes())

    def wrap_model_saves(self) -> None:
        pack = SavedTensors._pack
        recorder = self

        def logged_pack(saved_tensors: SavedTensors, tensor: torch.Tensor):
            packed = pack(saved_tensors, tensor)
            if isinstance(packed, torch.Tensor):  # else a recipe: no bytes
                recorder._log_saved(f"layer {saved_tensors.layer}", packed)
            return packed

        SavedTensors._pack = logged_pack

    def saved_mb(self) -> dict[str, float]:
        """Bytes saved for backward by layer, each storage once."""
        out: dict[str, float] = {}
        for layer, _, nbytes in self.saved.values():
            out[layer] = out.get(layer, 0.0) + nbytes / MB
        return out

    # Exchanges: the transport's start (the policy's and evaluation's exchanges) and each
    # handle's wait; a layer's exchange splits its phase in three (before, in flight, landed).

    def wrap_transport(self, transport) -> None:
        start = transport.start

        def logged_start(rows_RD, key, plan=None, ranges=False, *, selected=False):
            handle = start(rows_RD, key, plan, ranges, selected=selected)
            if self.prefix is None:
                return handle
            recv = handle._recv
            in_rows = sum(transport.counts(key, transport.selection(key, selected))[1])
            quantized = handle._decode is not None
            dim = rows_RD.shape[1]
            self.exchanges.append(
                {
                    "phase": self.phase,
                    "key": str(key),
                    "selected": selected,
                    "quantized": quantized,
                    "rows_out": int(rows_RD.shape[0]),
                    "rows_in": int(in_rows),
                    "dim": int(dim),
                    "rows_sent_mb": rows_RD.numel() * rows_RD.element_size() / MB,
                    "payload_sent_mb": handle.bytes_sent / MB,
                    "payload_received_mb": recv.numel() * recv.element_size() / MB,
                    "rows_landed_mb": in_rows * dim * 4 / MB,
                }
            )
            row_refs = [weakref.ref(rows_RD)]
            handle_ref = weakref.ref(handle)  # no cycle: the handle goes when let go
            name = f"{self.prefix}: {key.direction.value} layer {key.layer}"

            def logged_wait():
                first = not handle_ref().waited
                rows = type(handle_ref()).wait(handle_ref())
                row_refs.append(weakref.ref(rows))
                if first and self.prefix is not None:
                    self.switch(f"{name} | landed")
                return rows

            handle.wait = logged_wait
            self._live_exchanges.append((weakref.ref(handle), row_refs))
            self.switch(f"{name} | in flight")
            return handle

        transport.start = logged_start

    def forget_exchanges(self) -> None:
        self._live_exchanges = [
            (h, rows)
            for h, rows in self._live_exchanges
            if h() is not None or any(r() is not None for r in rows)
        ]


def install_hooks(trainer: Trainer, rec: Recorder) -> None:
    """Phase marks on the model and on the step's stages, active while ``rec.prefix``."""
    model, layers = trainer.model, {"next": 0}
    num_layers = len(model.convs)

    def on_layer(module, args) -> None:  # the dropout before each layer's convolution
        if rec.prefix is None:
            return
        layer = layers["next"]
        layers["next"] = (layer + 1) % num_layers
        rec.switch(f"{rec.prefix}: forward layer {layer}")
        h = args[0]
        if layer > 0 and h.requires_grad:  # its gradient ends the layer's backward
            h.register_hook(lambda grad: rec.switch(f"train: backward layer {layer - 1}"))

    def on_output(module, args, output) -> None:
        if rec.prefix is None:
            return
        rec.switch("train: loss" if rec.prefix == "train" else "eval: accuracy")
        if output.requires_grad:
            last = num_layers - 1
            output.register_hook(lambda grad: rec.switch(f"train: backward layer {last}"))

    model.dropout.register_forward_pre_hook(on_layer)
    model.register_forward_hook(on_output)

    def after(obj, name: str, phase: str, before: str | None = None) -> None:
        """Wraps ``obj.name`` to begin ``phase`` when it returns (``before``: when called)."""
        call = getattr(obj, name)

        def logged(*args, **kwargs):
            if before is not None and rec.prefix is not None:
                rec.switch(before)
            out = call(*args, **kwargs)
            if rec.prefix is not None:
                rec.switch(phase)
            return out

        setattr(obj, name, logged)

    after(trainer, "local_loss_sum", "train: loss backward")
    after(
        trainer.buckets,
        "finish",
        "train: optimizer step",
        before="train: gradient all-reduce (the buckets' finish)",
    )
    after(trainer.optimizer, "step", "train: step end (loss sum, counters, planner)")


def _malloc_trim() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--mode", default="vanilla")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--warm-up", type=int, default=3, help="plain epochs first (default 3)")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after each step")
    parser.add_argument(
        "--allocator", default="release", help="train.allocator (default release), set first"
    )
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    rec = Recorder()
    rec.records.append({"phase": "start-up: interpreter", "rss_mb": START_RSS_MB})
    ns = argparse.Namespace(
        config=args.config, mode=args.mode, epochs=args.warm_up + 1, seed=None, out=None,
        set=args.set,
    )  # fmt: skip
    config = config_from_args(ns)
    rec.switch("start-up: process group")
    world = init_distributed(config.comm)
    rec.switch("start-up: compiled kernels (numba)")
    if use_compiled(config.quant.kernels, world.device):
        warm_up()
    rec.switch("start-up: partition ready")
    part_dir = partition_dir(config, world.world_size)
    existed = part_dir.exists()
    meta = prepare_partition(config, world, part_dir)
    rec.switch("start-up: part loaded")
    graph = LocalGraph.from_part(load_part(part_dir, world.rank, meta), world.device)
    rec.switch("start-up: trainer built")
    trainer = Trainer(config, graph, meta, world)
    rec.params = list(trainer.model.parameters())
    rec.buckets = trainer.buckets

    def step(epoch: int) -> None:
        trainer.step_epoch(epoch)  # as Trainer.fit runs it
        if args.trim:
            _malloc_trim()

    def evaluate() -> dict[str, float]:
        accuracy = trainer.evaluate()
        if args.trim:
            _malloc_trim()
        return accuracy

    every = config.train.eval_every
    for epoch in range(1, args.warm_up + 1):
        rec.switch(f"warm-up: step (epoch {epoch})", census=epoch == 1)  # ends start-up
        step(epoch)
        if every and epoch % every == 0:
            rec.switch(f"warm-up: evaluation (epoch {epoch})", census=False)
            evaluate()
    held = claimed(held_owners(trainer))
    rec.held = {p for found in held.values() for p in found}
    if trainer.transport is not None:
        rec.wrap_transport(trainer.transport)
    rec.wrap_model_saves()
    install_hooks(trainer, rec)
    rec.switch("train: set-up (zero_grad, buckets armed)")
    rec.prefix = "train"
    with torch.autograd.graph.saved_tensors_hooks(rec.pack_outer, lambda t: t):
        step(args.warm_up + 1)
    saved = rec.saved_mb()
    rec.forget_exchanges()
    rec.switch("eval: set-up")
    rec.prefix = "eval"
    accuracy = evaluate()
    rec.switch(None)
    rec.prefix = None

    report = {
        "rank": world.rank,
        "world_size": world.world_size,
        "config": args.config,
        "set": args.set,
        "trim": args.trim,
        "mode": config.comm.mode,
        "full_precision": config.quant.full_precision,
        "model": f"{config.model.name} {config.model.layers} x {config.model.hidden}",
        "compute_rows": config.train.compute_rows,
        "cached_input": trainer.cache_input,
        "overlap": trainer.propagation.overlap,
        "threads": torch.get_num_threads(),
        "partition_built_here": not existed,
        "num_inner": graph.num_inner,
        "num_halo": graph.num_halo,
        "num_central": graph.num_central,
        "num_edges": int(len(graph.indices)),
        "num_send": int(graph.send_idx.numel()),
        "rows_by_layer": [int(n) for n in trainer.rows_by_layer],
        "val_acc": accuracy["val_acc"],
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "allocator": ALLOCATOR.text(),
        "phases": rec.records,
        "exchanges": rec.exchanges,
        "held_mb": {name: sum(found.values()) / MB for name, found in held.items()},
        "saved_mb": saved,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{world.rank}.json").write_text(json.dumps(report, indent=1) + "\n")
    shutdown()


if __name__ == "__main__":
    sys.exit(main())
