"""Benchmarks that write their figures to ``results/bench/`` (``python -m adaqp.bench``)."""
