"""Which quantizer path runs, and the Python side of the compiled one.

Two implementations write the same wire format (:mod:`adaqp.quant.pack`, :mod:`adaqp.quant.mixed`):

* ``torch``: torch operators (:mod:`adaqp.quant.rows`), on any device; the reference, and the
  path for CUDA tensors;
* ``compiled``: fused numba kernels (:mod:`adaqp.quant.compiled`), on CPU tensors, several times
  faster. Both paths take the same counter-based draws (a hash of a message's base key, a
  row's key and the column, :mod:`adaqp.quant.draws`) and round alike: the same keys give the
  same bytes on either.

The switch (:data:`~adaqp.config.KERNELS`, config key ``quant.kernels``): ``auto`` takes the
compiled path for CPU tensors when numba is importable and the torch path otherwise;
``torch`` and ``compiled`` force one (``compiled`` on a non-CPU tensor is an error).
Every entry point of :mod:`adaqp.quant` takes ``kernels=``; a call without it takes the
process default (:func:`set_kernels`; until set, ``$ADAQP_KERNELS``, else ``auto``). The
trainer sets no default: it hands ``quant.kernels`` to the dropout and the transport.

Compiled kernels are cached on disk by numba (``__pycache__`` beside the module), so a machine
compiles them once; :func:`warm_up` loads (or compiles) them so that no timed step pays for
it. A call uses ``torch.get_num_threads()`` threads (numba's, capped at its pool size): one
thread runs the serial kernel, more the ``prange`` one, with the same result.
"""

from __future__ import annotations

import logging
import os
import sys
from functools import cache
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from adaqp.config import KERNELS
from adaqp.quant.draws import RowKeys, row_keys

logger = logging.getLogger(__name__)

_ENV = "ADAQP_KERNELS"
_default = os.environ.get(_ENV) or "auto"
COMPILED_DRAWS = "splitmix64 of (base, row key), keyed lowbias32 words; dropout: whole words"
"""Names the compiled path's random draws (:mod:`adaqp.quant.compiled`): a checkpoint records
it, so that a run does not resume with other draws than it started with."""
_PARALLEL_MIN_VALUES = 1 << 15
"""Messages with fewer values run on one thread: starting the pool costs more."""


def check_kernels(kernels: str) -> str:
    """``kernels`` if it names a path (:data:`~adaqp.config.KERNELS`), else ValueError."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {kernels!r}")
    return kernels


def set_kernels(kernels: str) -> str:
    """Sets the default path of calls without ``kernels=``; returns the previous one. Not for
    training (the trainer passes ``quant.kernels`` down); the quant tests run each test on
    both paths through it (``tests/quant/conftest.py``)."""
    global _default
    previous, _default = _default, check_kernels(kernels)
    return previous


@cache
def compiled_module():
    """The compiled kernels' module, or the reason they cannot run here (a string)."""
    if sys.byteorder != "little":
        return "the compiled kernels read 16-bit draws in little-endian order"
    try:
        import adaqp.quant.compiled as compiled
    except ImportError as exc:  # numba missing or broken: the torch path still works
        return f"numba is not importable ({exc})"
    return compiled


def compiled_available() -> bool:
    """Whether the compiled kernels can run in this process."""
    return not isinstance(compiled_module(), str)


def use_compiled(kernels: str | None, device: torch.device | str) -> bool:
    """Whether a call with ``kernels`` (None: the process default) on ``device`` takes the
    compiled path.

    Raises:
        ValueError: an unknown path, or ``compiled`` for a non-CPU device.
        RuntimeError: ``compiled`` where numba cannot run.
    """
    if kernels is None:
        if _default not in KERNELS:
            raise ValueError(f"${_ENV} must be one of {', '.join(KERNELS)}, not {_default!r}")
        kernels = _default
    else:
        check_kernels(kernels)
    if kernels == "torch":
        return False
    on_cpu = (device if isinstance(device, torch.device) else torch.device(device)).type == "cpu"
    if kernels == "compiled":
        if not on_cpu:
            raise ValueError(f"the compiled kernels run on CPU tensors, not {device}")
        if not compiled_available():
            raise RuntimeError(f"quant kernels = compiled, but {compiled_module()}")
        return True
    if on_cpu and not compiled_available():
        _warn_fallback(compiled_module())
    return on_cpu and compiled_available()


