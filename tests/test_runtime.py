"""adaqp.runtime: the World, a one-rank process group, and naming unresponsive peers."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from adaqp.config import CommConfig
from adaqp.runtime import (
    World,
    init_distributed,
    overlaps,
    shutdown,
    thread_count,
    unresponsive_peers,
    usable_cores,
)
from tests.distributed import run_workers

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _cpu_world(rank: int = 0, world_size: int = 1) -> World:
    return World(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")


@pytest.fixture
def clean_group(monkeypatch):
    """No process group before or after; torch's thread count restored."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    for key in _ENV:
        monkeypatch.delenv(key, raising=False)
    threads = torch.get_num_threads()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.set_num_threads(threads)


def _status_bytes(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def test_is_main_only_for_rank_zero():
    assert _cpu_world(0, 3).is_main
    assert not _cpu_world(1, 3).is_main
    assert not _cpu_world(2, 3).is_main


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_peak_memory_on_cpu_is_the_resident_high_water_mark():
    world = _cpu_world()
    before = _status_bytes("VmHWM")
    peak = world.peak_memory_bytes()
    after = _status_bytes("VmHWM")
    assert peak > 0
    # The same high-water mark; the kernel syncs per-thread RSS counters lazily, so
    # the two readings may differ by a few pages.
    slack = 4 << 20
    assert before - slack <= peak <= after + slack
    # Touching 64 MiB more than the process ever held raises the peak by about that.
    extra = max(0, after - _status_bytes("VmRSS")) + (64 << 20)
    big = np.ones(extra // 8, dtype=np.float64)
    assert world.peak_memory_bytes() >= after + (48 << 20)
    del big


def test_init_distributed_one_rank_gloo(clean_group, tmp_path):
    comm = CommConfig(backend="gloo", device="cpu", timeout_s=30, threads=1)
    world = init_distributed(comm, f"file://{tmp_path / 'rendezvous'}", 0, 1)
    assert dataclasses.replace(world, job="") == World(0, 1, 0, 1, torch.device("cpu"), "gloo")
    assert str(os.getpid()) in world.job  # no torchrun, no restarts: the process is the job
    assert world.is_main
    assert dist.is_initialized()
    assert dist.get_world_size() == 1 and dist.get_rank() == 0
    assert dist.get_backend() == "gloo"
    assert torch.get_num_threads() == 1
    # A collective over the one rank is the identity.
    t = torch.tensor([1.5, -2.0])
    dist.all_reduce(t)
    torch.testing.assert_close(t, torch.tensor([1.5, -2.0]))
    # Calling again joins the group already there instead of failing.
    assert init_distributed(comm, f"file://{tmp_path / 'other'}", 0, 1) == world
    # No peer: nobody is missing.
    assert unresponsive_peers(world, "epoch 1", grace_s=0.5) == []
    shutdown()
    assert not dist.is_initialized()
    shutdown()  # no group: nothing to do


def test_init_distributed_outside_torchrun_creates_a_one_rank_group(clean_group):
    comm = CommConfig(backend="auto", device="cpu", timeout_s=30, threads=2)
    world = init_distributed(comm)  # no RANK, no MASTER_ADDR: a local tcp rendezvous
    assert (world.rank, world.world_size, world.local_rank, world.local_world_size) == (0, 1, 0, 1)
    assert world.device == torch.device("cpu") and world.backend == "gloo"
    assert dist.get_backend() == "gloo"
    assert torch.get_num_threads() == 2
    shutdown(barrier=False)
    assert not dist.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_init_distributed_refuses_cuda_without_a_device(clean_group, tmp_path):
    with pytest.raises(RuntimeError, match="no CUDA device"):
        init_distributed(CommConfig(device="cuda"), f"file://{tmp_path / 'r'}", 0, 1)
    assert not dist.is_initialized()


def test_unresponsive_peers_without_a_group_is_none(clean_group):
    assert unresponsive_peers(_cpu_world(0, 2), "epoch 1", grace_s=0.1) is None


def _peers_worker(rank: int, world_size: int, init_method: str):
    world = init_distributed(CommConfig(timeout_s=60, device="cpu"), init_method, rank, world_size)
    try:
        out = {}
        if rank == 0:  # rank 1 has not reported a failure yet: it is named
            out["first"] = np.array(unresponsive_peers(world, "epoch 2", grace_s=0.3))
        dist.barrier()
        # Now each reports; rank 0's report is already in the store.
        out["second"] = np.array(unresponsive_peers(world, "epoch 2", grace_s=5.0))
        return out
    finally:
        shutdown()


@pytest.mark.distributed
def test_unresponsive_peers_names_the_rank_that_did_not_report(tmp_path):
    results = run_workers(_peers_worker, 2, tmp_path, timeout=120.0)
    assert results[0]["first"].tolist() == [1]
    assert results[0]["second"].tolist() == []
    assert results[1]["second"].tolist() == []


def _world(world_size: int, local_world_size: int, device: str = "cpu") -> World:
    return World(0, world_size, 0, local_world_size, torch.device(device), "gloo")


@pytest.mark.parametrize(
    ("world", "threads", "cores", "split"),
    [
        (_world(4, 4), 1, 2, False),  # four ranks on two cores: a wait is a peer computing
        (_world(4, 4), 2, 6, False),  # eight threads on six cores
        (_world(4, 4), 2, 8, True),  # a core for every thread: a wait leaves one idle
        (_world(2, 2), 1, 2, True),
        (_world(4, 1), 1, 1, True),  # one rank per host: the exchange crosses a network
        (_world(4, 2), 4, 2, True),  # two hosts: the same
        (_world(4, 4, "cuda"), 1, 2, True),  # device copies do not take the cores
    ],
)
def test_auto_overlap_is_off_only_where_the_ranks_share_one_hosts_cores(
    world, threads, cores, split, monkeypatch
):
    monkeypatch.setattr("adaqp.runtime.usable_cores", lambda: cores)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert world.shares_cores() is not split
    assert overlaps("auto", world) is split
    assert overlaps("on", world) and not overlaps("off", world)


@pytest.mark.parametrize(
    ("cpu_max", "cores"),
    [
        ("max 100000\n", None),
        ("150000 100000\n", 2),
        ("50000 100000", 1),
        ("garbled", None),
        ("5 0", None),
    ],
)
def test_usable_cores_follow_a_cgroup_quota(cpu_max, cores, tmp_path):
    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text(cpu_max)
    expected = affinity if cores is None else min(cores, affinity)
    assert usable_cores(str(tmp_path / "cpu.max")) == expected
    assert usable_cores(str(tmp_path / "absent")) == affinity


def test_threads_share_the_usable_cores_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr("adaqp.runtime.usable_cores", lambda: 8)
    assert thread_count(0, {}, 1) == 8  # one worker a host: every core
    assert thread_count(0, {}, 4) == 2
    assert thread_count(0, {}, 16) == 1
    assert thread_count(3, {"OMP_NUM_THREADS": "5"}, 4) == 3  # comm.threads wins
    assert thread_count(0, {"OMP_NUM_THREADS": "5"}, 4) == 5  # then the user's variable
    assert thread_count(0, {"OMP_NUM_THREADS": "1"}, 4) == 1
    # torchrun's own default for several workers a host (its environment at start lacks
    # the variable) is no choice: the cores are shared out.
    torchrun = {"OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "x"}
    assert thread_count(0, torchrun, 4, parent_env=b"PATH=/bin\0HOME=/root\0") == 2
    assert thread_count(0, torchrun, 4, parent_env=b"PATH=/bin\0OMP_NUM_THREADS=1\0") == 1
    assert thread_count(0, {"OMP_NUM_THREADS": "junk"}, 2) == 4
