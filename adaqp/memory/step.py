"""The tensors a worker's training step and evaluation hold, in the order the code makes
and lets go of them, and the largest sum they reach.

A worker's peak is not the sum of everything it ever allocates: each layer's forward keeps
some tensors for backward (the aggregated rows its transform reads, its norm's input, the
ReLU's bits, the last layer's input) and lets the rest go; backward gives them back layer
by layer while it makes the gradients, and the exchanges hold their rows only while they
travel. :func:`training_step` and :func:`evaluation` walk those steps for one worker, layer
by layer, from the shapes alone (``LayerShape``: the rows a layer computes and exchanges,
``adaqp/memory/layer_rows.py``), and return the peak and the moment it comes. Each step
names the tensor of ``adaqp/model/`` it stands for; the walk follows:

- ``GNN.forward`` (``adaqp/model/gnn.py``): dropout before each layer (a new ``[rows, in]``
  tensor at layer 0, a hidden layer's dropped where it is), the input given up once the
  layer is done (a hidden layer's is computed again in backward,
  ``adaqp/model/recompute.py``; the last layer's is kept where it aggregates first),
  ``norm_relu`` after a hidden layer (keeps its input and the ReLU's bits);
- ``Propagation`` (``adaqp/model/layers.py``, the exchange's nodes in
  ``adaqp/model/flight.py``): the rows sent (held until the exchange lands; quantized,
  until their payload is made), the halo rows received and added in place, the
  aggregation, the dense transform after it (``DeferredLinear``: keeps the aggregated
  rows) where a layer widens the rows, or before it (``adaqp/model/transform.py``: keeps
  only its input, handed off and computed again; SAGE's root term is the sum the
  aggregation adds into); in backward the transform's input gradient, the inner rows'
  gradient, the halo rows' gradients sent and the sent rows' gradients received (added
  where the inner rows' gradient is, ``adaqp/model/flight.py``), the weight gradient
  settled while they travel;
- SAGE's root term (a second ``[rows, out]`` product), and its recomputed input in backward
  (the root weight's gradient reads it).

Sizes are float32 (4 bytes a value) but the ReLU's bits and the quantized payloads. Not
walked: GAT's per-edge attention tensors (its prediction is a lower bound,
``adaqp.memory.estimate``).
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT = 4
"""Bytes a value (float32)."""


@dataclass(frozen=True)
class LayerShape:
    """One layer of one worker, as a step runs it."""

    num_out: int
    """Output rows."""
    num_in: int
    """Inner input rows."""
    num_halo: int
    """Halo rows its exchange receives (0: no exchange)."""
    num_send: int
    """Rows its exchange sends."""
    width_in: int
    width_out: int
    transform_first: bool
    """It transforms its input before aggregating (it narrows the rows)."""
    input_halo: int = 0
    """Halo rows already in its input (layer 0's cached input): aggregated locally."""
    last: bool = False
    exchanges: bool = True
    """Its step exchanges rows (more than one worker, and not a cached layer 0): only then
    is the transform's weight gradient deferred until the halo gradients travel."""


@dataclass(frozen=True)
class Peak:
    """The largest sum of live bytes a walk reached, and where."""

    bytes: int
    where: str


class _Ledger:
    """Live bytes, and their peak with the step that reached it."""

    def __init__(self, label: str):
        self.label = label
        self.live = 0
        self.peak = Peak(0, f"{label}: start")

    def make(self, nbytes: float, where: str) -> int:
        size = int(nbytes)
        self.live += size
        if self.live > self.peak.bytes:
            self.peak = Peak(self.live, f"{self.label}: {where}")
        return size

    def drop(self, nbytes: int) -> None:
        self.live -= nbytes


def _send(led: _Ledger, rows: int, width: int, bits: int, where: str) -> int:
    """An exchange's outgoing rows: float rows held until they have left; quantized
    (``bits`` < 32), the float rows let go once their payload (``bits`` a value, a scale
    and an offset a row) is made. Returns the bytes still held (freed when it lands)."""
    rows_bytes = led.make(FLOAT * rows * width, where)
    if bits >= 32:
        return rows_bytes
    payload = led.make(rows * (width * bits / 8 + 8), f"{where}, payload")
    led.drop(rows_bytes)
    return payload


def _norm_kept(layer: LayerShape) -> int:
    """A hidden layer's ``norm_relu`` keeps: its input, the ReLU's bits, two statistics a row."""
    o, b = layer.num_out, layer.width_out
    return 0 if layer.last else FLOAT * o * b + o * b // 8 + 2 * FLOAT * o


def _transform_kept(layer: LayerShape) -> int:
    """What a layer's dense transform keeps: the aggregated rows where it transforms after
    aggregating; the last layer also its input (``GNN.forward``)."""
    if layer.transform_first:  # its input is computed again in backward
        return 0
    aggregated = FLOAT * layer.num_out * layer.width_in
    kept_input = FLOAT * (layer.num_in + layer.input_halo) * layer.width_in if layer.last else 0
    return aggregated + kept_input


def saved_bytes(layer: LayerShape) -> int:
    """What a layer's forward keeps for backward (see ``_norm_kept``, ``_transform_kept``)."""
    return _norm_kept(layer) + _transform_kept(layer)


def training_step(
    layers: list[LayerShape],
    model: str,
    dropout: bool,
    bits: int = 32,
    overlap: tuple[bool, ...] = (False, True),
) -> Peak:
    """One training step's peak above what the worker holds across steps (bytes): the
    largest over the orders a layer that exchanges may run its backward in (``overlap``:
    the central rows split from the marginal ones, or not; ``_backward``)."""
    return max(
        (_training_step(layers, model, dropout, bits, order) for order in overlap),
        key=lambda peak: peak.bytes,
    )


def _training_step(
    layers: list[LayerShape], model: str, dropout: bool, bits: int, overlap: bool
) -> Peak:
    """``training_step``'s walk in one order: ``model`` (``gcn``, ``sage``; ``gat`` as
    ``gcn``, its rows transformed first), ``dropout`` (whether a layer's input dropout makes
    a new tensor), the exchanges' ``bits`` (32: float rows only)."""
    led = _Ledger("train")
    sage = model == "sage"
    hidden_in = 0  # the previous layer's output, the next one's input (layer 0's is held)
    grad = 0
    for index, layer in enumerate(layers):
        where = f"forward layer {index}"
        o, n, a, b = layer.num_out, layer.num_in, layer.width_in, layer.width_out
        layer_in = hidden_in
        if dropout and index == 0:  # the features are held: a new tensor
            layer_in = led.make(FLOAT * (n + layer.input_halo) * a, f"{where}, dropout")
        # (a hidden layer's input is the ReLU's output, dropped out where it is)
        if layer.transform_first:
            handed_off = layer_in if index > 0 or dropout else 0  # recomputed in backward
            out = _transforming_first(led, layer, where, bits, sage, handed_off, overlap)
            layer_in -= handed_off
        else:
            out = _aggregating_first(led, layer, where, bits, sage)
        if layer.last:  # what its transform keeps; the logits' gradient
            led.drop(layer_in + out)
            led.make(_transform_kept(layer), f"{where}, kept for backward")
            grad = led.make(FLOAT * o * b, "loss: the logits' gradient")
            break
        led.drop(layer_in)  # a hidden layer's input is computed again in backward
        hidden_in = led.make(FLOAT * o * b, f"{where}, norm")
        led.drop(out)
        led.make(saved_bytes(layer), f"{where}, kept for backward")
    for index in range(len(layers) - 1, -1, -1):
        layer = layers[index]
        where = f"backward layer {index}"
        o, n, a, b = layer.num_out, layer.num_in, layer.width_in, layer.width_out
        if not layer.last:  # norm_relu's backward; its kept input goes with it
            grad_out = led.make(FLOAT * o * b, f"{where}, norm's gradient")
            led.drop(grad + _norm_kept(layer))
            grad = grad_out
        if layer.transform_first:
            grad = _transforming_first_backward(
                led, layer, index, where, bits, dropout, sage, overlap, grad
            )
        else:
            grad = _backward(
                led, layer, index, where, bits, sage and (dropout or index > 0), overlap, grad
            )
        if index == 0:
            break
        if dropout:
            grad_h = led.make(FLOAT * n * a, f"{where}, dropout's gradient")
            led.drop(grad)
            grad = grad_h
    return led.peak


def _aggregating_first(led: _Ledger, layer: LayerShape, where: str, bits: int, sage: bool) -> int:
    """A layer's forward that aggregates, then transforms: the bytes of its output; the
    aggregated rows stay (freed with the output, or kept for backward)."""
    o, a, b = layer.num_out, layer.width_in, layer.width_out
    sent = _send(led, layer.num_send, a, bits, f"{where}, rows sent")
    halo = led.make(FLOAT * layer.num_halo * a, f"{where}, halo rows landed")
    aggregated = led.make(FLOAT * o * a, f"{where}, aggregation")
    led.drop(halo + sent)  # added in place (``add_spmm_``)
    out = led.make(FLOAT * o * b, f"{where}, transform")
    if sage:  # the root term, the neighbour term added into it
        led.make(FLOAT * o * b, f"{where}, root term")
        led.drop(out)
    return out + aggregated


def _transforming_first(
    led: _Ledger,
    layer: LayerShape,
    where: str,
    bits: int,
    sage: bool,
    handed_off: int,
    overlap: bool,
) -> int:
    """A layer's forward that transforms first (``adaqp/model/transform.py``): the
    transformed rows, SAGE's root term over the output rows (the sum the aggregation adds
    into; GCN's aggregation makes it), the input let go once transformed where it is
    ``handed_off`` (its bytes; one computed again in backward), the transformed rows once
    the inner rows are aggregated, before the halo rows land. Returns the output's bytes."""
    n, o, b = layer.num_in, layer.num_out, layer.width_out
    transformed = led.make(FLOAT * n * b, f"{where}, transform")
    out = led.make(FLOAT * o * b, f"{where}, root term" if sage else f"{where}, aggregation")
    led.drop(handed_off)
    sent = _send(led, layer.num_send, b, bits, f"{where}, rows sent")
    # Float rows are received where they land, a buffer made as the exchange starts: at
    # once where it overlaps the inner rows' aggregation, else after it (the transformed
    # rows gone). Quantized rows are decoded once the payload is in.
    early = bits >= 32 and overlap
    halo = led.make(FLOAT * layer.num_halo * b, f"{where}, halo rows' buffer") if early else 0
    led.drop(transformed)
    if not early:
        halo = led.make(FLOAT * layer.num_halo * b, f"{where}, halo rows landed")
    led.drop(halo + sent)  # added in place (``add_spmm_``)
    return out


def _backward(
    led: _Ledger,
    layer: LayerShape,
    index: int,
    where: str,
    bits: int,
    root: bool,
    overlap: bool,
    grad: int,
) -> int:
    """A layer that aggregates, then transforms (``root``: SAGE's root term, whose weight
    reads the layer's input computed again): from its output's gradient ``grad`` to its
    input's (bytes; 0 at layer 0, whose features need none). The input's gradient gathers
    in one buffer: SAGE's root term first (its weight reads the input, computed again),
    then the inner rows' gradient, made after the halo gradients are sent and handed to
    the exchange, which adds the landed gradients into it where it is
    (``adaqp/model/flight.py``) before autograd adds it into the buffer. Where the layer
    ``overlap``s the transform's weight gradient is made at once and the landed
    gradients are waited for after the inner rows' gradient is made; else the weight
    gradient is made while the halo gradients travel, and they are waited for at once,
    before the inner rows' gradient (the exchange then starts after the inner rows'
    aggregation in forward, ``Propagation``)."""
    o, n, a = layer.num_out, layer.num_in, layer.width_in
    buffer = 0
    if root and index > 0:  # the root term's weight and input gradient
        recomputed = led.make(FLOAT * n * a, f"{where}, input computed again")
        root = led.make(FLOAT * o * a, f"{where}, root term's input gradient")
        led.drop(recomputed)
        buffer = led.make(FLOAT * n * a, f"{where}, input's gradient")
        led.drop(root)
    elif root:
        led.drop(led.make(FLOAT * n * a, f"{where}, input computed again"))  # its weight's
    deferred = grad  # the output's gradient, and the input kept, until the weight's
    grad = led.make(FLOAT * o * a, f"{where}, transform's gradient")
    if index == 0 or not layer.exchanges or overlap:  # the weight's gradient at once
        led.drop(deferred + _transform_kept(layer))
        deferred = 0
        if index == 0:
            led.drop(grad)
            return 0
        if not layer.exchanges:
            buffer = _add(led, buffer, FLOAT * n * a, f"{where}, inner rows' gradient")
            led.drop(grad)
            return buffer
    sent = _send(led, layer.num_halo, a, bits, f"{where}, halo gradients sent")
    if deferred:  # the weight gradient, while they travel
        led.drop(deferred + _transform_kept(layer))
    landed = led.make(FLOAT * layer.num_send * a, f"{where}, gradients landed")
    if not overlap:  # waited for at once: the rows sent are let go
        led.drop(sent)
        sent = 0
    inner = led.make(FLOAT * n * a, f"{where}, inner rows' gradient")
    led.drop(grad + landed + sent)  # the landed gradients added where it is
    if not buffer:
        return inner
    led.drop(inner)  # added into the buffer (autograd accumulates in place)
    return buffer


def _add(led: _Ledger, buffer: int, nbytes: int, where: str) -> int:
    """A gradient made and added into ``buffer`` (autograd accumulates in place): the
    buffer's bytes after (the new gradient is the buffer where there was none)."""
    made = led.make(nbytes, where)
    if not buffer:
        return made
    led.drop(made)
    return buffer


def _transforming_first_backward(
    led: _Ledger,
    layer: LayerShape,
    index: int,
    where: str,
    bits: int,
    dropout: bool,
    sage: bool,
    overlap: bool,
    grad: int,
) -> int:
    """A layer that transforms first (it does not widen): the aggregation's gradients into
    the transformed rows (inner, and the landed rows added into them: after them where the
    layer ``overlap``s, else landed first; SAGE's root weight reads the output's gradient
    itself), then the transform's (``adaqp/model/transform.py``): its
    input computed again (but layer 0's undropped features, held), the weights' gradients,
    the input let go, then the input's gradient."""
    n, a, b = layer.num_in, layer.width_in, layer.width_out
    buffer = 0
    if index > 0 and layer.exchanges and not overlap:  # landed first, then the inner rows'
        sent = _send(led, layer.num_halo, b, bits, f"{where}, halo gradients sent")
        landed = led.make(FLOAT * layer.num_send * b, f"{where}, gradients landed")
        led.drop(sent)
        buffer = led.make(FLOAT * n * b, f"{where}, inner rows' gradient")
        led.drop(landed)  # added where the inner rows' gradient is
    elif index > 0:
        buffer = led.make(FLOAT * n * b, f"{where}, inner rows' gradient")
        if layer.exchanges:
            sent = _send(led, layer.num_halo, b, bits, f"{where}, halo gradients sent")
            landed = led.make(FLOAT * layer.num_send * b, f"{where}, gradients landed")
            led.drop(landed + sent)  # added where the inner rows' gradient is
    recomputed = 0
    if index > 0 or dropout:
        recomputed = led.make(FLOAT * n * a, f"{where}, input computed again")
    led.drop(recomputed)  # once the weights' gradients are made
    if index == 0:  # only the weights' gradients
        led.drop(grad)
        return 0
    grad_x = led.make(FLOAT * n * a, f"{where}, transform's input gradient")
    led.drop(buffer + grad)
    return grad_x


def evaluation(
    layers: list[LayerShape], model: str, overlap: tuple[bool, ...] = (False, True)
) -> Peak:
    """An evaluation's peak above what the worker holds (bytes): every row, no autograd,
    the exchanges in float32 (``layers`` are the whole graph's); the largest over the
    orders a layer that exchanges may run in (``overlap``, as ``training_step``'s)."""
    return max(
        (_evaluation(layers, model, order) for order in overlap), key=lambda peak: peak.bytes
    )


def _evaluation(layers: list[LayerShape], model: str, overlap: bool) -> Peak:
    """``evaluation``'s walk in one order. A layer that transforms first and exchanges
    without overlapping lets its transformed rows go before its exchange starts (its
    receive buffer made then); overlapping, the buffer is made at once."""
    led = _Ledger("eval")
    sage = model == "sage"
    hidden_in = 0
    for index, layer in enumerate(layers):
        where = f"forward layer {index}"
        o, n, a, b = layer.num_out, layer.num_in, layer.width_in, layer.width_out
        if layer.transform_first:  # the input handed off, the buffer made at the start
            transformed = led.make(FLOAT * n * b, f"{where}, transform")
            out = led.make(FLOAT * o * b, f"{where}, aggregation")
            led.drop(hidden_in)
            hidden_in = 0
            sent = led.make(FLOAT * layer.num_send * b, f"{where}, rows sent")
            if not overlap:  # aggregated: let go before the exchange starts
                led.drop(transformed)
                transformed = 0
            halo = led.make(FLOAT * layer.num_halo * b, f"{where}, halo rows' buffer")
            led.drop(transformed + sent + halo)
        else:
            sent = led.make(FLOAT * layer.num_send * a, f"{where}, rows sent")
            halo = led.make(FLOAT * layer.num_halo * a, f"{where}, halo rows landed")
            aggregated = led.make(FLOAT * o * a, f"{where}, aggregation")
            led.drop(sent + halo)  # added in place
            out = led.make(FLOAT * o * b, f"{where}, transform")
            if sage:
                led.make(FLOAT * o * b, f"{where}, root term")
                led.drop(FLOAT * o * b)
            led.drop(aggregated)
        led.drop(hidden_in)  # the layer's input, once the layer is done
        if layer.last:
            break
        hidden_in = led.make(FLOAT * o * b, f"{where}, norm")
        led.drop(out)
    return led.peak
