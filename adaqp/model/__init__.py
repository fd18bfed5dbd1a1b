"""The GNN: layers that aggregate over the local graph and exchange halo rows through an
exchange policy (``layers``), and the stacked model (``gnn``)."""