@cache
def _warn_fallback(reason: str) -> None:
    """Says once a process why ``auto`` runs the slower torch path on CPU."""
    logger.warning("quant.kernels = auto: %s; using the slower torch path", reason)


def threads() -> int:
    """Threads a compiled call uses: ``torch.get_num_threads()``, capped at numba's pool."""
    import numba

    return max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def parallel_threads(values: int) -> int:
    """Threads for a call over ``values`` values; sets numba's count when above one."""
    count = threads()
    if count == 1 or values < _PARALLEL_MIN_VALUES:
        return 1
    import numba

    numba.set_num_threads(count)
    return count


def numpy_view(tensor: Tensor) -> np.ndarray:
    return tensor.detach().numpy()


def _metadata_error(mins: np.ndarray, maxs: np.ndarray) -> ValueError:
    if not (np.isfinite(mins).all() and np.isfinite(maxs).all()):
        return ValueError("cannot quantize: input contains NaN or Inf (checked in float32)")
    return ValueError("cannot quantize: a row's range max - min overflows float32")


_NO_REPEATS = np.empty(0, np.int64)


def _encode(
    x_RD: Tensor,
    bits_R: np.ndarray,
    offsets_R,
    payload,
    keys: RowKeys | None,
    first_R=_NO_REPEATS,
) -> tuple:
    """Runs the quantize kernel; returns float32 ``(mins, maxs)`` numpy arrays. A row ``r``
    with ``first_R[r] >= 0`` gets the codes of that earlier row, the same values. Draws keyed
    by ``keys`` (:class:`~adaqp.quant.draws.RowKeys`; None:
    :func:`~adaqp.quant.draws.fresh_keys`)."""
    kernels = compiled_module()
    rows, dim = x_RD.shape
    mins = np.zeros(rows, np.float32)
    maxs = np.zeros(rows, np.float32)
    keys = row_keys(keys, rows)
    if rows == 0 or dim == 0:
        return mins, maxs
    x = numpy_view(x_RD.contiguous())
    args = (x, bits_R, keys.base, keys.rows, offsets_R, payload, mins, maxs, first_R)
    count = parallel_threads(x_RD.numel())
    if count == 1:
        skipped = kernels.quantize_serial(*args)
    else:
        skipped = kernels.quantize_parallel(*args, 4 * count)
    if first_R.shape[0]:
        kernels.copy_repeats(first_R, bits_R, offsets_R, payload, mins, maxs, dim)
    if skipped:
        raise _metadata_error(mins, maxs)
    return mins, maxs


def _decode(
    payload, bits_R: np.ndarray, offsets_R, mins, maxs, out_RD: Tensor, blend: float | None = None
) -> Tensor:
    """Runs the dequantize kernel into float32 ``out_RD`` (any strides), or with ``blend``
    blends the rows into it (:func:`adaqp.quant.mixed.blend_`)."""
    kernels = compiled_module()
    if out_RD.numel() == 0:
        return out_RD
    if out_RD.is_contiguous():
        target = out_RD
    else:  # a blend reads what out_RD holds; a plain decode only writes
        target = out_RD.contiguous() if blend is not None else torch.empty(out_RD.shape)
    out = numpy_view(target)
    weight = np.float32(1.0 if blend is None else blend)
    count = parallel_threads(out_RD.numel())
    if count == 1:
        kernels.dequantize_serial(payload, bits_R, offsets_R, mins, maxs, out, weight)
    else:
        args = (payload, bits_R, offsets_R, mins, maxs, out, weight, 4 * count)
        kernels.dequantize_parallel(*args)
    if target is not out_RD:
        out_RD.copy_(target)
    return out_RD


