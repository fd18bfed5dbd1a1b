"""What one training worker holds at its peak, stage by stage and layer by layer.

    .venv/bin/python results/bench/memory/training/measure.py \
        --config configs/scaling-synthetic-signal-gcn.toml --mode vanilla \
        --set model.name=sage --out /tmp/mem/sage-p1
    .venv/bin/torchrun --nproc-per-node 4 results/bench/memory/training/measure.py \
        --config configs/scaling-synthetic-signal-gcn.toml --mode vanilla --out /tmp/mem/gcn-p4

Builds a rank as ``adaqp.run.job`` does (partition, ``LocalGraph``, ``Trainer``), runs one
warm-up training step (epoch 1: the column blocks and Adam's moments come into being),
then an instrumented one (epoch 2), and writes ``rank<r>.json`` under ``--out``:

- ``rss_mb``: the resident set (``VmRSS``) after importing torch and the project, after
  loading the part, after building the trainer, before the instrumented step, at the end
  of its forward pass (loss computed), and the step's own peak (``VmHWM``, reset through
  ``/proc/self/clear_refs`` before the step), as well as ``ru_maxrss``, the summary's figure.
- ``held_mb``: the tensors held across steps, by owner (part arrays, adjacency and its
  transpose, column blocks, features, parameters, Adam's state), each storage counted once.
- ``saved``: every tensor autograd keeps for backward in the instrumented step, storages
  counted once, parameters left out, by layer (``GNN.observe_saved``; the loss's through
  ``torch.autograd.graph.saved_tensors_hooks``) and by the backward node that saves it (a
  third step walks the graph); bytes and bytes per inner row. A tensor kept as a recipe
  (``adaqp/model/recompute.py``) holds no bytes and is not listed. On a model without
  ``observe_saved`` (before it existed), the outer hooks see every save and the layer is
  the one whose dropout ran last (GCN and SAGE call one dropout per layer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
from collections import defaultdict
from pathlib import Path

from adaqp.process.stages import reset_peak, status_bytes  # standard library only


def _status_mb(field: str) -> float:
    value = status_bytes(field)
    return float("nan") if value is None else value / 2**20


RSS = {"import": _status_mb("VmRSS")}  # before torch: the bare interpreter

import numpy as np  # noqa: E402
import torch  # noqa: E402

from adaqp.graph.local import LocalGraph  # noqa: E402
from adaqp.partitioning.store import load_part  # noqa: E402
from adaqp.run.job import prepare_partition  # noqa: E402
from adaqp.run.preflight import partition_dir  # noqa: E402
from adaqp.run.trainer import Trainer  # noqa: E402
from adaqp.runtime import init_distributed, shutdown  # noqa: E402
from adaqp.train import config_from_args  # noqa: E402

RSS["torch"] = _status_mb("VmRSS")


def _storages(obj, seen_ptr: set[int]) -> int:
    """Bytes of the storages reachable from ``obj`` (tensors, CSR tensors, numpy arrays,
    containers, dataclasses and plain objects, four levels down), each counted once."""
    total = 0
    # Objects stay referenced while walked: the ids of freed temporaries (a CSR tensor's
    # index views) would be reused.
    stack, seen_obj = [(obj, 0)], {}
    while stack:
        item, depth = stack.pop()
        if id(item) in seen_obj or depth > 4:
            continue
        seen_obj[id(item)] = item
        if isinstance(item, torch.Tensor):
            if item.layout == torch.sparse_csr:
                stack += [
                    (t, depth) for t in (item.crow_indices(), item.col_indices(), item.values())
                ]
                continue
            storage = item.untyped_storage()
            if storage.data_ptr() not in seen_ptr:
                seen_ptr.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, np.ndarray):
            base = item if item.base is None else item.base
            ptr = base.__array_interface__["data"][0] if isinstance(base, np.ndarray) else 0
            if ptr and ptr not in seen_ptr:
                seen_ptr.add(ptr)
                total += base.nbytes
        elif isinstance(item, dict):
            stack += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list | tuple):
            stack += [(v, depth + 1) for v in item]
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            stack += [(v, depth + 1) for v in vars(item).values()]
    return total


def _held(trainer: Trainer) -> dict[str, float]:
    """MB held across steps, by owner; earlier owners claim shared storages."""
    seen: set[int] = set()
    graph = trainer.graph
    prop = trainer.propagation
    owners = {
        "features": [graph.features, trainer.inputs],
        "part arrays (indptr, indices, ids, degrees, masks, labels, send_idx)": [
            graph.indptr,
            graph.indices,
            graph.global_ids,
            graph.halo_global_ids,
            graph.in_degree,
            graph.labels,
            graph.train_mask,
            graph.val_mask,
            graph.test_mask,
            graph.send_idx,
        ],
        "adjacency [I, I+H]": [getattr(prop.adjacency, "forward", None)],
        "adjacency transpose": [getattr(prop.adjacency, "transpose", None)],
        "adjacency other (ids, caches)": [prop.adjacency],
        "column blocks": [b.forward for b in prop.__dict__.get("_column_blocks", ())],
        "column blocks' transposes": [b.transpose for b in prop.__dict__.get("_column_blocks", ())],
        "column blocks' other (ids)": [prop.__dict__.get("_column_blocks")],
        "row blocks": [prop.__dict__.get("_row_blocks")],
        "parameters": list(trainer.model.parameters()),
        "optimizer state": [trainer.optimizer.state],
        "exchange policy and transport": [trainer.policy, trainer.transport],
    }
    return {name: _storages(objs, seen) / 2**20 for name, objs in owners.items()}


def _nnz(prop) -> int:
    """Entries of the aggregation matrix, whether held whole or as column blocks."""
    if prop.adjacency is not None:
        return int(prop.adjacency.forward.values().numel())
    return sum(int(b.forward.values().numel()) for b in prop.__dict__["_column_blocks"])


class _SavedLog:
    """Records what autograd saves, by layer. Where the model reports its saved tensors
    (``GNN.observe_saved``, whose hooks hide the saves inside its forward from any outer
    hooks), they come from there and the outer hooks see the loss's; in a model without
    it, the outer hooks see everything and the layer is the one whose dropout ran last."""

    def __init__(self, model: torch.nn.Module):
        self.layer = -1
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.by_ptr: dict[int, tuple[str, int, tuple, str]] = {}
        if hasattr(model, "observe_saved"):
            model.observe_saved = self.observe
            self.layer = "loss"
        else:
            model.dropout.register_forward_pre_hook(self._next_layer)

    def _next_layer(self, module, args) -> None:
        self.layer += 1

    def observe(self, layer, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.param_ptrs and ptr not in self.by_ptr and storage.nbytes():
            self.by_ptr[ptr] = (
                str(layer),
                storage.nbytes(),
                tuple(tensor.shape),
                str(tensor.dtype),
            )

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.observe(self.layer, tensor)
        return tensor.detach()

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def _saving_nodes(root: torch.Tensor) -> dict[int, list[str]]:
    """Storage pointer -> names of the backward nodes that save it (walks the graph)."""
    names: dict[int, list[str]] = defaultdict(list)
    stack, seen = [root.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        saved = []
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    value = getattr(node, attr)
                except RuntimeError:
                    continue
                saved += [value] if isinstance(value, torch.Tensor) else []
        if hasattr(node, "saved_tensors"):
            with contextlib.suppress(RuntimeError):
                saved += [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
        for tensor in saved:
            names[tensor.untyped_storage().data_ptr()].append(node.name())
        stack += [fn for fn, _ in node.next_functions]
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--mode", default="vanilla")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    ns = argparse.Namespace(
        config=args.config, mode=args.mode, epochs=2, seed=None, out=None, set=args.set
    )
    config = config_from_args(ns)
    world = init_distributed(config.comm)
    part_dir = partition_dir(config, world.world_size)
    meta = prepare_partition(config, world, part_dir)
    graph = LocalGraph.from_part(load_part(part_dir, world.rank, meta), world.device)
    RSS["graph"] = _status_mb("VmRSS")
    trainer = Trainer(config, graph, meta, world)
    RSS["trainer"] = _status_mb("VmRSS")

    trainer.step_epoch(1)  # as Trainer.fit runs an epoch's step
    log = _SavedLog(trainer.model)
    RSS["before step"] = _status_mb("VmRSS")
    local_loss_sum = trainer.local_loss_sum

    def at_forward_end(logits: torch.Tensor) -> torch.Tensor:
        loss = local_loss_sum(logits)
        RSS["forward end"] = _status_mb("VmRSS")
        return loss

    trainer.local_loss_sum = at_forward_end
    reset = reset_peak()
    with torch.autograd.graph.saved_tensors_hooks(log.pack, log.unpack):
        trainer.step_epoch(2)
    RSS["step peak (VmHWM)" if reset else "process peak (VmHWM)"] = _status_mb("VmHWM")
    RSS["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    # The backward nodes that save each tensor, from a third step: walking the graph
    # unpacks what it saved, recomputing what is kept as a recipe, which would have
    # counted in the second step's peak. The same code path saves the same tensors in
    # the same order, matched here by (layer, shape, dtype, occurrence).
    names_log = _SavedLog(trainer.model)
    walked: dict[int, list[str]] = {}

    def walk_at_forward_end(logits: torch.Tensor) -> torch.Tensor:
        loss = local_loss_sum(logits)
        walked.update(_saving_nodes(loss))
        return loss

    trainer.local_loss_sum = walk_at_forward_end
    with torch.autograd.graph.saved_tensors_hooks(names_log.pack, names_log.unpack):
        trainer.step_epoch(3)
    names_by_sig: dict[tuple, list[list[str]]] = defaultdict(list)
    for ptr, (layer, _, shape, dtype) in names_log.by_ptr.items():
        names_by_sig[(layer, shape, dtype)].append(sorted(set(walked.get(ptr, ["?"]))))
    nodes = {}
    seen_sig: dict[tuple, int] = defaultdict(int)
    for ptr, (layer, _, shape, dtype) in log.by_ptr.items():
        sig = (layer, shape, dtype)
        found = names_by_sig.get(sig, [])
        nodes[ptr] = found[seen_sig[sig]] if seen_sig[sig] < len(found) else ["?"]
        seen_sig[sig] += 1

    num_inner = graph.num_inner
    layers: dict[str, dict] = defaultdict(lambda: {"bytes": 0, "tensors": []})
    for ptr, (layer, nbytes, shape, dtype) in log.by_ptr.items():
        entry = layers[layer]
        entry["bytes"] += nbytes
        entry["tensors"].append({"by": nodes[ptr], "shape": shape, "dtype": dtype, "bytes": nbytes})
    saved_total = sum(e["bytes"] for e in layers.values())
    report = {
        "rank": world.rank,
        "world_size": world.world_size,
        "model": config.model.name,
        "mode": config.comm.mode,
        "num_inner": num_inner,
        "num_halo": graph.num_halo,
        "num_central": graph.num_central,
        "num_edges": int(len(graph.indices)),
        "adjacency_nnz": _nnz(trainer.propagation),
        "num_send": int(graph.send_idx.numel()),
        "feature_dim": int(graph.features.shape[1]),
        "hidden": config.model.hidden,
        "layers": config.model.layers,
        "num_classes": int(meta["dataset"]["num_classes"]),
        "num_params": sum(p.numel() for p in trainer.model.parameters()),
        "cached_input": trainer.cache_input,
        "overlap": trainer.propagation.overlap,
        "threads": torch.get_num_threads(),
        "rss_mb": RSS,
        "held_mb": _held(trainer),
        "saved_mb": saved_total / 2**20,
        "saved_bytes_per_inner_row": saved_total / num_inner,
        "saved_by_layer": {
            layer: {
                "mb": e["bytes"] / 2**20,
                "bytes_per_inner_row": e["bytes"] / num_inner,
                "tensors": e["tensors"],
            }
            for layer, e in sorted(layers.items())
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{world.rank}.json").write_text(json.dumps(report, indent=1) + "\n")
    shutdown()


if __name__ == "__main__":
    sys.exit(main())
