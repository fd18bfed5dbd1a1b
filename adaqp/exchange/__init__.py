"""The halo exchange: moving rows between ranks and deciding how each exchange travels.

- ``transport``: exchange keys, bit plans, the pending handles and the gloo/NCCL
  transfers of (quantized) rows;
- ``counters``: what one epoch's exchanges cost on one rank, and its reduction;
- ``policy``: the policy interface and the float32 policy (vanilla, adaqp-p, nocomm);
- ``adaptive`` and ``planner``: planned bit widths (adaqp-q, adaqp), the planner that
  traces the rows and asks ``adaqp.assign`` for widths;
- ``stale``: one-bit messages under bounded staleness (onebit).
"""
