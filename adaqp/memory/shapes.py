"""The sizes a worker's memory depends on, from a partition or from the graph's sizes.

Where the run's partition exists (``partition.dir``, or the directory training would
make), every worker's inner rows, halo rows, edges and send rows come from its metadata.
Otherwise they are estimated from the graph's sizes, without loading it: a synthetic
graph's from its generator's parameters, a built-in dataset's from its file, an OGB
dataset's from its cache's array headers, or in the binary layout (ogbn-papers100M) from
its raw files' headers and its training split. Without a partition a worker is assumed to hold
1.03 N / P inner rows (the cut's balance bound), as many halo rows and send rows as
``halo_per_inner`` times that (1.0 unless told; what partitions give: docs/memory.md), and
1.03 E / P edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adaqp.config import Config
from adaqp.data.npz_members import npz_members
from adaqp.partitioning.schema import METADATA_FILE, PartitionError, read_metadata
from adaqp.run.preflight import partition_dir

BALANCE = 1.03
"""The largest part's share over the mean when no partition says (the cut's bound)."""

DEFAULT_HALO_PER_INNER = 1.0
"""Halo rows per inner row assumed without a partition."""


def counted(count: float, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one: "1 halo row", "0.5 halo
    rows", "2 workers" (a float as its shortest form, an integer whole)."""
    shown = f"{count:g}" if isinstance(count, float) else str(count)
    return f"{shown} {noun}{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class GraphSizes:
    """N nodes, E directed edges (each undirected edge twice), F features, C classes."""

    num_nodes: int
    num_edges: int
    feature_dim: int
    num_classes: int
    multilabel: bool = False
    train_fraction: float | None = None
    """The training nodes' share where the sizes say it (an OGB split); None: the
    config's (a synthetic graph's), else unknown."""


@dataclass(frozen=True)
class WorkerShape:
    """What one worker holds: I inner rows, H halo rows, E in-edges of its inner rows,
    S rows it sends per exchange (its send list), T training rows, out of P workers."""

    rank: int
    world_size: int
    num_inner: int
    num_halo: int
    num_edges: int
    num_send: int
    num_train: int
    graph: GraphSizes


@dataclass(frozen=True)
class Shapes:
    """Every worker's shape, and where they came from (``source``: ``partition DIR`` or
    ``graph sizes (no partition at DIR; ... assumed)``)."""

    workers: list[WorkerShape]
    source: str
    partition: Path | None = None
    """The partition the shapes were read from (None: estimated from the graph's sizes)."""


def graph_sizes(config: Config) -> GraphSizes:
    """The graph's sizes without loading it (see the module docstring).

    Raises:
        ValueError: the sizes cannot be known without loading the graph (an OGB dataset
            with no cache yet): partition it first, and the partition gives them.
    """
    data = config.data
    if data.dataset == "synthetic":
        spec = data.synthetic
        undirected = round(spec.num_nodes * spec.avg_degree / 2)
        return GraphSizes(spec.num_nodes, 2 * undirected, spec.feature_dim, spec.num_classes)
    if data.dataset in ("cora", "citeseer"):
        from adaqp.data import load_dataset  # small: loading is the quickest way

        graph = load_dataset(data.dataset)
        return GraphSizes(graph.num_nodes, graph.num_edges, graph.feature_dim, graph.num_classes)
    binary = _binary_sizes(config)
    if binary is not None:
        return binary
    cache = _cache_file(config)
    if cache is None:
        folder = Path(data.root) / data.dataset.replace("-", "_")
        looked = (
            f" (no cache and no raw files under {folder})"
            if data.dataset.startswith("ogbn-")
            else ""
        )
        raise ValueError(
            f"the sizes of {data.dataset} are not known before it is loaded once{looked}: "
            "partition it first (python -m partition --config ... --num-parts P), and the "
            "estimate reads the partition"
        )
    shapes = {key: member.shape for key, member in npz_members(cache).items()}
    with np.load(cache, allow_pickle=False) as arrays:  # one [N] member, not the graph
        labels = arrays["labels"]
    multilabel = labels.ndim == 2
    classes = labels.shape[1] if multilabel else int(labels.max()) + 1 if labels.size else 0
    return GraphSizes(
        shapes["indptr"][0] - 1, shapes["indices"][0], shapes["features"][1], classes, multilabel
    )