def _widths(bits_R: Tensor) -> np.ndarray:
    if bits_R.dim() != 1 or bits_R.is_floating_point() or bits_R.is_complex():
        raise ValueError(f"bits_R must be a 1-D integer tensor, got {bits_R.dtype} {bits_R.shape}")
    if bits_R.dtype != torch.int8 or bits_R.device.type != "cpu" or not bits_R.is_contiguous():
        bits_R = bits_R.to(device="cpu", dtype=torch.int8).contiguous()
    return numpy_view(bits_R)


def _mixed_layout(bits: np.ndarray, dim: int) -> tuple[np.ndarray, int]:
    offsets = np.empty(bits.shape[0], np.int64)
    size = compiled_module().layout(bits, dim, offsets)
    if size < 0:
        raise ValueError("bits_R holds unsupported widths; expected values in (1, 2, 4, 8)")
    return offsets, size


def quantize_mixed(
    x_RD: Tensor, bits_R: Tensor, out: Tensor | None, keys: RowKeys | None = None
) -> Tensor:
    """:func:`adaqp.quant.quantize_mixed` on the compiled path (float32 CPU ``x_RD``)."""
    rows, dim = x_RD.shape
    bits = _widths(bits_R)
    if bits.shape[0] != rows:
        raise ValueError(f"bits_R has {bits.shape[0]} entries for {rows} rows")
    offsets, size = _mixed_layout(bits, dim)
    if out is None:
        out = torch.empty(size, dtype=torch.uint8)
    elif out.dim() != 1 or out.dtype != torch.uint8 or out.shape[0] != size:
        raise ValueError(f"out must be uint8 [{size}], got {tuple(out.shape)} {out.dtype}")
    payload = numpy_view(out)
    mins, maxs = _encode(x_RD, bits, offsets, payload, keys)
    payload[: 4 * rows] = mins.view(np.uint8)
    payload[4 * rows : 8 * rows] = maxs.view(np.uint8)
    return out


def dequantize_mixed(
    buf: Tensor, bits_R: Tensor, dim: int, out: Tensor | None, blend: float | None = None
) -> Tensor:
    """:func:`adaqp.quant.dequantize_mixed` on the compiled path (CPU ``buf``)."""
    bits = _widths(bits_R)
    rows = bits.shape[0]
    offsets, size = _mixed_layout(bits, dim)
    if buf.dim() != 1 or buf.dtype != torch.uint8 or buf.shape[0] != size:
        raise ValueError(
            f"buf must be uint8 [{size}] for these widths, got {tuple(buf.shape)} {buf.dtype}"
        )
    if out is None:
        out = torch.empty(rows, dim, dtype=torch.float32)
    elif tuple(out.shape) != (rows, dim) or out.dtype != torch.float32:
        raise ValueError(
            f"out must be float32 of shape ({rows}, {dim}), got {tuple(out.shape)} {out.dtype}"
        )
    payload = numpy_view(buf)
    # Copies: the metadata may sit at any byte offset, and numba wants aligned arrays.
    mins = payload[: 4 * rows].copy().view(np.float32)
    maxs = payload[4 * rows : 8 * rows].copy().view(np.float32)
    return _decode(payload, bits, offsets, mins, maxs, out, blend)


class SegmentLayout(NamedTuple):
    """Where every row of a message of peer segments sits (:func:`segment_layout`)."""

    widths: np.ndarray
    """int8 ``[R]``: each row's width."""
    offsets: np.ndarray
    """int64 ``[R]``: where each row's codes start, from the message's first byte."""
    starts: np.ndarray
    """int64 ``[S]``: where each segment (its metadata) starts."""
    rows: np.ndarray
    """int64 ``[S]``: rows per segment."""
    first: np.ndarray
    """int64 ``[R]`` (or empty): the earlier row whose codes a row takes, else -1."""
    size: int
    """Bytes of the whole message."""
    dim: int
    """Values a row."""


