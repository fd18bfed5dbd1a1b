"""AdaQP: distributed full-graph GNN training with quantized, overlapped halo exchange."""

__version__ = "0.1.0"
