"""``python -m adaqp.memory``: what a machine needs, said before launch.

``shapes``: each worker's inner rows, halo rows, edges and send rows, from the run's
partition or the graph's sizes; ``estimate``: each worker's predicted peak resident memory,
term by term; ``limits``: the host's memory (its cgroup limit, else the machine's);
``check``: the refusal the launcher and the emulated cluster give a run that would not fit.
docs/memory.md says how the prediction is made and how close it came to measured peaks.
"""
