"""Node -> part assignment: METIS (through pymetis), KaMinPar, random, or contiguous ranges.

One function per method; building halos from the assignment is ``build``'s job.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from adaqp.cli.deps import extra_fix
from adaqp.config import METIS_OBJECTIVES, PARTITION_METHODS
from adaqp.data.pages import row_blocks
from adaqp.process.stop import redelivering_trapped_signals

logger = logging.getLogger(__name__)

IMBALANCE = 0.03
"""KaMinPar's allowed imbalance: a part weighs at most (1 + IMBALANCE) x the mean, METIS's
k-way default (ufactor 30)."""

COMPRESS_EDGES = 1 << 26
"""KaMinPar holds a graph of this many directed edges or more compressed. Measured on a
papers-like graph of 400M directed edges cut into 8 parts: 2.90 GB instead of 5.04 GB
resident, the same cut within 0.03% (5,248,028 against 5,249,614 edges), 36% more time
(results/bench/partition/papers-stages/). Below it the graph takes under 1 GB either way.
A compressed cut gives the same parts for a seed in a fresh process, as the tool and a
training run cut (once a process); a second one in the same process may differ (KaMinPar
keeps state between compressed runs that ``reseed`` does not reset)."""


def assign_parts(
    indptr: np.ndarray,
    indices: np.ndarray,
    num_parts: int,
    *,
    method: str = "metis",
    seed: int = 0,
    train_mask: np.ndarray | None = None,
    objective: str = "cut",
    threads: int = 1,
    scratch: Path | None = None,
) -> np.ndarray:
    """Assigns every node to one of ``num_parts`` parts.

    Args:
        indptr, indices: CSR adjacency (int64 [N+1]; int32 or int64 [E]); must be symmetric
            for METIS.
        num_parts: number of parts P.
        method: ``metis`` (min edge cut, balanced), ``kaminpar`` (min edge cut, balanced,
            in a fraction of METIS's memory), ``random`` or ``contiguous``.
        seed: METIS / KaMinPar / random seed.
        train_mask: bool [N]; when given, METIS also balances training nodes per part
            (two constraints), KaMinPar balances nodes and training nodes together (one
            weight per node, see ``_kaminpar``).
        objective: METIS's objective: ``cut`` (edge cut; recursive bisection up to 8
            parts, pymetis's default) or ``volume`` (communication volume, i.e. halo
            rows; k-way, the only scheme where METIS offers it). KaMinPar accepts ``cut``
            only; random and contiguous ignore it.
        threads: KaMinPar's threads; with 1 a seed gives the same parts every time.
        scratch: where KaMinPar's input file goes (default: the system's temporary
            directory, which may be held in memory).

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
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
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
    if method == "kaminpar":
        if objective != "cut":
            raise ValueError(
                f"partition.objective: kaminpar minimises the edge cut only, so it must be "
                f"cut, not {objective!r} (or use partition.method = metis)"
            )
        return _kaminpar(indptr, indices, num_parts, seed, train_mask, threads, scratch)
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
    adjacency = pymetis.CSRAdjacency(
        indptr.astype(np.int64, copy=False), indices.astype(np.int64, copy=False)
    )
    # METIS traps SIGTERM while it runs (GKlib's SIGERR): the cut ends at once, with a
    # RuntimeError that does not say why; the signal goes back to the process's handler.
    # (METIS's own errors raise SIGERR too, after printing themselves: they read as a stop.)
    # Ctrl-C waits for the cut to return: pymetis holds the interpreter until then.
    with redelivering_trapped_signals():
        result = pymetis.part_graph(
            num_parts, adjacency, vweights=vweights, recursive=recursive, options=options
        )
    return _check_nonempty(np.asarray(result.vertex_part, dtype=np.int64), num_parts, "METIS")