def segment_layout(
    bits_R: Tensor, counts: list[int], dim: int, sources: np.ndarray | None = None
) -> SegmentLayout:
    """Where every row of a message of peer segments sits (segments in order, ``counts[s]``
    rows each, each in the :func:`quantize_mixed` layout), for :func:`quantize_segments` and
    :func:`dequantize_segments`.

    ``sources``: where row values come from (equal sources, equal rows: a node sent to
    several peers). ``first[r]`` is then the earlier row of the same source and width whose
    codes row ``r`` takes, -1 for a row quantized itself (empty without ``sources``)."""
    widths = _widths(bits_R)
    if widths.shape[0] != sum(counts):
        raise ValueError(f"{widths.shape[0]} widths for {sum(counts)} rows in segments")
    offsets = np.empty(widths.shape[0], np.int64)
    starts = np.zeros(len(counts), np.int64)
    base = first = 0
    for s, count in enumerate(counts):
        starts[s] = base
        local, size = _mixed_layout(widths[first : first + count], dim)
        offsets[first : first + count] = local + base
        base, first = base + size, first + count
    repeats = _NO_REPEATS
    if sources is not None and widths.shape[0]:
        key = np.asarray(sources, np.int64) * 64 + widths  # widths are below 64
        _, first_of, inverse = np.unique(key, return_index=True, return_inverse=True)
        earlier = first_of[inverse]
        repeats = np.where(earlier == np.arange(widths.shape[0]), -1, earlier).astype(np.int64)
        if not (repeats >= 0).any():  # nothing repeated (one peer): no per-row check at all
            repeats = _NO_REPEATS
    rows = np.asarray(counts, np.int64)
    return SegmentLayout(widths, offsets, starts, rows, repeats, base, dim)


def _check_message(layout: SegmentLayout, buf: Tensor, rows_RD: Tensor) -> None:
    """The kernels trust their indices: a buffer or rows of another shape would be read or
    written out of bounds."""
    if buf.dim() != 1 or buf.dtype != torch.uint8 or buf.shape[0] != layout.size:
        raise ValueError(f"expected a uint8 [{layout.size}] buffer, got {tuple(buf.shape)}")
    expected = (layout.widths.shape[0], layout.dim)
    if tuple(rows_RD.shape) != expected or rows_RD.dtype != torch.float32:
        raise ValueError(f"expected float32 rows {expected}, got {tuple(rows_RD.shape)}")


