"""The ``npz`` dataset format: a user file read by ``load_dataset("npz", path=...)``.

The file is read with ``allow_pickle=False``. Required keys: ``indptr`` int [N+1] and
``indices`` int [E] (in-edge CSR; rows may be unsorted or hold duplicates/self-loops, which
are normalised away), ``features`` float [N, F] (stored as float32), ``labels`` int [N]
(``-1`` = unlabelled) or 0/1 float [N, C] (multilabel), ``train_mask``/``val_mask``/
``test_mask`` bool [N]. Optional scalars: ``num_classes`` int (default inferred from
``labels``), ``multilabel`` bool (default ``labels.ndim == 2``), ``symmetrize`` bool (add
reverse edges; default False), ``name`` str (default the file stem), ``info`` str (JSON
provenance). :func:`save_npz` writes this format.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from adaqp.data.graph import (
    GRAPH_ARRAYS,
    MASK_ARRAYS,
    GraphData,
    assemble_graph,
    check_csr_structure,
    csr_from_edges,
    csr_problem,
    describe_dataset,
)


def save_npz(graph: GraphData, path: str | Path) -> None:
    """Writes ``graph`` in the documented ``npz`` format (see the module docstring)."""
    graph.validate()
    with open(path, "wb") as fh:
        np.savez(
            fh,
            **{key: getattr(graph, key) for key in GRAPH_ARRAYS},
            num_classes=np.int64(graph.num_classes),
            multilabel=np.bool_(graph.multilabel),
            name=np.str_(graph.name),
            info=np.str_(json.dumps(graph.info)),
        )


def load_npz(path: Path) -> GraphData:
    """Reads the ``npz`` file at ``path`` (the format above) into a validated GraphData.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not a readable npz archive or its arrays do not form a graph.
    """
    if not path.is_file():
        raise FileNotFoundError(f"npz dataset file {path} does not exist")
    # numpy reads any file that is not a zip as a single array or a pickle: check first, so
    # that a truncated or foreign file is named as such (and no one is told to unpickle it).
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not an .npz archive (a zip of .npy arrays, as numpy.savez and "
            "adaqp.data.save_npz write): truncated, or another format"
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files}
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise ValueError(f"{path} is a damaged .npz archive: {exc}") from exc
    except ValueError as exc:  # e.g. object arrays, which would need pickle
        raise ValueError(f"cannot read {path} without pickle: {exc}") from exc
    for key in GRAPH_ARRAYS:
        if key not in arrays:
            raise ValueError(f"{path} lacks required key {key!r} (required: {GRAPH_ARRAYS})")
    name = str(arrays.get("name", path.stem))
    where = describe_dataset(name, {"file": str(path)})
    indptr, indices = arrays["indptr"], arrays["indices"]
    for key, arr in (("indptr", indptr), ("indices", indices)):
        if not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1:
            raise ValueError(
                f"{where}: {key} must be a 1-D integer array, got {arr.dtype} {arr.shape}"
            )
    indptr, indices = indptr.astype(np.int64), indices.astype(np.int64)
    n = indptr.shape[0] - 1
    try:
        check_csr_structure(indptr, indices, n)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    symmetrize = bool(arrays.get("symmetrize", False))
    if symmetrize or csr_problem(indptr, indices) is not None:
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        indptr, indices = csr_from_edges(indices, rows, n, symmetrize=symmetrize)
    labels = arrays["labels"]
    try:
        info = json.loads(str(arrays["info"])) if "info" in arrays else {}
    except ValueError as exc:
        raise ValueError(f"{where}: key 'info' is not valid JSON: {exc}") from exc
    return assemble_graph(
        name,
        (indptr, indices, arrays["features"], labels, *(arrays[k] for k in MASK_ARRAYS)),
        int(arrays["num_classes"]) if "num_classes" in arrays else None,
        bool(arrays.get("multilabel", labels.ndim == 2)),
        {**info, "file": str(path)},
    )
