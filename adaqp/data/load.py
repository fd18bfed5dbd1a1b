"""``load_dataset``: the one entry point that loads any dataset by name."""

from __future__ import annotations

import logging
from pathlib import Path

from adaqp.data.builtin import BUILTIN_DATASETS, load_builtin
from adaqp.data.graph import GraphData
from adaqp.data.npz import load_npz
from adaqp.data.ogb import check_ogb_files, load_ogb, supported_ogb_names
from adaqp.data.synthetic import SyntheticSpec, generate_synthetic

logger = logging.getLogger(__name__)

FEATURE_NORMS = ("none", "row")
"""``feature_norm`` values: the features as stored, or each row divided by its L1 norm."""


def check_source(name: str, *, root: str | Path = "data", path: str | Path | None = None) -> None:
    """Raises, loading nothing, where ``load_dataset`` would fail for want of its source:
    an unknown name (ValueError), a missing npz file or OGB files that are not on disk
    (FileNotFoundError). Cheap enough for the checks made before any worker starts."""
    key = name.lower()
    if key in (*BUILTIN_DATASETS, "synthetic"):
        return
    if key == "npz":
        if path is None or not Path(path).is_file():
            raise FileNotFoundError(f"data.path: {path} is not a file (the npz dataset to load)")
    elif key.startswith("ogbn-"):
        check_ogb_files(key, Path(root))
    else:
        names = [*BUILTIN_DATASETS, "synthetic", "npz", "ogbn-*"]
        raise ValueError(f"data.dataset: unknown dataset {name!r}; available: {', '.join(names)}")


def load_dataset(
    name: str,
    *,
    root: str | Path = "data",
    split_seed: int = 0,
    synthetic: SyntheticSpec | None = None,
    path: str | Path | None = None,
    feature_norm: str = "none",
) -> GraphData:
    """Loads a dataset by name into a validated :class:`GraphData`.

    Args:
        name: ``cora``, ``citeseer``, ``synthetic``, ``npz`` or a supported ``ogbn-*`` name.
        root: Directory holding OGB datasets (``root/ogbn_arxiv/...``).
        split_seed: Seed of the random split for ``cora``/``citeseer``/``synthetic``; OGB
            datasets and npz files keep their own split.
        synthetic: Generator parameters for ``synthetic`` (default ``SyntheticSpec()``).
        path: File for ``npz``.
        feature_norm: ``none``, or ``row`` to divide each node's features by their L1
            norm (:meth:`GraphData.normalize_rows`).

    Raises:
        ValueError: unknown name or inconsistent arguments/data.
        FileNotFoundError: dataset files are absent and cannot be downloaded.
    """
    key = name.lower()
    if synthetic is not None and key != "synthetic":
        raise ValueError(f"synthetic spec given but dataset name is {name!r}")
    if path is not None and key != "npz":
        raise ValueError(f"path given but dataset name is {name!r}, not 'npz'")
    if feature_norm not in FEATURE_NORMS:
        raise ValueError(f"feature_norm must be 'none' or 'row', not {feature_norm!r}")
    # Every loader validates the graph where it builds it (GraphData.validate).
    if key in BUILTIN_DATASETS:
        graph = load_builtin(key, split_seed)
    elif key == "synthetic":
        graph = generate_synthetic(synthetic or SyntheticSpec(), split_seed)
    elif key == "npz":
        if path is None:
            raise ValueError("dataset 'npz' requires path=")
        graph = load_npz(Path(path))
    elif key.startswith("ogbn-"):
        graph = load_ogb(key, Path(root))
    else:
        names = [*BUILTIN_DATASETS, "synthetic", "npz", *supported_ogb_names()]
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(names)}")
    if feature_norm == "row":
        graph.normalize_rows()
    logger.info("loaded %r", graph)
    return graph
