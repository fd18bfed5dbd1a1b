"""Loads the compiled kernels at import, for a process that forks ranks (the forkserver of
tests/distributed.py, when listed in its preload): each forked rank then starts with them
loaded instead of loading them itself (about half a second of CPU a rank). Only loads and
compiles; numba's thread pool is not started, so forking afterwards is safe."""

from adaqp.quant import kernels

kernels.warm_up()