def quantize_segments(
    x_RD: Tensor, layout: SegmentLayout, out: Tensor, keys: RowKeys | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Every segment of a message quantized into uint8 ``out`` in one call, one base key for
    the whole message: each segment is then a :func:`quantize_mixed` buffer of its rows.
    Returns the rows' float32 ``(mins, maxs)``, as the segments carry them."""
    _check_message(layout, out, x_RD)
    payload = numpy_view(out)
    args = (x_RD, layout.widths, layout.offsets, payload, keys, layout.first)
    mins, maxs = _encode(*args)
    compiled_module().copy_metadata(payload, layout.starts, layout.rows, mins, maxs, True)
    return mins, maxs


def dequantize_segments(
    buf: Tensor, layout: SegmentLayout, out_RD: Tensor, blend: float | None = None
) -> Tensor:
    """Inverse of :func:`quantize_segments` into float32 ``out_RD``, or with ``blend`` blended
    into it, in one call."""
    _check_message(layout, buf, out_RD)
    payload = numpy_view(buf)
    mins = np.empty(layout.widths.shape[0], np.float32)
    maxs = np.empty(layout.widths.shape[0], np.float32)
    compiled_module().copy_metadata(payload, layout.starts, layout.rows, mins, maxs, False)
    return _decode(payload, layout.widths, layout.offsets, mins, maxs, out_RD, blend)


def quantize_rows(
    x_RD: Tensor, bits: int, packed: Tensor, keys: RowKeys | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`adaqp.quant.quantize` on the compiled path: fills uint8 ``packed``
    ``[R, packed_row_bytes]`` and returns float32 ``(minimum, maximum)``."""
    rows = x_RD.shape[0]
    widths = np.full(rows, bits, np.int8)
    offsets = np.arange(rows, dtype=np.int64) * packed.shape[1]
    mins, maxs = _encode(x_RD, widths, offsets, numpy_view(packed).reshape(-1), keys)
    return torch.from_numpy(mins), torch.from_numpy(maxs)


def dequantize_rows(
    packed: Tensor, bits: int, minimum: Tensor, maximum: Tensor, out: Tensor
) -> Tensor:
    """:func:`adaqp.quant.dequantize` on the compiled path, into float32 ``out``."""
    rows = packed.shape[0]
    widths = np.full(rows, bits, np.int8)
    offsets = np.arange(rows, dtype=np.int64) * packed.shape[1]
    payload = numpy_view(packed.contiguous()).reshape(-1)
    mins = numpy_view(minimum.to(torch.float32).contiguous())
    maxs = numpy_view(maximum.to(torch.float32).contiguous())
    return _decode(payload, widths, offsets, mins, maxs, out)


def squared_ranges(x_RD: Tensor, kernels: str | None = None) -> Tensor:
    """float64 ``[R]``: each row's ``(max - min)²``, the difference in float32 (the planner's
    trace of the rows it sends); compiled on float32 CPU rows unless ``kernels`` says
    otherwise, else torch operators (the same bits)."""
    x_RD = x_RD.detach()
    if x_RD.dtype == torch.float32 and use_compiled(kernels, x_RD.device):
        out = torch.empty(x_RD.shape[0], dtype=torch.float64)
        compiled_module().squared_ranges(numpy_view(x_RD.contiguous()), numpy_view(out))
        return out
    if x_RD.shape[1] == 0:
        return torch.zeros(x_RD.shape[0], dtype=torch.float64, device=x_RD.device)
    return (x_RD.amax(1) - x_RD.amin(1)).double() ** 2


def warm_up(parallel: bool | None = None) -> bool:
    """Loads (or compiles and caches) the quantizer's compiled kernels, so that no timed call
    pays for it; the ``prange`` ones too where ``parallel`` (None: where this process has
    more than one thread). Returns whether the compiled path is available."""
    if not compiled_available():
        logger.info("compiled quant kernels unavailable: %s", compiled_module())
        return False
    kernels = compiled_module()
    x = torch.zeros(2, 8)
    bits = torch.tensor([1, 8], dtype=torch.int8)
    buf = quantize_mixed(x, bits, None, RowKeys.of(0, count=2))
    dequantize_mixed(buf, bits, 8, None)
    ones = torch.ones(2, dtype=torch.int8)
    layout = segment_layout(ones, [1, 1], 8, sources=np.zeros(2, np.int64))  # a repeat
    buf = torch.empty(18, dtype=torch.uint8)
    quantize_segments(x, layout, buf, RowKeys.of(0, count=2))
    dequantize_segments(buf, layout, x)
    keys = np.arange(2, dtype=np.uint64)  # the dropout mask's kernel, as adaqp.quant.mask calls it
    kernels.masked_scale_serial(
        numpy_view(x), numpy_view(x).copy(), keys[0], keys, 1 << 31, np.float32(2)
    )
    squared_ranges(x)
    if threads() > 1 if parallel is None else parallel:  # compiled, the pool not started
        for serial, chunked in (
            (kernels.quantize_serial, kernels.quantize_parallel),
            (kernels.dequantize_serial, kernels.dequantize_parallel),
            (kernels.masked_scale_serial, kernels.masked_scale_parallel),
        ):
            for signature in serial.signatures:
                chunked.compile((*signature, numba_intp()))
    return True


def compile_pending() -> bool:
    """Whether :func:`warm_up` would compile the kernels (up to a minute on a small machine)
    rather than load them: numba's on-disk cache has none for this machine, or for their
    current source. Reads the cache's index only; False where that cannot be read."""
    if not compiled_available():
        return False
    kernels = compiled_module()
    try:  # numba's index maps (signature, target machine, ...) to compiled code
        for dispatcher in (kernels.quantize_serial, kernels.masked_scale_serial):
            machine = dispatcher.targetctx.codegen().magic_tuple()
            if all(key[1] != machine for key in dispatcher._cache._cache_file._load_index()):
                return True
    except Exception:  # another numba version's internals: say nothing rather than guess
        pass
    return False


def numba_intp():
    """numba's type of a Python int argument (the chunk count of the ``prange`` kernels)."""
    from numba import types

    return types.int64
