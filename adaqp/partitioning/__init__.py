"""Partitions: cutting the graph into parts (``cut``), building the parts with their halos
(``build``) and the on-disk format every worker reads: what a partition directory holds
and the checks that refuse a damaged one or one made for another run (``schema``),
writing one atomically and loading one part (``store``), and the scratch files kept
beside a partition while it is made, which say whose they are (``scratch``).
``python -m partition`` is the command line over it."""
