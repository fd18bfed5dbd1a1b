"""Graph datasets for AdaQP: one in-memory format and loaders that produce it.

Every loader returns a :class:`GraphData` whose adjacency is a CSR of *in-edges*: row ``u``
lists the sources ``v`` of the edges ``v -> u`` (sorted, no duplicates, no self-loops), which
is the layout a GCN aggregation ``h_u = sum_v h_v`` consumes directly.

Sources accepted by :func:`load_dataset`:

* ``cora``, ``citeseer``: shipped in ``adaqp/data``; symmetrised, raw binary bag-of-words
  features (no row normalisation), random 20-per-class / 500 / 1000 split.
* ``synthetic``: a seeded contextual stochastic block model, see :class:`SyntheticSpec`
  (``docs/datasets.md`` tabulates how METIS cuts it with and without communities).
* ``ogbn-*`` (homogeneous OGB node datasets: ``ogbn-arxiv``, ``ogbn-products``,
  ``ogbn-papers100M``): read from OGB's raw layout under ``root/<name with _>/``, always
  symmetrised, official split; the csv layout's parsed arrays are cached in
  ``adaqp_cache.npz``, the binary layout's (``raw/data.npz``) are read mapped or in blocks,
  features in their stored float16.
* ``npz``: a user file given by ``path``, in the format documented in ``npz.py``;
  :func:`save_npz` writes it.

:func:`from_pyg` and :func:`from_dgl` convert in-memory PyG / DGL graphs (duck-typed, so
neither library is imported here).

Modules, one job each:

* ``graph``: :class:`GraphData`, its validation and fingerprint, :func:`csr_from_edges`,
  :func:`random_split` and the shared array-to-GraphData assembly;
* ``synthetic``: :class:`SyntheticSpec` and :func:`generate_synthetic`;
* ``builtin``: the embedded ``cora`` / ``citeseer`` files next to this one;
* ``ogb``: OGB node-property datasets: which layout, download and parse cache;
* ``ogb_csv``: OGB's csv layout, parsed in blocks (and the pieces both layouts share);
* ``ogb_binary``: OGB's binary layout (``ogbn-papers100M``), read without a second copy;
* ``npz_members``: ``.npz`` members read mapped or in blocks, and written in blocks;
* ``ogb_fixture``: any graph written in OGB's layout, marked synthetic;
* ``npz``: the ``npz`` file format, :func:`save_npz` and its reader;
* ``adapters``: :func:`from_pyg` and :func:`from_dgl`;
* ``load``: :func:`load_dataset`, dispatching a name to the loaders above.
"""

from __future__ import annotations

from adaqp.data.adapters import from_dgl, from_pyg
from adaqp.data.graph import GraphData, csr_from_edges, random_split
from adaqp.data.load import FEATURE_NORMS, load_dataset
from adaqp.data.npz import save_npz
from adaqp.data.synthetic import SyntheticSpec, generate_synthetic

__all__ = [
    "FEATURE_NORMS",
    "GraphData",
    "SyntheticSpec",
    "csr_from_edges",
    "from_dgl",
    "from_pyg",
    "generate_synthetic",
    "load_dataset",
    "random_split",
    "save_npz",
]
