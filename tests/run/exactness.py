"""What the exactness tests share: their config, a rank's trainer, the weights as one
array, the whole graph's dense normalised adjacency (built from the CSR with SciPy, never
from partitions or local ids) and the comparisons of a distributed run with the single-
process reference (tests/run/test_trainer.py and the quantized and stale references in
tests/exchange/).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp
import torch

from adaqp.config import load_config
from adaqp.graph.local import LocalGraph
from adaqp.partitioning.schema import read_metadata
from adaqp.partitioning.store import load_part
from adaqp.run.trainer import Trainer
from adaqp.runtime import init_distributed, shutdown

DROPOUT = {
    "gcn": ("model.dropout=0.5",),
    "sage": ("model.dropout=0.5",),
    "gat": ("model.dropout=0.5", "model.attn_dropout=0.6"),
}
"""The exactness tests' dropout: input 0.5, GAT's attention 0.6."""


def exact_config(
    model: str,
    part_dir: str,
    extra: tuple[str, ...] = (),
    dropout: bool = False,
    layers: int = 3,
):
    """The exactness tests' config (``layers`` layers, LayerNorm), dropout 0 unless
    ``dropout``."""
    # GAT: 2 heads of 8 (16 wide, as the others) and 2 averaged output heads.
    hidden = ("model.hidden=8", "model.heads=2", "model.output_heads=2")
    return load_config(
        None,
        [
            *extra,
            "data.dataset=cora",
            f"model.name={model}",
            f"model.layers={layers}",
            *(hidden if model == "gat" else ("model.hidden=16",)),
            *(DROPOUT[model] if dropout else ("model.dropout=0",)),
            "model.layernorm=true",
            "train.lr=0.01",
            f"partition.dir={part_dir}",
        ],
    )


@contextmanager
def rank_trainer(config, init_method: str, rank: int, world_size: int, part_dir: str):
    """This rank's ``(trainer, local graph)`` on the partition in ``part_dir``, inside its
    process group (left on exit)."""
    world = init_distributed(config.comm, init_method, rank, world_size)
    try:
        meta = read_metadata(part_dir)
        graph = LocalGraph.from_part(load_part(part_dir, rank, meta))
        yield Trainer(config, graph, meta, world), graph
    finally:
        shutdown()


def flat_params(model) -> np.ndarray:
    """Every parameter of ``model``, flattened into one array (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def set_flat(model, flat: np.ndarray) -> None:
    """Loads ``flat_params``' layout back into ``model``."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(flat[offset : offset + n]).view_as(p))
            offset += n


def full_adjacency(graph, norm: str) -> torch.Tensor:
    """Dense normalised adjacency of the whole graph, built straight from the CSR."""
    n = graph.num_nodes
    a = sp.csr_matrix((np.ones(graph.num_edges), graph.indices, graph.indptr), shape=(n, n))
    deg = np.asarray(a.sum(1)).ravel()
    if norm == "gcn":
        d = 1.0 / np.sqrt(deg + 1.0)
        a = sp.diags(d) @ (a + sp.eye(n)) @ sp.diags(d)
    else:
        a = sp.diags(1.0 / np.maximum(deg, 1.0)) @ a
    return torch.tensor(a.toarray(), dtype=torch.float32)


def close_weights(actual, expected, rtol: float, what: str) -> None:
    """``actual`` within ``rtol`` of ``expected`` in relative L2 norm (why weights are
    compared so: tests/run/test_trainer.py's ``WEIGHTS_RTOL``)."""
    actual = torch.as_tensor(actual, dtype=torch.float32)
    error = float((actual - expected).norm() / expected.norm())
    assert error <= rtol, f"{what}: relative L2 error {error:.2e} > {rtol:.0e}"


def close(actual, expected, rtol: float, what: str) -> None:
    """``actual`` element-wise within ``rtol`` of ``expected``, relative to its largest value."""
    actual = torch.as_tensor(actual, dtype=torch.float32)
    scale = float(expected.abs().max())
    torch.testing.assert_close(
        actual, expected, rtol=rtol, atol=rtol * scale, msg=lambda detail: f"{what}: {detail}"
    )
