"""Node -> part assignment: METIS (through pymetis), random, or contiguous ranges."""

from __future__ import annotations

import logging

import numpy as np

from adaqp.config import METIS_OBJECTIVES, PARTITION_METHODS

logger = logging.getLogger(__name__)


def assign_parts(
    indptr: np.ndarray,
    indices: np.ndarray,
    num_parts: int,
    *,
    method: str = "metis",
    seed: int = 0,
    train_mask: np.ndarray | None = None,
    objective: str = "cut",
) -> np.ndarray:
    """Assigns every node to one of ``num_parts`` parts.

    Args:
        indptr, indices: CSR adjacency (int64 [N+1], [E]); must be symmetric for METIS.
        num_parts: number of parts P.
        method: ``metis`` (min edge cut, balanced), ``random`` or ``contiguous``.
        seed: METIS / random seed.
        train_mask: bool [N]; when given, METIS also balances training nodes per part.
        objective: METIS's objective: ``cut`` (edge cut; recursive bisection up to 8
            parts, pymetis's default) or ``volume`` (communication volume, i.e. halo
            rows; k-way, the only scheme where METIS offers it). Other methods ignore it.

    Returns:
        int64 [N] part id of each node.
    """
    num_nodes = len(indptr) - 1
    if objective not in METIS_OBJECTIVES:
        raise ValueError(
            f"unknown METIS objective {objective!r}; choose one of {', '.join(METIS_OBJECTIVES)}"
        )
    if num_parts < 1:
        raise ValueError(f"num_parts must be at least 1, got {num_parts}")
    if num_parts > num_nodes:
        raise ValueError(f"cannot cut {num_nodes} nodes into {num_parts} parts")
    if num_parts == 1:
        return np.zeros(num_nodes, dtype=np.int64)
    if method == "contiguous":
        return (np.arange(num_nodes, dtype=np.int64) * num_parts) // num_nodes
    if method == "random":
        rng = np.random.default_rng(seed)
        parts = np.arange(num_nodes, dtype=np.int64) % num_parts
        rng.shuffle(parts)
        return parts
    if method == "metis":
        return _metis(indptr, indices, num_parts, seed, train_mask, objective)
    raise ValueError(
        f"unknown partition method {method!r}; choose one of {', '.join(PARTITION_METHODS)}"
    )


def _metis(indptr, indices, num_parts, seed, train_mask, objective) -> np.ndarray:
    import pymetis

    options = pymetis.Options(seed=seed)
    recursive = None  # pymetis picks: recursive bisection up to 8 parts, else k-way
    if objective == "volume":
        options.objtype = 1  # METIS_OBJTYPE_VOL; METIS accepts it for k-way only
        recursive = False
    vweights = None
    if train_mask is not None and train_mask.any():
        # Two constraints per node (1, is_train): METIS balances both totals.
        vweights = np.stack(
            [np.ones(len(train_mask), dtype=np.int64), train_mask.astype(np.int64)], axis=1
        ).ravel()
    adjacency = pymetis.CSRAdjacency(indptr.astype(np.int64), indices.astype(np.int64))
    result = pymetis.part_graph(
        num_parts, adjacency, vweights=vweights, recursive=recursive, options=options
    )
    parts = np.asarray(result.vertex_part, dtype=np.int64)
    used = np.unique(parts)
    if len(used) != num_parts:
        raise RuntimeError(
            f"METIS left {num_parts - len(used)} of {num_parts} parts empty; "
            "use fewer parts or another method"
        )
    return parts
