"""A worker's graph in memory: the sparse aggregation operator (``aggregate``) and the
part a worker owns with its halo (``local``), built from a partition on disk."""
