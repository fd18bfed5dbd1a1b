"""Per-row stochastic integer quantization of messages, with bit packing.

A message is a ``[R, D]`` float tensor for one peer: one row per node's embedding or gradient.
Each row is quantized independently to ``b`` bits, ``b`` in
:data:`~adaqp.quant.bits.SUPPORTED_BITS` (the widths are defined once, in
:mod:`adaqp.quant.bits`), by unbiased stochastic rounding between the row's minimum and
maximum, which travel with it as exact float32 metadata; the integer codes travel densely
bit-packed.

Where each piece lives (each module documents the part of the wire format it implements):

* :mod:`adaqp.quant.pack`: packing integer codes into bytes and back (:func:`pack`,
  :func:`unpack`), and exact wire sizes (:func:`packed_row_bytes`, :func:`message_bytes`).
* :mod:`adaqp.quant.rows`: quantization at one width (:func:`quantize`, :func:`dequantize`,
  :class:`QuantizedRows`, :func:`row_step`): the rounding rule, its unbiasedness and variance
  bounds, and the row metadata.
* :mod:`adaqp.quant.mixed`: rows at per-row widths in one flat buffer for one peer
  (:func:`quantize_mixed`, :func:`dequantize_mixed`, :func:`mixed_buffer_bytes`) and that
  buffer's byte layout.
* :mod:`adaqp.quant.segment`: one peer's segment of a planned exchange (the mixed buffer,
  then the rows planned at full precision as float32).
* :mod:`adaqp.quant.kernels`: which path runs (``kernels``: ``auto``, ``torch``,
  ``compiled``), and the compiled path's seeds, threads and warm-up;
  :mod:`adaqp.quant.compiled`: the compiled (numba) CPU kernels, their counter-based draws and
  unbiasedness bound, and the dropout mask's kernel.
* :mod:`adaqp.quant.draws`: the keys every random draw of training is a function of (a base
  key from seed, epoch, layer and kind, and each row's global id), and the torch path's hash;
  :mod:`adaqp.quant.mask`: dropout's keyed mask on either path.

All functions are pure tensor functions: they run unchanged on any device, allocate on the
input's device, and do not communicate. ``rows`` and ``mixed`` are the torch path (the
reference, and the path for CUDA tensors); on CPU tensors they hand over to the compiled
kernels, which write the same bytes (docs/kernels.md).

Each name is imported from the module that defines it; this package re-exports none, so
that ``adaqp.quant.bits``, which the config and every command's ``--help`` read, loads
without torch.
"""
