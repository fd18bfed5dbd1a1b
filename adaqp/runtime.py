"""Process-group and device set-up: the only module that names a device type.

Everything else receives a ``World`` and runs unchanged on CPU (gloo) and CUDA (NCCL).
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from adaqp.config import CommConfig
from adaqp.process.cores import usable_cores

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    job: str = ""
    """The job's identity: the same on every rank and in every worker group that torchrun
    starts for it (``job_identity``); recorded where the job's run goes."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def peak_memory_bytes(self) -> int:
        """Peak memory of this process: device memory on CUDA, resident set on CPU."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB

    def shares_cores(self) -> bool:
        """Whether every rank runs on this host's CPU and their threads outnumber its cores
        (``torch.get_num_threads()`` each, as ``init_distributed`` set them)."""
        if self.device.type != "cpu" or self.local_world_size < self.world_size:
            return False
        return self.local_world_size * torch.get_num_threads() > usable_cores()

    def synchronize(self) -> None:
        """Waits for queued device work, so wall-clock timings mean something."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def overlaps(setting: str, world: World) -> bool:
    """Whether an overlap mode splits its layers into central and marginal rows under
    ``comm.overlap = setting`` (see ``CommConfig.overlap``)."""
    if setting != "auto":
        return setting == "on"
    if world.shares_cores():
        if world.is_main:
            logger.info(
                "overlap off: %d ranks x %d threads share %d cores of one host, where an "
                'exchange is a copy by those cores (comm.overlap = "on" splits anyway)',
                world.local_world_size,
                torch.get_num_threads(),
                usable_cores(),
            )
        return False
    return True


def thread_count(setting: int, env, local_world_size: int, parent_env: bytes | None = None) -> int:
    """Intra-op threads for one worker: ``comm.threads``, else the user's
    ``OMP_NUM_THREADS``, else the usable cores shared among this host's workers.

    torchrun sets ``OMP_NUM_THREADS=1`` for its workers where the user set nothing and a
    host runs several; that default is no choice of the user's, and is told apart by the
    torchrun process's own environment at its start (``parent_env``: by default
    ``/proc/<parent>/environ``), which lacks the variable.
    """
    if setting:
        return setting
    share = max(1, usable_cores() // max(local_world_size, 1))
    text = env.get("OMP_NUM_THREADS", "")
    if not text.isdigit() or int(text) == 0:
        return share
    if text == "1" and "TORCHELASTIC_RUN_ID" in env:
        if parent_env is None:
            try:
                parent_env = Path(f"/proc/{os.getppid()}/environ").read_bytes()
            except OSError:
                parent_env = b"OMP_NUM_THREADS=?"  # unknown: take the setting as given
        if not any(v.startswith(b"OMP_NUM_THREADS=") for v in parent_env.split(b"\0")):
            return share
    return int(text)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(
    comm: CommConfig,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> World:
    """Joins (or, outside torchrun, creates a one-rank) process group.

    Under torchrun the rank and world size come from the environment; tests pass
    ``init_method`` (e.g. a ``file://`` rendezvous), ``rank`` and ``world_size``.
    """
    env = os.environ
    if rank is None:
        rank = int(env.get("RANK", 0))
        world_size = int(env.get("WORLD_SIZE", 1))
    local_rank = int(env.get("LOCAL_RANK", rank))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", world_size))

    want_cuda = comm.device == "cuda" or (comm.device == "auto" and torch.cuda.is_available())
    if want_cuda and not torch.cuda.is_available():
        raise RuntimeError("comm.device = cuda but no CUDA device is available")
    if want_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = comm.backend if comm.backend != "auto" else ("nccl" if want_cuda else "gloo")

    threads = thread_count(comm.threads, env, local_world_size)
    torch.set_num_threads(threads)

    timeout = timedelta(seconds=comm.timeout_s)
    if init_method is None and "MASTER_ADDR" not in env:
        init_method = f"tcp://127.0.0.1:{_free_port()}"
    job = _process_identity()  # no torchrun, no restarts: this process is the job
    if not dist.is_initialized():
        store = None
        if init_method is None:
            # Under torchrun the store can outlive a worker group that --max-restarts
            # replaces: the peers' addresses of the dead group are still in it, and a
            # restarted rank would dial them. Each attempt gets its own key space.
            store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
            job = job_identity(store, job)
            attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
            store = dist.PrefixStore(f"adaqp/attempt-{attempt}", store)
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
    logger.debug("rank %d/%d on %s (%s), %d threads", rank, world_size, device, backend, threads)
    return World(rank, world_size, local_rank, local_world_size, device, backend, job)


def _process_identity() -> str:
    """This process, told apart from any other on any host at any time: host, pid and
    the pid's start (in clock ticks since boot, so a reused pid differs)."""
    try:
        started = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = uuid.uuid4().hex  # no /proc: one per call, as good within one process
    return f"{socket.gethostname()}-{os.getpid()}-{started}"


def job_identity(store: dist.Store, proposal: str) -> str:
    """The identity of the torchrun job that ``store`` serves: the first proposal any rank
    of any attempt made. torchrun's rendezvous store outlives the worker groups it
    restarts (``--max-restarts``), so a restarted group learns its first attempt's
    identity; its rendezvous id cannot tell two jobs apart (every multi-host job of the
    launcher may use the default one)."""
    return store.compare_set("adaqp/job", "", proposal).decode()


def unresponsive_peers(world: World, step: str, grace_s: float = 5.0) -> list[int] | None:
    """After a failed collective: the ranks that do not report a failure within ``grace_s``.

    Every rank that sees the failure records it in the process group's store; a peer
    that is stopped, hung or dead records nothing, and is named. Returns None when the
    store cannot be reached (it may have lived in a lost process).
    """
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"adaqp/failed/{world.rank}", step)
        missing = {q for q in range(world.world_size) if q != world.rank}
        deadline = time.monotonic() + grace_s
        while missing and time.monotonic() < deadline:
            missing = {q for q in missing if not store.check([f"adaqp/failed/{q}"])}
            if missing:
                time.sleep(0.1)
        return sorted(missing)
    except Exception:  # the store's owner may be the lost process
        return None


def shutdown(barrier: bool = True) -> None:
    """Leaves the process group; by default after all ranks arrive, so that no rank
    tears down its transport while a peer still talks to it."""
    if not dist.is_initialized():
        return
    if barrier:
        dist.barrier()
    dist.destroy_process_group()
