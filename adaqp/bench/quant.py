"""Quantizer throughput: quantize + pack and unpack + dequantize per value, one thread, at each
bit width, for three implementations side by side in one run: the compiled CPU kernels
(``adaqp.quant.compiled``, the default on CPU), the torch path (``adaqp.quant.rows``/``mixed``,
the reference and the path for CUDA) and the implementation the torch path replaced. Also the
dropout mask (``adaqp.model.dropout``) against nn.Dropout, and a copy of the message's bytes
(the machine's memory bandwidth, the limit the kernels approach). Writes
``results/bench/quant.json``; the figures that matter are ratios within one run:
``kernel_speedup_by_bits`` (torch path / compiled kernels), ``dropout_speedup`` (nn.Dropout /
the compiled mask) and ``speedup`` (the replaced implementation / the torch path, at 2 bits).
Every side is warmed up (the compiled kernels loaded or compiled, a first round dropped) and
the sides take turns in every repeat.

The replaced implementation is a frozen copy of ``adaqp/quant.py`` as of commit ef412a7 (one
float draw per value from ``torch.rand``, a compare against the fractional part,
strided-slice packing, shift unpacking, whole-message passes), kept here so that all run side
by side in one process. The wire format is the same, which the run checks by decoding each
side's buffers with the others' decoders.
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

from adaqp.model.dropout import Dropout
from adaqp.quant import (
    SUPPORTED_BITS,
    dequantize_mixed,
    mixed_buffer_bytes,
    packed_row_bytes,
    quantize_mixed,
    row_step,
)
from adaqp.quant import kernels as quant_kernels

logger = logging.getLogger(__name__)

_METADATA_BYTES_PER_ROW = 8  # float32 minimum + float32 maximum

TARGET_SPEEDUP = 2.0
TARGET_KERNEL_SPEEDUP = 4.0  # torch path / compiled kernels, at every width
TARGET_DROPOUT_SPEEDUP = 3.0  # nn.Dropout / the compiled mask
_METRIC_BITS = 2  # width of the headline figure

# --------------------------------------------------------------------------- reference
# Frozen copy of the quantize_mixed / dequantize_mixed path of adaqp/quant.py at ef412a7, code
# unchanged (docstrings shortened; pack, unpack, mixed_buffer_bytes and the two entry points
# renamed). row_step and packed_row_bytes, unchanged since, are shared.


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bit width {bits!r}; expected one of {SUPPORTED_BITS}")


def _pack(codes_RD: Tensor, bits: int) -> Tensor:
    """Pack integer codes along the feature axis, ``8 // bits`` codes per byte."""
    _check_bits(bits)
    if codes_RD.dim() != 2 or codes_RD.dtype != torch.uint8:
        raise ValueError(
            f"pack expects a 2-D uint8 tensor, got {tuple(codes_RD.shape)} {codes_RD.dtype}"
        )
    if bits == 8:
        return codes_RD.contiguous()
    per_byte = 8 // bits
    # Code slot j of every byte is the strided column slice j::per_byte; slot 0 always has the
    # full byte count, later slots may be one short (the padded tail), so OR them into a prefix.
    # The loop runs over at most 8 slots, never over rows.
    packed = codes_RD[:, 0::per_byte].clone()
    for slot in range(1, per_byte):
        column = codes_RD[:, slot::per_byte]
        packed[:, : column.shape[1]] |= column << (slot * bits)
    return packed


