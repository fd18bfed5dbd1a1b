"""Quantizer throughput: quantize + pack and unpack + dequantize per value, one thread, at each
bit width, for three implementations side by side in one run: the compiled CPU kernels
(``adaqp.quant.compiled``, the default on CPU), the torch path
(``adaqp.quant.rows``/``mixed``, the reference and the path for CUDA) and the implementation
the torch path replaced. Also the dropout mask (``adaqp.model.dropout``) against nn.Dropout,
and a copy of the message's bytes (the machine's memory bandwidth, the limit the kernels
approach), and the moving average of stale one-bit rows decoded straight into it against
decoded then averaged, and one forward exchange's buffer of peer segments encoded and
decoded a segment at a time, in one call, and in one call that quantizes a row sent to
several peers once (``exchange_message``). Writes ``<--out-dir>/quant.json`` (by default
``results/local/bench/``; ``--out-dir results/bench/quant/20000x256`` updates the committed
reading); the figures that matter are ratios within one run: ``kernel_speedup_by_bits``
(torch path / compiled kernels), ``dropout_speedup`` (nn.Dropout / the compiled mask) and
``speedup`` (the replaced implementation / the torch path, at 2 bits). Every side is warmed
up (the compiled kernels loaded or compiled, a first round dropped) and the sides take turns
in every repeat.

The replaced implementation is a frozen copy of ``adaqp/quant.py`` as of commit ef412a7
(``adaqp/bench/quant_reference.py``), so that all run side by side in one process. The wire
format is the same, which the run checks by decoding each side's buffers with the others'
decoders.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from adaqp.bench import add_out_options, out_file
from adaqp.bench.quant_reference import reference_dequantize_mixed, reference_quantize_mixed
from adaqp.exchange import message
from adaqp.exchange.message import MessageLayout
from adaqp.model.dropout import Dropout
from adaqp.quant import kernels as quant_kernels
from adaqp.quant.bits import SUPPORTED_BITS
from adaqp.quant.draws import Draw, RowKeys, draw_key
from adaqp.quant.mixed import dequantize_mixed, mixed_buffer_bytes, quantize_mixed
from adaqp.quant.rows import row_step
from adaqp.quant.segment import decode_segment, encode_segment

logger = logging.getLogger(__name__)


TARGET_SPEEDUP = 2.0
TARGET_KERNEL_SPEEDUP = 4.0  # torch path / compiled kernels, at every width
TARGET_DROPOUT_SPEEDUP = 3.0  # nn.Dropout / the compiled mask
_METRIC_BITS = 2  # width of the headline figure

# --------------------------------------------------------------------------- benchmark

Quantizer = Callable[[Tensor, Tensor, int, Tensor], Tensor]  # (x, widths, seed, out)
Dequantizer = Callable[[Tensor, Tensor, int, Tensor], Tensor]


def _keys(x: Tensor, seed: int) -> RowKeys:
    """A plain call's keys: rows keyed by index under the base key ``seed``."""
    return RowKeys.of(seed, count=x.shape[0])


SIDES: dict[str, tuple[Quantizer, Dequantizer]] = {
    "reference": (  # drew from a generator (it predates the keyed draws)
        lambda x, b, s, out: reference_quantize_mixed(x, b, torch.Generator().manual_seed(s), out),
        lambda buf, b, dim, out: reference_dequantize_mixed(buf, b, dim, out=out),
    ),
    "new": (  # the torch path (the subject of the ``speedup`` figure, hence its name)
        lambda x, b, s, out: quantize_mixed(x, b, out=out, kernels="torch", keys=_keys(x, s)),
        lambda buf, b, dim, out: dequantize_mixed(buf, b, dim, out=out, kernels="torch"),
    ),
    "compiled": (
        lambda x, b, s, out: quantize_mixed(x, b, out=out, kernels="compiled", keys=_keys(x, s)),
        lambda buf, b, dim, out: dequantize_mixed(buf, b, dim, out=out, kernels="compiled"),
    ),
}


