"""Partitions: cutting the graph into parts (``cut``), building the parts with their halos
(``build``) and the on-disk format every worker reads: what a partition directory holds
and the checks that refuse a damaged one or one made for another run (``schema``),
writing one atomically and loading one part (``store``). ``python -m partition`` is the
command line over it."""
