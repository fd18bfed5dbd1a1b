"""python -m adaqp.bench quant on a tiny message: every field it promises, wire format agreed."""

from __future__ import annotations

import json

import torch

from adaqp.bench import quant


def test_quant_bench_writes_its_fields(tmp_path):
    threads = torch.get_num_threads()
    try:
        report = quant.run(rows=64, dim=24, repeats=2, seed=0, out=tmp_path / "quant.json")
    finally:
        torch.set_num_threads(threads)
    assert json.loads((tmp_path / "quant.json").read_text()) == report
    assert set(report["kernel_speedup_by_bits"]) == {"1", "2", "4", "8"}
    assert all(v > 0 for v in report["kernel_speedup_by_bits"].values())
    for bits in ("1", "2", "4", "8"):
        assert report["kernel_ns_per_value_by_bits"][bits]["total"] > 0
        width = report["widths"][bits]
        assert {"reference", "new", "compiled", "speedup", "kernel_speedup"} <= set(width)
        assert width["cross_decode_torch_vs_compiled_max_abs_diff"] == 0.0  # bit for bit
    assert report["memory_bandwidth"]["copy_ns_per_value"] > 0
    assert report["dropout_speedup"] > 0 and report["speedup"] > 0
    average = report["stale_average"]
    assert average["bits"] == 1 and average["speedup"] > 0
    assert average["fused_ns_per_value"] > 0 and average["decode_then_lerp_ns_per_value"] > 0
    exchange = report["exchange_message"]
    assert exchange["rows"] == 3 * 2130 and exchange["distinct"] < exchange["rows"]
    for dim in ("dim_256", "dim_8"):
        sides = exchange[dim]
        assert all(
            sides[f"{side}_us"] > 0 for side in ("per_segment", "one_call", "one_call_dedup")
        )
        assert sides["speedup_one_call"] > 0 and sides["speedup_one_call_dedup"] > 0
    assert report["threads"] == 1