def _agreement(x: Tensor, bits_R: Tensor, recon: dict[str, Tensor]) -> dict[str, float | bool]:
    """Every side's reconstruction of the same rows: mean error (in steps) and MSE ratio.

    Each side's mean error should be zero within a few standard errors (unbiased), and the
    MSEs (the quantization variance) should match closely over millions of values.
    """
    step = row_step(x.amin(1), x.amax(1), (2 ** bits_R.to(torch.int32) - 1).float())
    report: dict[str, float | bool] = {}
    for side, xhat in recon.items():
        err = (xhat.double() - x.double()) / step.double().clamp(min=1e-30)[:, None]
        mean, sd = float(err.mean()), float(err.std())
        report[f"{side}_mean_error_steps"] = mean
        report[f"{side}_mean_error_z"] = mean / (sd / err.numel() ** 0.5)
        report[f"{side}_mse_steps2"] = float((err**2).mean())
    agrees = True
    for side in ("new", "compiled"):
        ratio = report[f"{side}_mse_steps2"] / report["reference_mse_steps2"]
        report[f"mse_ratio_{side}_over_reference"] = ratio
        agrees = agrees and abs(report[f"{side}_mean_error_z"]) < 5 and abs(ratio - 1) < 0.02
    report["agrees"] = agrees
    return report


def _cross_decode(x: Tensor, bits_R: Tensor, seed: int) -> dict[str, float]:
    """Largest difference between the decoders on each encoder's buffer (wire format): the
    torch path and the compiled kernels decode alike to the bit; the replaced decoder can
    miss M by an ulp at one bit."""
    dim, worst = x.shape[1], {"all": 0.0, "new_vs_compiled": 0.0}
    for quantize, _ in SIDES.values():
        buf = torch.empty(mixed_buffer_bytes(bits_R, dim), dtype=torch.uint8)
        quantize(x, bits_R, seed, buf)
        decoded = {
            side: dequantize(buf, bits_R, dim, torch.empty_like(x))
            for side, (_, dequantize) in SIDES.items()
        }
        for side in ("new", "compiled"):
            gap = float((decoded[side] - decoded["reference"]).abs().max())
            worst["all"] = max(worst["all"], gap)
        gap = float((decoded["new"] - decoded["compiled"]).abs().max())
        worst["new_vs_compiled"] = max(worst["new_vs_compiled"], gap)
    return worst


def _per_value(samples: list[float], values: int) -> float:
    return statistics.median(samples) / values * 1e9


