"""An emulated multi-host cluster on one machine: real TCP over shaped links.

``python -m adaqp.cluster --hosts H --procs-per-host K --bandwidth 1gbit --latency 0.1ms
-- [adaqp.train flags]`` (root only) builds H network namespaces ("hosts"), each joined to
a switch namespace (a Linux bridge) by a veth pair whose both ends are shaped with ``tc``
(netem for latency and loss, tbf for the rate), then starts on every host::

    torchrun --nnodes H --node-rank i --nproc-per-node K --rdzv-backend c10d \\
             --rdzv-endpoint <host 0>:29400 -m adaqp.train [flags]

with ``GLOO_SOCKET_IFNAME`` set to the host's link: exactly the command a real multi-node
run uses, only the hosts and links are emulated. Hosts may differ: ``--bandwidth``,
``--latency`` and ``--loss`` take one value for every host or a comma-separated list with
exactly one value per host (``--bandwidth 300mbit,300mbit,300mbit,75mbit``). A host's rate
and delay apply to each direction of its link (full duplex); its K workers share that link,
and traffic between them stays on the host. Each job writes ``cluster.json`` (see
``EmulatedCluster.describe``) into its log directory and hands its path to the workers in
``ADAQP_CLUSTER_SPEC``, with the worker's host index in ``ADAQP_CLUSTER_HOST``.

Every host's processes (torchrun and its workers) run in a control group of the host's
own, v1 or v2: ``--cpus-per-host`` is a CPU quota (default: the usable cores shared among
the hosts; the workers' threads follow it) and ``--memory-per-host`` a memory limit
(default: none). ``cluster.json`` records each host's budget and, after the job, what its
group used (``cpu_seconds``, ``peak_memory_bytes``) and the job's wall time
(``elapsed_s``). A host that runs out of memory stops the job at once with one line that
names the host, its limit and its peak (the kernel's count of OOM kills decides, not the
peak). Each job's logs go to a folder of their own (``results/runs/cluster-logs``, then
``-v2``, ...).

Every namespace, link and control group is removed on success, failure, timeout, Ctrl-C
and SIGTERM, also while the hosts are still being built: a namespace is recorded before it
is made, veth pairs are born inside the namespaces (never in the machine's own), a host
job is recorded in the same step that starts it, and teardown holds SIGINT and SIGTERM
until it is done. Addresses live only inside the namespaces this package creates
(``10.213.<n>.0/24``); every run is bounded in time.

Modules: ``netns`` (the ``ip`` commands, bridge and veth pairs), ``hostvalues`` (a flag's
value for each host), ``links`` (``LinkSpec``, ``host_links`` and tc shaping), ``cgroups``
(``Budget``, ``host_budgets`` and the hosts' control groups), ``cgroup_leaf`` (cgroup v2:
this process's group emptied into a leaf so that its children may use controllers),
``signals`` (signals held during teardown), ``cluster`` (``EmulatedCluster``: build, run,
tear down) and ``cli`` (``main``, the command line). A tool beside the trainer, which it
runs; the benchmarks that need hosts (:mod:`adaqp.bench`) drive it.
"""

from adaqp.emulate.cgroups import Budget, CgroupError, host_budgets
from adaqp.emulate.cli import main
from adaqp.emulate.cluster import HOST_ENV, RDZV_PORT, SPEC_ENV, EmulatedCluster
from adaqp.emulate.links import LinkSpec, host_links
from adaqp.emulate.netns import ClusterError

__all__ = [
    "HOST_ENV",
    "Budget",
    "CgroupError",
    "RDZV_PORT",
    "SPEC_ENV",
    "ClusterError",
    "EmulatedCluster",
    "LinkSpec",
    "host_budgets",
    "host_links",
    "main",
]
