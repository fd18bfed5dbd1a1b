"""A command-line flag's value for each host: one value for every host, or a
comma-separated list with exactly one per host (``--bandwidth 300mbit,300mbit,75mbit``).

The links' flags (``--bandwidth``, ``--latency``, ``--loss``: :mod:`adaqp.emulate.links`)
and the budgets' (``--cpus-per-host``, ``--memory-per-host``: :mod:`adaqp.emulate.cgroups`)
are read alike, so that a list of the wrong length fails with the same message for each.
"""

from __future__ import annotations


def per_host(name: str, text: str, num_hosts: int) -> list[str]:
    """Flag ``name``'s value ``text`` for each of ``num_hosts`` hosts: one item for all, or
    a comma-separated list with exactly one per host (items stripped; "" where left empty).

    Raises:
        ValueError: a list whose length is neither 1 nor ``num_hosts``.
    """
    values = [item.strip() for item in text.split(",")]
    if len(values) == 1:
        return values * num_hosts
    if len(values) != num_hosts:
        raise ValueError(
            f"{name} has {len(values)} values for {num_hosts} host{'s' * (num_hosts != 1)}: "
            "give one value for all hosts or exactly one per host"
        )
    return values