def _time_widths(x: Tensor, repeats: int, seed: int) -> dict[str, dict]:
    rows, dim = x.shape
    values = x.numel()
    widths = {}
    for bits in SUPPORTED_BITS:
        bits_R = torch.full((rows,), bits, dtype=torch.int8)
        size = mixed_buffer_bytes(bits_R, dim)
        send = {side: torch.empty(size, dtype=torch.uint8) for side in SIDES}
        recv = {side: torch.empty(rows, dim) for side in SIDES}
        cpu = {side: {"quantize": [], "dequantize": [], "total": []} for side in SIDES}
        wall = {side: [] for side in SIDES}
        for rep in range(repeats + 1):  # the first round warms up and is dropped
            for side, (quantize, dequantize) in SIDES.items():  # interleaved: same conditions
                w0, t0 = time.perf_counter(), time.thread_time()
                quantize(x, bits_R, seed + 1000 * bits + rep, send[side])
                t1 = time.thread_time()
                dequantize(send[side], bits_R, dim, recv[side])
                t2, w2 = time.thread_time(), time.perf_counter()
                if rep:
                    cpu[side]["quantize"].append(t1 - t0)
                    cpu[side]["dequantize"].append(t2 - t1)
                    cpu[side]["total"].append(t2 - t0)
                    wall[side].append(w2 - w0)
        per_side = {
            side: {
                **{f"{k}_ns_per_value": _per_value(v, values) for k, v in cpu[side].items()},
                "total_wall_ns_per_value": _per_value(wall[side], values),
            }
            for side in SIDES
        }
        ref, new, fast = per_side["reference"], per_side["new"], per_side["compiled"]
        cross = _cross_decode(x, bits_R, seed)
        widths[str(bits)] = {
            **per_side,
            "speedup": ref["total_ns_per_value"] / new["total_ns_per_value"],
            "speedup_quantize": ref["quantize_ns_per_value"] / new["quantize_ns_per_value"],
            "speedup_dequantize": ref["dequantize_ns_per_value"] / new["dequantize_ns_per_value"],
            "speedup_wall": ref["total_wall_ns_per_value"] / new["total_wall_ns_per_value"],
            "kernel_speedup": new["total_ns_per_value"] / fast["total_ns_per_value"],
            "kernel_speedup_quantize": new["quantize_ns_per_value"] / fast["quantize_ns_per_value"],
            "kernel_speedup_dequantize": (
                new["dequantize_ns_per_value"] / fast["dequantize_ns_per_value"]
            ),
            "kernel_speedup_wall": new["total_wall_ns_per_value"] / fast["total_wall_ns_per_value"],
            "agreement": _agreement(x, bits_R, recv),
            "cross_decode_max_abs_diff": cross["all"],
            "cross_decode_torch_vs_compiled_max_abs_diff": cross["new_vs_compiled"],
        }
        logger.info(
            "%d bits: reference %.2f, torch %.2f, compiled %.2f (%.2f + %.2f) ns/value -> "
            "%.2fx the torch path",
            bits,
            ref["total_ns_per_value"],
            new["total_ns_per_value"],
            fast["total_ns_per_value"],
            fast["quantize_ns_per_value"],
            fast["dequantize_ns_per_value"],
            widths[str(bits)]["kernel_speedup"],
        )
    return widths


def _time_copy(x: Tensor, repeats: int) -> dict[str, float]:
    """A copy of the message's float32 bytes (read 4, write 4 bytes a value): the memory
    bandwidth the kernels approach, which read the rows and write the rows back."""
    out = torch.empty_like(x)
    times = []
    for rep in range(repeats + 1):
        t0 = time.thread_time()
        out.copy_(x)
        if rep:
            times.append(time.thread_time() - t0)
    ns = _per_value(times, x.numel())
    return {"copy_ns_per_value": ns, "copy_GB_per_s": 8 / ns}


def _time_dropout(x: Tensor, repeats: int, p: float) -> dict[str, float]:
    """nn.Dropout against the compiled mask, forward and forward + backward, interleaved."""
    sides = {"nn": nn.Dropout(p), "compiled": Dropout(p, "compiled")}
    # The compiled mask is keyed (a base key, a global id a row): the keys a layer passes.
    keys = {"nn": (), "compiled": (RowKeys.of(draw_key(0, 1, 0, Draw.DROPOUT), count=len(x)),)}
    grad = torch.ones_like(x)
    forward = {side: [] for side in sides}
    both = {side: [] for side in sides}
    for rep in range(repeats + 1):
        for side, module in sides.items():
            leaf = x.detach().requires_grad_()
            t0 = time.thread_time()
            y = module(leaf, *keys[side])
            t1 = time.thread_time()
            y.backward(grad)
            t2 = time.thread_time()
            if rep:
                forward[side].append(t1 - t0)
                both[side].append(t2 - t0)
    values = x.numel()
    report = {"p": p}
    for side in sides:
        report[f"{side}_forward_ns_per_value"] = _per_value(forward[side], values)
        report[f"{side}_forward_backward_ns_per_value"] = _per_value(both[side], values)
    report["speedup_forward_backward"] = (
        report["nn_forward_backward_ns_per_value"]
        / report["compiled_forward_backward_ns_per_value"]
    )
    report["speedup"] = report["nn_forward_ns_per_value"] / report["compiled_forward_ns_per_value"]
    return report


def _interleaved(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, list]:
    """Thread CPU seconds of each side's call, the sides taking turns in every repeat after a
    dropped warm-up round."""
    times = {side: [] for side in sides}
    for rep in range(repeats + 1):
        for side, step in sides.items():
            t0 = time.thread_time()
            step()
            if rep:
                times[side].append(time.thread_time() - t0)
    return times


