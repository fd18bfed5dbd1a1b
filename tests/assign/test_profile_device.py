"""Every tensor a start-up probe hands a collective lives on the backend's device.

NCCL refuses CPU tensors, so a probe made on the CPU would fail a GPU run at start-up.
On a CPU-only machine the test makes "off the device" visible: it sets torch's default
device to ``meta`` while the probes run, so that a tensor created without
``device=world.device`` lands on ``meta``, and every collective checks the device of
what it is handed before gloo sees it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed import run_workers

COLLECTIVES = (
    "send",
    "recv",
    "all_reduce",
    "all_gather",
    "all_to_all_single",
    "gather",
    "broadcast",
)


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _probe_worker(rank: int, world_size: int, init_method: str):
    import torch
    import torch.distributed as dist

    from adaqp.assign import profile
    from adaqp.quant.bits import SUPPORTED_BITS
    from adaqp.runtime import World

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    world = World(rank, world_size, 0, world_size, torch.device("cpu"), "gloo")
    called: list[str] = []

    def checked(name, fn):
        def call(*args, **kwargs):
            for tensor in _tensors([*args, *kwargs.values()]):
                if tensor.device != world.device:
                    raise AssertionError(f"dist.{name} got a tensor on {tensor.device}")
            called.append(name)
            return fn(*args, **kwargs)

        return call

    for name in COLLECTIVES:
        setattr(dist, name, checked(name, getattr(dist, name)))
    for name in ("quantize_mixed", "dequantize_mixed"):
        # The kernels' own scratch (a CPU scalar that seeds the draws) is not a probe.
        setattr(profile, name, _on_cpu(getattr(profile, name)))
    torch.set_default_device("meta")
    try:
        links = profile.profile_links(world, profile.CHECK_SIZES, repeats=1)
        hosts = profile.host_of_rank(world)
        quant, dequant, scale = profile.time_quantization(
            SUPPORTED_BITS, 64, world, rows=64, repeats=1, sustain_s=0.005
        )
        model = profile.host_model(links, hosts, quant, dequant, cpu_scale=scale)
        fabric = profile.profile_fabric(model, world, repeats=1)
    finally:
        torch.set_default_device("cpu")
    dist.destroy_process_group()
    return {
        "called": np.array(sorted(set(called))),
        "beta": links.beta_Bps,
        "hosts": hosts,
        "fabric": np.array(fabric),
    }


def _on_cpu(fn):
    import torch

    def call(*args, **kwargs):
        with torch.device("cpu"):
            return fn(*args, **kwargs)

    return call


@pytest.mark.distributed
def test_every_probe_hands_its_collectives_tensors_on_the_worlds_device(tmp_path):
    results = run_workers(_probe_worker, 2, tmp_path)
    for result in results:
        # Every kind of collective the profile uses was checked, and it measured links.
        assert {"send", "recv", "all_reduce", "all_gather", "all_to_all_single"} <= set(
            result["called"].tolist()
        )
        assert (result["beta"][~np.eye(2, dtype=bool)] > 1).all()
        assert result["hosts"].tolist() == [0, 0]
    np.testing.assert_array_equal(results[0]["beta"], results[1]["beta"])