def _binary_sizes(config: Config) -> GraphSizes | None:
    """An OGB dataset in the binary layout (ogbn-papers100M), from its files' headers, its
    class count and its training split's length; None for another dataset or layout, or
    where the files are not there. Its edges are taken as twice the published ones (the
    symmetric graph's at most: the load drops duplicates and self-loops)."""
    data = config.data
    if not data.dataset.startswith("ogbn-"):
        return None
    from adaqp.data.ogb import is_binary, ogb_source
    from adaqp.data.ogb_binary import DATA_FILE, binary_sizes
    from adaqp.data.ogb_csv import PARSE_BLOCK_VALUES, read_csv

    meta, directory, files = ogb_source(data.dataset, Path(data.root))
    if not is_binary(meta) or not (directory / DATA_FILE).is_file():
        return None
    n, published, f = binary_sizes(directory)
    train = read_csv(directory / files[-3], np.int64, PARSE_BLOCK_VALUES).size
    return GraphSizes(n, 2 * published, f, int(meta["num classes"]), False, train / max(n, 1))


def _cache_file(config: Config) -> Path | None:
    data = config.data
    if data.dataset == "npz":
        return Path(data.path) if data.path else None
    if data.dataset.startswith("ogbn-"):
        path = Path(data.root) / data.dataset.replace("-", "_") / "adaqp_cache.npz"
        return path if path.is_file() else None
    return None


def worker_shapes(config: Config, world_size: int, halo_per_inner: float | None = None) -> Shapes:
    """Every worker's shape: from the run's partition where it exists, else estimated.

    Raises:
        ValueError: no partition, and the graph's sizes are not known without loading it;
            or the partition at the run's directory has another number of parts.
        PartitionError: the partition's metadata is damaged.
    """
    where = partition_dir(config, world_size)
    if (where / METADATA_FILE).is_file():
        meta = read_metadata(where)
        parts = meta["parts"]
        if len(parts) != world_size:
            raise PartitionError(
                f"partition {where} has {counted(len(parts), 'part')}, not {world_size} "
                "(one per worker)"
            )
        d = meta["dataset"]
        sizes = GraphSizes(
            d["num_nodes"], d["num_edges"], d["feature_dim"], d["num_classes"], d["multilabel"]
        )
        workers = [
            WorkerShape(
                r,
                world_size,
                p["num_inner"],
                p["num_halo"],
                p["num_edges"],
                p["num_send"],
                p["num_train"],
                sizes,
            )  # fmt: skip
            for r, p in enumerate(parts)
        ]
        return Shapes(workers, f"partition {where}", where)
    sizes = graph_sizes(config)
    ratio = DEFAULT_HALO_PER_INNER if halo_per_inner is None else halo_per_inner
    if world_size == 1:
        ratio = 0.0
    inner = min(sizes.num_nodes, int(np.ceil(BALANCE * sizes.num_nodes / world_size)))
    halo = min(sizes.num_nodes - inner, int(round(ratio * inner)))
    edges = min(sizes.num_edges, int(np.ceil(BALANCE * sizes.num_edges / world_size)))
    train = int(np.ceil(inner * _train_fraction(config, sizes)))
    workers = [
        WorkerShape(r, world_size, inner, halo, edges, halo, train, sizes)
        for r in range(world_size)
    ]
    assumed = f"{counted(float(ratio), 'halo row')} per inner row assumed"
    how = f"graph sizes (no partition at {where}; {assumed})"
    return Shapes(workers, how)


def _train_fraction(config: Config, sizes: GraphSizes) -> float:
    data = config.data
    if sizes.train_fraction is not None:
        return sizes.train_fraction
    if data.dataset == "synthetic":
        return data.synthetic.train_fraction
    return 1.0  # unknown: the training rows' share only bounds the loss's rows