def _time_blend(x: Tensor, repeats: int, seed: int, bits: int = 1) -> dict[str, float]:
    """The moving average of stale rows (``average += w·(rows - average)``) at one bit on the
    compiled path: decoded into a new tensor then ``lerp_`` (as before the fused decoder)
    against decoded straight into the average, interleaved."""
    rows, dim = x.shape
    bits_R = torch.full((rows,), bits, dtype=torch.int8)
    buf = quantize_mixed(x, bits_R, kernels="compiled", keys=_keys(x, seed))
    lerped, fused = torch.zeros_like(x), torch.zeros_like(x)
    sides = {
        "decode_then_lerp": lambda: lerped.lerp_(
            dequantize_mixed(buf, bits_R, dim, kernels="compiled"), 0.1
        ),
        "fused": lambda: dequantize_mixed(buf, bits_R, dim, fused, "compiled", blend=0.1),
    }
    times = _interleaved(sides, repeats)
    report = {f"{side}_ns_per_value": _per_value(t, x.numel()) for side, t in times.items()}
    report["bits"] = bits
    report["speedup"] = report["decode_then_lerp_ns_per_value"] / report["fused_ns_per_value"]
    return report


def _exchange_sources(peers: int, rows: int, distinct: int, seed: int) -> Tensor:
    """The inner row behind each row of a forward exchange: ``rows`` of ``distinct`` inner
    rows for each of ``peers`` peers, so that some go to several (on the README cluster
    workload a rank sends 6,387 rows, 3,755 of them distinct, to 3 peers)."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat(
        [torch.randperm(distinct, generator=g)[:rows].sort().values for _ in range(peers)]
    )


def _time_exchange(repeats: int, seed: int, peers: int = 3, rows: int = 2130) -> dict:
    """One direction of a one-bit forward exchange of the README cluster workload's size,
    encoded and decoded: a call per peer segment (as the transport did before), one call
    for all segments, and one call that quantizes a row sent to several peers once;
    256-wide and 8-wide rows, interleaved. Microseconds per exchange, encode + decode."""
    sources = _exchange_sources(peers, rows, 3750, seed)
    report: dict = {"peers": peers, "rows": len(sources), "distinct": len(sources.unique())}
    for dim in (256, 8):
        x = torch.randn(3750, dim, generator=torch.Generator().manual_seed(seed))[sources]
        report[f"dim_{dim}"] = _time_exchange_sides(x, sources, [rows] * peers, repeats, seed)
    return report


def _time_exchange_sides(
    x: Tensor, sources: Tensor, counts: list[int], repeats: int, seed: int
) -> dict[str, float]:
    dim = x.shape[1]
    bits_R = torch.ones(len(sources), dtype=torch.int8)
    plain = MessageLayout(bits_R, counts, dim)
    dedup = MessageLayout(bits_R, counts, dim, sources)
    buf = torch.empty(sum(plain.segment_bytes), dtype=torch.uint8)
    out = torch.empty_like(x)
    keys = _keys(x, seed)  # as the transport keys a message: one key a row

    def per_segment():
        seg_keys = iter(keys.split(counts))
        for seg_x, seg_bits, seg_buf in plain.segments(x, buf):
            encode_segment(seg_x, seg_bits, seg_buf, False, "compiled", next(seg_keys))
        for seg_out, seg_bits, seg_buf in plain.segments(out, buf):
            decode_segment(seg_buf, seg_bits, dim, seg_out, False, "compiled")

    def one_call(layout: MessageLayout):
        message.encode(x, layout, buf, False, "compiled", keys)
        message.decode(buf, layout, out, False, "compiled")

    sides = {
        "per_segment": per_segment,
        "one_call": lambda: one_call(plain),
        "one_call_dedup": lambda: one_call(dedup),
    }
    times = _interleaved(sides, repeats)
    us = {side: 1e6 * statistics.median(t) for side, t in times.items()}
    return {
        **{f"{side}_us": value for side, value in us.items()},
        "speedup_one_call": us["per_segment"] / us["one_call"],
        "speedup_one_call_dedup": us["per_segment"] / us["one_call_dedup"],
    }


def run(rows: int, dim: int, repeats: int, seed: int, out: Path) -> dict:
    torch.set_num_threads(1)
    if not quant_kernels.warm_up():  # loaded from numba's cache, or compiled once
        raise RuntimeError("the compiled kernels cannot run here (is numba installed?)")
    load_at_start = os.getloadavg()[0]
    x = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))
    widths = _time_widths(x, repeats, seed)
    copy = _time_copy(x, repeats)
    dropout = _time_dropout(x, repeats, 0.5)
    blend = _time_blend(x, repeats, seed)
    exchange = _time_exchange(repeats, seed)
    speedup = widths[str(_METRIC_BITS)]["speedup"]
    by_bits = {bits: w["kernel_speedup"] for bits, w in widths.items()}
    kernel_ns = {
        bits: {k: w["compiled"][f"{k}_ns_per_value"] for k in ("quantize", "dequantize", "total")}
        for bits, w in widths.items()
    }
    report = {
        "benchmark": "quant",
        "rows": rows,
        "dim": dim,
        "threads": 1,
        "repeats": repeats,
        "clock": "thread CPU time (time.thread_time), median over repeats; wall time alongside",
        "torch": torch.__version__,
        "numba": numba_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": [load_at_start, os.getloadavg()[0]],  # a shared machine is noisy
        "speedup": speedup,
        "speedup_bits": _METRIC_BITS,
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": speedup >= TARGET_SPEEDUP,
        "kernel_speedup_by_bits": by_bits,
        "target_kernel_speedup": TARGET_KERNEL_SPEEDUP,
        "meets_kernel_target": min(by_bits.values()) >= TARGET_KERNEL_SPEEDUP,
        "kernel_ns_per_value_by_bits": kernel_ns,
        "memory_bandwidth": {
            **copy,
            "kernel_total_over_copy_by_bits": {
                bits: ns["total"] / copy["copy_ns_per_value"] for bits, ns in kernel_ns.items()
            },
        },
        "dropout_speedup": dropout["speedup"],
        "target_dropout_speedup": TARGET_DROPOUT_SPEEDUP,
        "meets_dropout_target": dropout["speedup"] >= TARGET_DROPOUT_SPEEDUP,
        "dropout": dropout,
        "stale_average": blend,
        "exchange_message": exchange,
        "widths": widths,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def numba_version() -> str:
    import numba

    return numba.__version__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    add_out_options(parser, "quant.json")


def main(args: argparse.Namespace) -> int:
    out = out_file(args, "quant.json")
    report = run(args.rows, args.dim, args.repeats, args.seed, out)
    logger.info(
        "speedup at %d bits (quantize + dequantize) over the replaced quantizer: %.2fx "
        "(target %.1f); compiled kernels over the torch path: %s (target %.1f); dropout "
        "mask over nn.Dropout: %.2fx (target %.1f) -> %s",
        _METRIC_BITS,
        report["speedup"],
        TARGET_SPEEDUP,
        ", ".join(f"{b} bits {v:.2f}x" for b, v in report["kernel_speedup_by_bits"].items()),
        TARGET_KERNEL_SPEEDUP,
        report["dropout_speedup"],
        TARGET_DROPOUT_SPEEDUP,
        out,
    )
    # The ratios depend on the run's conditions, not only on the code: contention for memory
    # slows the compiled side (its decode is bound by memory writes) more than the torch path.
    load = report["load_average_1min"]
    logger.info(
        "conditions: a copy of the rows %.2f ns per value, load average %.1f-%.1f on %d cores "
        "(a loaded machine lowers kernel_speedup_by_bits, most at 8 bits: docs/kernels.md)",
        report["memory_bandwidth"]["copy_ns_per_value"],
        load[0],
        load[1],
        report["cpu_count"],
    )
    return 0