def _unpack(packed_RB: Tensor, bits: int, dim: int) -> Tensor:
    """Inverse of :func:`_pack`."""
    row_bytes = packed_row_bytes(dim, bits)
    if packed_RB.dim() != 2 or packed_RB.dtype != torch.uint8 or packed_RB.shape[1] != row_bytes:
        raise ValueError(
            f"unpack expects uint8 [R, {row_bytes}] for dim={dim}, bits={bits}; "
            f"got {tuple(packed_RB.shape)} {packed_RB.dtype}"
        )
    if bits == 8:
        return packed_RB
    per_byte = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed_RB.device)
    # One broadcast pass: [R, B, 1] >> [per_byte] -> [R, B, per_byte], slot order = code order.
    codes = (packed_RB.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(packed_RB.shape[0], row_bytes * per_byte)[:, :dim]


def _as_float32_rows(x_RD: Tensor) -> Tensor:
    if x_RD.dim() != 2:
        raise ValueError(f"expected a 2-D [rows, dim] tensor, got shape {tuple(x_RD.shape)}")
    if not x_RD.is_floating_point():
        raise ValueError(f"expected a floating-point tensor, got {x_RD.dtype}")
    return x_RD.to(torch.float32)


def _row_range(x_RD: Tensor) -> tuple[Tensor, Tensor]:
    """Row minima and maxima of float32 ``x_RD``; raises on NaN/Inf or an overflowing range."""
    rows, dim = x_RD.shape
    if dim == 0:
        zeros = torch.zeros(rows, dtype=torch.float32, device=x_RD.device)
        return zeros, zeros.clone()
    # Separate amin/amax: torch.aminmax is several times slower on CPU for this reduction.
    minimum, maximum = x_RD.amin(dim=1), x_RD.amax(dim=1)
    # amin/amax propagate NaN and a row holding ±Inf has an infinite extreme, so one [R]-sized
    # check on the range covers non-finite input without another full pass over x.
    if not bool(torch.isfinite(maximum - minimum).all()):
        if not (bool(torch.isfinite(minimum).all()) and bool(torch.isfinite(maximum).all())):
            raise ValueError("cannot quantize: input contains NaN or Inf (checked in float32)")
        raise ValueError("cannot quantize: a row's range max - min overflows float32")
    return minimum, maximum


def _stochastic_codes(
    x_RD: Tensor,
    minimum: Tensor,
    step: Tensor,
    levels: int | Tensor,
    generator: torch.Generator | None,
) -> Tensor:
    """Stochastically rounded codes ``q`` in ``[0, levels]`` as uint8 ``[R, D]``."""
    # Constant rows (and steps that underflow to 0) divide by 1 instead: x - m is 0 there (or
    # subnormal), so t rounds to code 0 and the receiver reconstructs m.
    safe_step = torch.where(step > 0, step, torch.ones_like(step))
    t = (x_RD - minimum[:, None]).div_(safe_step[:, None])  # >= 0: x >= m is exact in floats
    # t can exceed L by an ulp after rounding, and a code of L + 1 would spill into the
    # neighbouring packed code (or wrap to 0 at 8 bits). Clamping t to L before rounding is the
    # same as clamping q: it maps t in (L, L + 1) to q = L, and t = L never rounds up.
    if isinstance(levels, Tensor):
        torch.minimum(t, levels[:, None], out=t)
    else:
        t.clamp_(max=levels)
    codes = t.to(torch.uint8)  # truncation == floor, as t >= 0
    frac = t.frac_()  # exact: t - floor(t)
    # floor(t) + [u < frac] with u ~ U[0, 1) is floor(t) + Bernoulli(frac): unbiased up to the
    # 2**-24 resolution of u, where rounding floor(t + u) would add a bias of half an ulp of t.
    noise = torch.rand(x_RD.shape, generator=generator, dtype=torch.float32, device=x_RD.device)
    return codes.add_(noise < frac)


def _reconstruct_(out_RD: Tensor, minimum: Tensor, maximum: Tensor, step: Tensor) -> Tensor:
    """In place: codes held in float32 ``out_RD`` become ``min(m + q·Δ, M)``."""
    out_RD.mul_(step[:, None]).add_(minimum[:, None])
    # m + L·Δ can round one ulp above M; clamping keeps every value inside [m, M] exactly.
    return torch.minimum(out_RD, maximum[:, None], out=out_RD)


def _output_buffer(out: Tensor | None, rows: int, dim: int, device: torch.device) -> Tensor:
    if out is None:
        return torch.empty(rows, dim, dtype=torch.float32, device=device)
    if tuple(out.shape) != (rows, dim) or out.dtype != torch.float32:
        raise ValueError(
            f"out must be float32 of shape ({rows}, {dim}), got {tuple(out.shape)} {out.dtype}"
        )
    return out


def _levels(bits_R: Tensor) -> Tensor:
    """float32 ``[R]`` per-row ``2**bits - 1`` (integer power, so exact)."""
    return (2 ** bits_R.to(torch.int32) - 1).to(torch.float32)


def _mixed_widths(bits_R: Tensor) -> Tensor:
    if bits_R.dim() != 1 or bits_R.is_floating_point() or bits_R.is_complex():
        raise ValueError(f"bits_R must be a 1-D integer tensor, got {bits_R.dtype} {bits_R.shape}")
    supported = torch.tensor(SUPPORTED_BITS, dtype=bits_R.dtype, device=bits_R.device)
    if not bool(torch.isin(bits_R, supported).all()):
        raise ValueError(f"bits_R holds unsupported widths; expected values in {SUPPORTED_BITS}")
    return bits_R


def _mixed_buffer_bytes(bits_R: Tensor, dim: int) -> int:
    """Exact byte size of the :func:`reference_quantize_mixed` buffer."""
    bits_R = _mixed_widths(bits_R)
    total = _METADATA_BYTES_PER_ROW * bits_R.shape[0]
    counts = torch.stack([(bits_R == b).sum() for b in SUPPORTED_BITS]).tolist()
    for bits, count in zip(SUPPORTED_BITS, counts, strict=True):
        total += count * packed_row_bytes(dim, bits)
    return total


def _float32_to_bytes(values: Tensor) -> Tensor:
    return values.contiguous().view(torch.uint8)


def _bytes_to_float32(buf: Tensor) -> Tensor:
    # clone() gives fresh, aligned storage; viewing the buffer slice itself would fail at
    # offsets that are not multiples of 4.
    return buf.clone().view(torch.float32)


def reference_quantize_mixed(
    x_RD: Tensor,
    bits_R: Tensor,
    generator: torch.Generator | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """Quantize rows at per-row widths into one flat uint8 buffer (one message to one peer)."""
    x_RD = _as_float32_rows(x_RD)
    rows, dim = x_RD.shape
    bits_R = _mixed_widths(bits_R.to(x_RD.device))
    if bits_R.shape[0] != rows:
        raise ValueError(f"bits_R has {bits_R.shape[0]} entries for {rows} rows")
    size = _mixed_buffer_bytes(bits_R, dim)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8, device=x_RD.device)
    elif out.dim() != 1 or out.dtype != torch.uint8 or out.shape[0] != size:
        raise ValueError(f"out must be uint8 [{size}], got {tuple(out.shape)} {out.dtype}")

    minimum, maximum = _row_range(x_RD)
    levels = _levels(bits_R)
    step = row_step(minimum, maximum, levels)
    # One rounding pass over all rows with per-row L, so the random stream does not depend on
    # how rows split into widths.
    codes = _stochastic_codes(x_RD, minimum, step, levels, generator)

    out[: 4 * rows] = _float32_to_bytes(minimum)
    out[4 * rows : 8 * rows] = _float32_to_bytes(maximum)
    offset = 8 * rows
    for bits in SUPPORTED_BITS:  # 4 widths, not rows
        index = (bits_R == bits).nonzero().squeeze(1)
        if index.numel() == 0:
            continue
        # A single-width message (the common case) skips the row gather.
        group = codes if index.numel() == rows else codes.index_select(0, index)
        packed = _pack(group, bits)
        out[offset : offset + packed.numel()] = packed.view(-1)
        offset += packed.numel()
    return out


def reference_dequantize_mixed(
    buf: Tensor,
    bits_R: Tensor,
    dim: int,
    out: Tensor | None = None,
) -> Tensor:
    """Reconstruct rows from a quantize_mixed buffer, in their original order."""
    bits_R = _mixed_widths(bits_R.to(buf.device))
    rows = bits_R.shape[0]
    size = _mixed_buffer_bytes(bits_R, dim)
    if buf.dim() != 1 or buf.dtype != torch.uint8 or buf.shape[0] != size:
        raise ValueError(
            f"buf must be uint8 [{size}] for these widths, got {tuple(buf.shape)} {buf.dtype}"
        )
    out = _output_buffer(out, rows, dim, buf.device)

    minimum = _bytes_to_float32(buf[: 4 * rows])
    maximum = _bytes_to_float32(buf[4 * rows : 8 * rows])
    offset = 8 * rows
    # Gather every row's codes into out (as floats), then reconstruct all rows in one pass.
    for bits in SUPPORTED_BITS:
        index = (bits_R == bits).nonzero().squeeze(1)
        if index.numel() == 0:
            continue
        width = packed_row_bytes(dim, bits)
        nbytes = index.numel() * width
        packed = buf[offset : offset + nbytes].view(index.numel(), width)
        group = _unpack(packed, bits, dim)
        if index.numel() == rows:  # single-width message: no scatter needed
            out.copy_(group)
        else:
            out.index_copy_(0, index, group.to(torch.float32))
        offset += nbytes
    levels = _levels(bits_R)
    return _reconstruct_(out, minimum, maximum, row_step(minimum, maximum, levels))


# --------------------------------------------------------------------------- benchmark

Quantizer = Callable[[Tensor, Tensor, torch.Generator, Tensor], Tensor]
Dequantizer = Callable[[Tensor, Tensor, int, Tensor], Tensor]

SIDES: dict[str, tuple[Quantizer, Dequantizer]] = {
    "reference": (
        lambda x, b, g, out: reference_quantize_mixed(x, b, g, out=out),
        lambda buf, b, dim, out: reference_dequantize_mixed(buf, b, dim, out=out),
    ),
    "new": (  # the torch path (the subject of the ``speedup`` figure, hence its name)
        lambda x, b, g, out: quantize_mixed(x, b, g, out=out, kernels="torch"),
        lambda buf, b, dim, out: dequantize_mixed(buf, b, dim, out=out, kernels="torch"),
    ),
    "compiled": (
        lambda x, b, g, out: quantize_mixed(x, b, g, out=out, kernels="compiled"),
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
        quantize(x, bits_R, torch.Generator().manual_seed(seed), buf)
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
        gens = {side: torch.Generator().manual_seed(seed + bits) for side in SIDES}
        cpu = {side: {"quantize": [], "dequantize": [], "total": []} for side in SIDES}
        wall = {side: [] for side in SIDES}
        for rep in range(repeats + 1):  # the first round warms up and is dropped
            for side, (quantize, dequantize) in SIDES.items():  # interleaved: same conditions
                w0, t0 = time.perf_counter(), time.thread_time()
                quantize(x, bits_R, gens[side], send[side])
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
    grad = torch.ones_like(x)
    forward = {side: [] for side in sides}
    both = {side: [] for side in sides}
    for rep in range(repeats + 1):
        for side, module in sides.items():
            leaf = x.detach().requires_grad_()
            t0 = time.thread_time()
            y = module(leaf)
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


def run(rows: int, dim: int, repeats: int, seed: int, out: Path) -> dict:
    torch.set_num_threads(1)
    if not quant_kernels.warm_up():  # loaded from numba's cache, or compiled once
        raise RuntimeError("the compiled kernels cannot run here (is numba installed?)")
    load_at_start = os.getloadavg()[0]
    x = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))
    widths = _time_widths(x, repeats, seed)
    copy = _time_copy(x, repeats)
    dropout = _time_dropout(x, repeats, 0.5)
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
    parser.add_argument("--out", type=Path, default=Path("results/bench/quant.json"))


def main(args: argparse.Namespace) -> int:
    report = run(args.rows, args.dim, args.repeats, args.seed, args.out)
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
        args.out,
    )
    return 0
