"""The embedded datasets ``cora`` and ``citeseer``, shipped as npz files in this folder.

The files come from the gnn-benchmark collection (``LICENSE-gnn-benchmark.txt``) and store a
scipy-style CSR adjacency and bag-of-words attributes. :func:`load_builtin` symmetrises the
graph, keeps the raw binary bag-of-words features (no row normalisation) and draws a random
20-per-class / 500 / 1000 split (:func:`~adaqp.data.graph.random_split`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from adaqp.data.graph import GraphData, csr_from_edges, random_split

BUILTIN_DATASETS = ("cora", "citeseer")
"""The datasets shipped in this folder, by the name :func:`~adaqp.data.load_dataset` takes."""


def load_builtin(name: str, split_seed: int) -> GraphData:
    """Loads the embedded dataset ``name`` (one of :data:`BUILTIN_DATASETS`) as described
    above, with the random split drawn from ``split_seed``.

    Raises:
        FileNotFoundError: the dataset's file is missing from the package.
    """
    path = Path(__file__).parent / f"{name}.npz"
    if not path.is_file():
        raise FileNotFoundError(f"built-in dataset file {path} is missing from the package")
    with np.load(path, allow_pickle=False) as z:
        adj_shape = tuple(int(s) for s in z["adj_shape"])
        n = adj_shape[0]
        adj_indptr = z["adj_indptr"].astype(np.int64)
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(adj_indptr))
        # The file stores one directed edge per citation; citation direction is irrelevant.
        indptr, indices = csr_from_edges(rows, z["adj_indices"], n, symmetrize=True)
        attr_shape = tuple(int(s) for s in z["attr_shape"])
        features = np.zeros(attr_shape, dtype=np.float32)
        attr_rows = np.repeat(np.arange(attr_shape[0]), np.diff(z["attr_indptr"]))
        features[attr_rows, z["attr_indices"]] = z["attr_data"]
        labels = z["labels"].astype(np.int64)
        class_names = [str(s) for s in z["class_names"]]
    num_classes = len(class_names)
    masks = random_split(labels, num_classes, split_seed)
    info = {
        "source": "builtin",
        "file": path.name,
        "symmetrized": True,
        "split": "random_per_class",
        "split_seed": split_seed,
        "split_sizes": [int(m.sum()) for m in masks],
        "class_names": class_names,
        "metric": "acc",
    }
    graph = GraphData(name, indptr, indices, features, labels, *masks, num_classes, info=info)
    graph.validate()
    return graph