def _kaminpar(indptr, indices, num_parts, seed, train_mask, threads, scratch) -> np.ndarray:
    """KaMinPar's default context, imbalance ``IMBALANCE``.

    KaMinPar balances one weight per node, not METIS's two constraints. With a train
    mask a node weighs 1, a training node 1 + round(N / N_train): nodes and training
    nodes then count equally in a part's weight, so neither can pile up in one part, but
    each alone may exceed the bound by more than ``IMBALANCE`` (the sum stays within it).

    Its Python API reads graphs from files only, so the CSR goes to a temporary ParHIP
    binary file (32-bit ids, offsets and weights, each where it fits); from
    ``COMPRESS_EDGES`` directed edges on, KaMinPar holds it compressed. ``kaminpar.reseed`` sets a
    process-wide seed; a multi-threaded run may still differ from run to run. Even on one
    thread the same blocks have come back under other numbers (two blocks' labels swapped,
    once in a test suite's run): the blocks are numbered by their smallest node id
    (``numbered_by_first_node``), so that a part's number, which is the rank that trains
    it, is the same every time.
    """
    try:
        import kaminpar
    except ModuleNotFoundError:
        fix = extra_fix("kaminpar", "install it with .venv/bin/pip install 'kaminpar>=3.7'")
        raise ModuleNotFoundError(
            f"partition.method = kaminpar needs the kaminpar package: {fix}"
        ) from None
    weights = None
    if train_mask is not None and train_mask.any():
        extra = max(1, round(len(train_mask) / int(train_mask.sum())))
        weights = 1 + extra * train_mask.astype(np.int64)
    with tempfile.TemporaryDirectory(prefix="adaqp-kaminpar-", dir=scratch) as tmp:
        path = Path(tmp) / "graph.parhip"
        write_parhip(path, indptr, indices, weights)
        compress = len(indices) >= COMPRESS_EDGES
        graph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP, compress)
    logger.info("KaMinPar holds the graph %s", "compressed" if compress else "as it is")
    kaminpar.reseed(seed)
    solver = kaminpar.KaMinPar(threads, kaminpar.default_context())
    parts = np.asarray(solver.compute_partition(graph, num_parts, IMBALANCE), dtype=np.int64)
    return _check_nonempty(numbered_by_first_node(parts, num_parts), num_parts, "KaMinPar")


def numbered_by_first_node(parts: np.ndarray, num_parts: int) -> np.ndarray:
    """``parts`` (int64 ``[N]``, each node's block) with the blocks renumbered in the order
    of their smallest node id: the same blocks under any numbering give the same result.
    Labels no node has keep the numbers after the others, in their order."""
    labels, first = np.unique(parts, return_index=True)
    present = labels[np.argsort(first)]
    absent = np.setdiff1d(np.arange(num_parts), present)
    number = np.empty(num_parts, dtype=np.int64)
    number[np.concatenate([present, absent])] = np.arange(num_parts)
    return number[parts]


def write_parhip(
    path: Path,
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    wide: bool = False,
    wide_offsets: bool = False,
) -> None:
    """Writes a symmetric CSR graph in the ParHIP binary format KaMinPar reads.

    Layout: a header of three uint64 (version, N, E), then N+1 offsets (bytes from the
    start of the file to each row's first neighbour), E neighbour ids, and N node weights
    if given. The version's bits say what is there: 1 no edge weights, 2 no node weights,
    4 / 8 / 16 32-bit offsets / ids / node weights, each as narrow as its values allow
    on its own: a graph whose file outgrows 4 GiB (papers100M's 3.2B entries) needs
    64-bit offsets, but its ids still fit 32 bits, half of its largest array. Ids go out
    in chunks, so no full-size copy of ``indices`` is made. ``wide``: 64 bits everywhere,
    even where 32 fit; ``wide_offsets``: the offsets only (tests).
    """
    num_nodes, num_edges = len(indptr) - 1, len(indices)
    narrow_ids = not wide and num_nodes < 2**32
    narrow_weights = not wide and (weights is None or int(weights.max()) < 2**31)
    id_t = np.uint32 if narrow_ids else np.uint64
    weight_t = np.uint32 if narrow_weights else np.uint64
    id_size = np.dtype(id_t).itemsize
    end = 24 + (num_nodes + 1) * 4 + num_edges * id_size
    narrow_offsets = not (wide or wide_offsets) and end < 2**32
    offset_t = np.uint32 if narrow_offsets else np.uint64
    version = (
        1
        | (0 if weights is not None else 2)
        | (4 if narrow_offsets else 0)
        | (8 if narrow_ids else 0)
        | (16 if narrow_weights else 0)
    )
    chunk = 1 << 24  # ids a block
    with open(path, "wb") as f:
        np.array([version, num_nodes, num_edges], dtype=np.uint64).tofile(f)
        base = 24 + (num_nodes + 1) * np.dtype(offset_t).itemsize
        (base + indptr.astype(np.uint64) * id_size).astype(offset_t).tofile(f)
        for block in row_blocks(indices, chunk * indices.itemsize):
            block.astype(id_t).tofile(f)  # mapped ids (a lean source's) are let go
        if weights is not None:
            weights.astype(weight_t).tofile(f)


def _check_nonempty(parts: np.ndarray, num_parts: int, who: str) -> np.ndarray:
    used = np.unique(parts)
    if len(used) != num_parts:
        raise RuntimeError(
            f"{who} left {num_parts - len(used)} of {num_parts} parts empty; "
            "use fewer parts or another method"
        )
    return parts
