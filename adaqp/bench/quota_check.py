"""Does a CPU quota with the 10 ms CFS period cost what an exclusive core costs? (root, v1)

``python -m adaqp.bench.quota_check --repeats 3 --epochs 30`` trains the cluster workload
(``configs/cluster-synthetic-signal-gcn.toml``, no evaluation) on 2 emulated hosts of one
worker each, alternately under two budgets that both give each host one core:

- ``quota``: ``--cpus-per-host 1`` as ``adaqp.cluster`` sets it (a CFS quota of 10 ms per
  10 ms period, the host's threads free to run on any core);
- ``cpuset``: no quota, each host's processes pinned to a core of its own (a v1 ``cpuset``
  group beside the host's cpu/cpuacct/memory groups, ``cpuset.cpus`` = the host's index).

The two arms take turns (the first arm alternates between repeats), so that a slow minute
of this shared machine falls on both. It prints and writes (``--out``) each run's median
epoch time, both arms' means and their ratio, with the load average before each run.
The target: the two within 5%. ``--period-us`` runs the quota arm with another CFS period
(100000: the kernel's default), to tell the period's cost from the quota's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from adaqp.bench import SIGNAL_CONFIG
from adaqp.bench.cluster import read_run
from adaqp.cli.parser import Parser
from adaqp.emulate import Budget, EmulatedCluster, host_links
from adaqp.emulate.cgroups import CFS_PERIOD_US, CgroupTree, HostGroup, find_cgroups

CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
"""Where cgroup v1 mounts the cpuset controller (the groups go under this process's own)."""


@dataclass
class PinnedGroup(HostGroup):
    """A host group that also pins its processes to ``cpus`` (a v1 cpuset group)."""

    cpuset: Path = Path()
    cpus: str = "0"

    def create(self, budget: Budget) -> None:
        super().create(budget)
        self.made.append(self.cpuset)  # recorded first: remove() takes what was made
        self.cpuset.mkdir()
        # A cpuset group admits no process until both its cores and memory nodes are set.
        (self.cpuset / "cpuset.cpus").write_text(self.cpus)
        mems = (self.cpuset.parent / "cpuset.mems").read_text().strip()
        (self.cpuset / "cpuset.mems").write_text(mems)

    @property
    def procs_files(self) -> list[Path]:
        return [*super().procs_files, self.cpuset / "cgroup.procs"]


@dataclass(frozen=True)
class PinnedTree(CgroupTree):
    """The host groups of ``tree``, host ``i`` pinned to core ``i`` (modulo the cores)."""

    cpuset_base: Path = CPUSET_ROOT
    cores: list[int] = field(default_factory=lambda: sorted(os.sched_getaffinity(0)))

    def group(self, name: str) -> HostGroup:
        host = int(name.rpartition("-h")[2])
        return PinnedGroup(
            [base / name for base in self.bases],
            self.version,
            cpuset=self.cpuset_base / name,
            cpus=str(self.cores[host % len(self.cores)]),
        )


def _own_cpuset() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            return CPUSET_ROOT / path.lstrip("/")
    raise SystemExit("no v1 cpuset controller here: the check needs cgroup v1's cpuset")


def arm_budgets(arm: str, period_us: int) -> list[Budget]:
    """The two hosts' budgets in ``arm``: no quota where a core of its own is the budget
    (``cpuset``), else one core's quota per ``period_us`` (the cluster's 10 ms unless
    ``--period-us`` says otherwise)."""
    if arm == "cpuset":
        return [Budget(), Budget()]
    return [Budget(cpus=1.0, period_us=period_us)] * 2


def run_arm(arm: str, args: argparse.Namespace, repeat: int) -> dict:
    """One training job on 2 hosts under ``arm``'s budget; its epoch time and CPU use."""
    tree = find_cgroups()
    if arm == "cpuset":
        tree = PinnedTree(tree.version, tree.bases, cpuset_base=_own_cpuset())
    budgets = arm_budgets(arm, args.period_us)
    run_dir = Path("results/runs/bench-quota-check") / f"{arm}-{repeat}"
    train_args = [
        *("--config", SIGNAL_CONFIG, "--mode", args.mode, "--epochs", str(args.epochs)),
        *("--out", str(run_dir), "--overwrite"),
        *("--set", "checkpoint.every=0", "--set", "train.eval_every=0"),
        *("--set", "metrics.progress=false"),
        *("--set", "partition.dir=partitions/bench-quota-check"),
    ]
    load = os.getloadavg()[0]
    links = host_links(2, args.bandwidth)
    with EmulatedCluster(2, links=links, budgets=budgets, cgroups=tree) as cluster:
        cluster.launch(1, train_args, run_dir / "logs", args.timeout)
    run = read_run(run_dir)
    return {
        "arm": arm,
        "repeat": repeat,
        "epoch_time_s": run["summary"]["epoch_time_s"],
        "cpu_seconds": [h["cpu_seconds"] for h in run["cluster"]["hosts"]],
        "load_before": load,
    }


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m adaqp.bench.quota_check", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each arm")
    parser.add_argument("--epochs", type=int, default=30, help="epochs per run")
    parser.add_argument("--mode", default="vanilla", help="training mode of every run")
    parser.add_argument("--bandwidth", default="1gbit", help="each host's link")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument(
        "--period-us",
        type=int,
        default=CFS_PERIOD_US,
        help="CFS period of the quota arm in microseconds (the cluster's is 10000)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("results/local/bench/quota-check.json"),
        help="where the readings go (JSON)",
    )
    args = parser.parse_args(argv)
    runs = []
    for repeat in range(args.repeats):
        arms = ("quota", "cpuset") if repeat % 2 == 0 else ("cpuset", "quota")
        for arm in arms:
            started = time.perf_counter()
            runs.append(run_arm(arm, args, repeat))
            r = runs[-1]
            print(
                f"{arm} #{repeat}: epoch {1e3 * r['epoch_time_s']:.1f} ms, host CPU s "
                f"{r['cpu_seconds']}, load {r['load_before']:.2f} "
                f"({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
    means = {
        arm: statistics.fmean(r["epoch_time_s"] for r in runs if r["arm"] == arm)
        for arm in ("quota", "cpuset")
    }
    report = {
        "config": SIGNAL_CONFIG,
        "hosts": 2,
        "mode": args.mode,
        "epochs": args.epochs,
        "bandwidth": args.bandwidth,
        "cfs_period_us": args.period_us,
        "runs": runs,
        "mean_epoch_time_s": means,
        "quota_over_cpuset": means["quota"] / means["cpuset"],
        "command": "python -m adaqp.bench.quota_check " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"quota {1e3 * means['quota']:.1f} ms, cpuset {1e3 * means['cpuset']:.1f} ms: "
        f"ratio {report['quota_over_cpuset']:.3f} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
