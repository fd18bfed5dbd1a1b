"""The walk of a step (adaqp/memory/step.py): what it says each layer keeps is what the
model keeps, and its peaks move with the shapes as the code's tensors do."""

from __future__ import annotations

import pytest

from adaqp.memory.step import LayerShape, evaluation, saved_bytes, training_step
from tests.model.test_recompute import C, D, F, _model, _saved_bytes_by_layer
from tests.model.test_recompute import graph as graph  # noqa: F401 - the fixture

WEIGHTS = 4 * 2 * D * max(F, D, C) + 1024
"""Not per row: a layer's copy of its weights and index tensors (test_recompute's bound)."""


def _layers(rows: int, transform_first: bool = True) -> list[LayerShape]:
    widths = [F, D, D, C]
    return [
        LayerShape(
            num_out=rows,
            num_in=rows,
            num_halo=0,
            num_send=0,
            width_in=a,
            width_out=b,
            transform_first=transform_first and b <= a,
            last=layer == 2,
            exchanges=False,
        )
        for layer, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True))
    ]


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_the_walk_keeps_what_each_layer_of_the_model_keeps(name, graph):  # noqa: F811
    measured = _saved_bytes_by_layer(_model(name), graph)
    for layer, shape in enumerate(_layers(graph.num_inner)):
        walked = saved_bytes(shape)
        # the walk counts the rows' bytes; the model adds its weights' copy and indices
        assert walked <= measured.get(layer, 0) <= walked + WEIGHTS, (layer, measured)


def test_a_step_peaks_above_what_it_keeps_and_scales_with_the_rows():
    small, large = _layers(10_000), _layers(40_000)
    for model in ("gcn", "sage"):
        kept = sum(saved_bytes(layer) for layer in small)
        step = training_step(small, model, dropout=True)
        assert step.bytes > kept and step.where.startswith("train: ")
        larger = training_step(large, model, dropout=True)
        assert larger.bytes == pytest.approx(4 * step.bytes, rel=0.01)
    # SAGE computes a root term beside the neighbours' and its input again in backward:
    # never less than GCN on the same shapes
    wide = _layers(10_000, transform_first=False)
    assert training_step(wide, "sage", True).bytes >= training_step(wide, "gcn", True).bytes
    # without dropout no layer makes a dropped copy of its input (never more)
    assert training_step(small, "gcn", False).bytes <= training_step(small, "gcn", True).bytes


def test_an_exchange_adds_its_buffers_and_a_quantized_one_lets_its_float_rows_go():
    alone = _layers(10_000)
    exchanging = [
        LayerShape(**{**vars(layer), "num_halo": 8_000, "num_send": 7_000, "exchanges": True})
        for layer in alone
    ]
    float_rows = training_step(exchanging, "gcn", True)
    assert float_rows.bytes > training_step(alone, "gcn", True).bytes
    quantized = training_step(exchanging, "gcn", True, bits=2)
    # (the quantized payloads are small enough here not to set the peak)
    assert training_step(alone, "gcn", True).bytes <= quantized.bytes < float_rows.bytes
    assert evaluation(exchanging, "gcn").bytes > evaluation(alone, "gcn").bytes


def test_an_evaluation_that_does_not_overlap_lets_the_transformed_rows_go_first():
    """A layer that transforms first and exchanges without overlapping starts its
    exchange once its inner rows are aggregated: its transformed rows are gone before the
    receive buffer is made. Overlapping, both are held; the walk takes the larger."""
    layers = [
        LayerShape(**{**vars(layer), "num_halo": 8_000, "num_send": 7_000, "exchanges": True})
        for layer in _layers(10_000)
    ]
    assert any(layer.transform_first for layer in layers)
    apart = evaluation(layers, "gcn", overlap=(False,))
    together = evaluation(layers, "gcn", overlap=(True,))
    assert apart.bytes < together.bytes
    assert evaluation(layers, "gcn").bytes == together.bytes  # both orders: the larger
