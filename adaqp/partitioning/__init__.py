"""Partitions: cutting the graph into parts (``cut``), building the parts with their halos
(``build``) and the on-disk format every worker reads (``format``). ``python -m
partition`` is the command line over it."""
