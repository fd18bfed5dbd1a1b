"""How each host's link is shaped: ``LinkSpec``, ``host_links`` and the ``tc`` qdiscs.

A ``LinkSpec`` holds one host's rate, delay and loss as tc spells them (``300mbit``,
``0.1ms``, ``0.1%``) and reads every value when it is made, so that a typo fails before
any namespace exists. ``host_links`` turns command-line values (one for every host or one
per host) into specs. ``shape`` puts a spec on one end of a link: netem for latency and
loss, tbf for the rate below it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from adaqp.emulate.hostvalues import per_host
from adaqp.emulate.netns import ClusterError, run_ip

# tc's units (tc/tc_util.c), matched case-insensitively as tc does; "bps" is bytes/s.
_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_PREFIXES |= {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_RATE_UNITS = {
    prefix + unit: scale * per_unit
    for unit, per_unit in (("bit", 1.0), ("bps", 8.0))
    for prefix, scale in _PREFIXES.items()
}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3}
_TIME_UNITS |= {"us": 1e-6, "usec": 1e-6, "usecs": 1e-6}
_NUMBER_UNIT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([a-z%]*)")


def _quantity(name: str, text: str, units: dict[str, float], example: str) -> float:
    match = _NUMBER_UNIT.fullmatch(text.strip().lower())
    if match is None or match[2] not in units:
        raise ValueError(f"{name}: cannot read {text!r}; expected {example}")
    return float(match[1]) * units[match[2]]


@dataclass
class LinkSpec:
    """Shaping of one host's link, applied to each direction; checked on construction."""

    bandwidth: str = "1gbit"
    """tc rate (e.g. 100mbit, 1gbit); empty for unshaped."""
    latency: str = ""
    """One-way delay added per link end (e.g. 0.1ms); empty for none."""
    loss: str = ""
    """Packet loss (e.g. 0.1%); empty for none."""

    def __post_init__(self) -> None:
        # Read every value once here, so that a typo fails before any namespace exists.
        if self.bandwidth and self.bits_per_s <= 0:
            raise ValueError(f"bandwidth: {self.bandwidth!r} must be above zero")
        _ = self.latency_s
        if not 0.0 <= self.loss_fraction <= 1.0:
            raise ValueError(f"loss: {self.loss!r} must lie between 0% and 100%")

    @property
    def bits_per_s(self) -> float | None:
        """The rate in bit/s, or None for an unshaped link."""
        if not self.bandwidth:
            return None
        return _quantity(
            "bandwidth", self.bandwidth, _RATE_UNITS, "a number and a unit, e.g. 300mbit or 1gbit"
        )

    @property
    def latency_s(self) -> float:
        if not self.latency:
            return 0.0
        return _quantity(
            "latency", self.latency, _TIME_UNITS, "a number and a unit, e.g. 0.1ms or 50us"
        )

    @property
    def loss_fraction(self) -> float:
        if not self.loss:
            return 0.0
        return _quantity("loss", self.loss, {"%": 0.01}, "a percentage, e.g. 0.1%")


def host_links(
    num_hosts: int, bandwidth: str = "1gbit", latency: str = "", loss: str = ""
) -> list[LinkSpec]:
    """One LinkSpec per host from command-line values.

    Each value is one setting for every host or a comma-separated list with exactly one
    setting per host (``"300mbit,300mbit,75mbit"``); an empty item means unshaped / none.

    Raises:
        ValueError: a list whose length is neither 1 nor ``num_hosts``, or a value tc
            would not read.
    """
    columns = [
        per_host(name, text, num_hosts)
        for name, text in (("bandwidth", bandwidth), ("latency", latency), ("loss", loss))
    ]
    return [LinkSpec(b, d, s) for b, d, s in zip(*columns, strict=True)]


def shape(ns: str, dev: str, spec: LinkSpec) -> None:
    """Shapes traffic leaving ``dev`` in namespace ``ns`` as ``spec`` says (egress only:
    each end of a link is shaped for its own direction)."""
    parent = ["root"]
    if spec.latency or spec.loss:
        netem = ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem"]
        if spec.latency:
            netem += ["delay", spec.latency]
        if spec.loss:
            netem += ["loss", spec.loss]
        try:
            run_ip(*netem, ns=ns)
        except ClusterError as exc:
            raise ClusterError(
                f"{exc}; latency and loss need the kernel's netem qdisc (sch_netem), "
                "which this machine lacks: shape bandwidth only"
            ) from None
        parent = ["parent", "1:"]
    if spec.bandwidth:
        run_ip(
            *("tc", "qdisc", "add", "dev", dev, *parent, "handle", "2:", "tbf"),
            *("rate", spec.bandwidth, "burst", "256kb", "latency", "400ms"),
            ns=ns,
        )
