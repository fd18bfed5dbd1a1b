"""AdaQP: distributed full-graph GNN training with quantized, overlapped halo exchange.

The data path, top to bottom (each package imports only those below it):

- ``train`` (``python -m adaqp.train``): the command line, one process per rank;
- ``run``: the trainer's epoch loop, gradient all-reduce, metrics, checkpoints, run dirs;
- ``model``: GCN / GraphSAGE layers over the local graph, exchanging halo rows;
- ``exchange``: the halo transport and the policies deciding how each exchange travels;
- ``assign``: cost models, profiling and the solvers choosing bit widths;
- ``quant``: stochastic quantization and the packed wire format; ``bits``: the widths.

Beside them: ``config`` (the TOML schema), ``runtime`` (process group and peers),
``graph`` (sparse aggregation, a worker's part in memory), ``partitioning`` (cut, build,
on-disk format), ``data`` (datasets), and ``bench`` (benchmarks, the emulated cluster).
"""

__version__ = "0.1.0"
