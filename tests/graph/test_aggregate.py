"""CSR aggregation with a precomputed transpose equals dense matrix products."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from adaqp.graph.aggregate import (
    PRODUCT,
    LinearAggregation,
    SparseAdjacency,
    add_spmm_,
    csr_tensor,
    index_dtype,
    spmm,
)


def _random_csr(rows: int, cols: int, density: float, seed: int):
    matrix = sp.random(
        rows, cols, density=density, format="csr", dtype=np.float32, random_state=seed
    )
    adj = SparseAdjacency.from_csr(
        matrix.indptr.astype(np.int64), matrix.indices.astype(np.int64), matrix.data, (rows, cols)
    )
    return adj, torch.tensor(matrix.toarray())


@pytest.mark.parametrize(("rows", "cols"), [(40, 70), (70, 40), (1, 5), (30, 30)])
def test_forward_and_backward_match_dense(rows, cols):
    adj, dense = _random_csr(rows, cols, 0.15, seed=rows)
    x = torch.randn(cols, 6, requires_grad=True)
    out = spmm(adj, x)
    grad = torch.randn(rows, 6)
    out.backward(grad)
    torch.testing.assert_close(out, dense @ x)
    torch.testing.assert_close(x.grad, dense.T @ grad)


def test_indices_are_int32_where_they_fit_with_the_same_products_bit_for_bit():
    """Half the index bytes of int64 (both orientations, blocks too), and the same bits:
    CSR products do not depend on the index width."""
    adj, dense = _random_csr(300, 200, 0.05, seed=3)
    for matrix in (adj.forward, adj.transpose, adj.block(slice(10, 300), slice(0, 150)).forward):
        assert matrix.crow_indices().dtype == matrix.col_indices().dtype == torch.int32
    wide = torch.sparse_csr_tensor(
        adj.forward.crow_indices().long(),
        adj.forward.col_indices().long(),
        adj.forward.values(),
        size=adj.shape,
        check_invariants=True,
    )
    x = torch.randn(200, 33)
    assert torch.equal(torch.sparse.mm(adj.forward, x), torch.sparse.mm(wide, x))
    assert index_dtype(2**31 - 1, (5, 5)) == torch.int32
    assert index_dtype(2**31, (5, 5)) == index_dtype(3, (5, 2**31)) == torch.int64
    assert csr_tensor([0, 1], [0], [1.0], (1, 1)).col_indices().dtype == torch.int32


def test_products_are_torchs_bit_for_bit_without_its_second_result():
    """The product is written once (``addmm`` with ``beta = 0``), not zero-filled and copied
    as ``torch.sparse.mm`` does: the same bits, and so is adding a block's product in place."""
    adj, _ = _random_csr(400, 300, 0.05, seed=4)
    x = torch.randn(300, 17, requires_grad=True)
    out = spmm(adj, x)
    assert torch.equal(out, torch.sparse.mm(adj.forward, x.detach()))
    grad = torch.randn(400, 17)
    out.backward(grad)
    assert torch.equal(x.grad, torch.sparse.mm(adj.transpose, grad))
    base = torch.randn(450, 17)
    block = adj.row_slice(0, 400)
    expected = base.clone()
    expected[50:] += torch.sparse.mm(block.forward, x.detach())
    assert torch.equal(add_spmm_(base, 50, block, x.detach()), expected)


def test_transpose_is_the_transpose():
    adj, dense = _random_csr(25, 35, 0.2, seed=1)
    torch.testing.assert_close(adj.transpose.to_dense(), dense.T)


def test_empty_matrix_and_row_slice():
    empty = SparseAdjacency.from_csr(
        np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), (0, 5)
    )
    x = torch.randn(5, 3, requires_grad=True)
    out = spmm(empty, x)
    assert out.shape == (0, 3)
    out.sum().backward()
    assert float(x.grad.abs().sum()) == 0.0
    adj, dense = _random_csr(30, 20, 0.3, seed=2)
    block = adj.row_slice(10, 25)
    y = torch.randn(20, 4)
    torch.testing.assert_close(spmm(block, y), dense[10:25] @ y)


@pytest.mark.parametrize(
    ("rows", "cols"),
    [
        (slice(0, 30), slice(0, 12)),
        (slice(8, 30), slice(12, 20)),
        (slice(5, 5), slice(0, 20)),  # no rows
        (slice(3, 9), slice(20, 20)),  # no columns
    ],
)
def test_a_block_holds_exactly_its_rows_and_columns(rows, cols):
    adj, dense = _random_csr(30, 20, 0.3, seed=4)
    ids = np.arange(100, 130), np.arange(200, 220)
    adj = SparseAdjacency(adj.forward, adj.transpose, *ids)
    block = adj.block(rows, cols)
    torch.testing.assert_close(block.forward.to_dense(), dense[rows, cols])
    torch.testing.assert_close(block.transpose.to_dense(), dense[rows, cols].T)
    np.testing.assert_array_equal(block.row_ids, ids[0][rows])
    np.testing.assert_array_equal(block.col_ids, ids[1][cols])


def test_adding_a_block_product_in_place_is_differentiable_in_both_operands():
    adj, dense = _random_csr(30, 20, 0.3, seed=5)
    block = adj.block(slice(10, 30), slice(0, 20))
    base = torch.randn(30, 4, requires_grad=True)
    x = torch.randn(20, 4, requires_grad=True)
    out = add_spmm_(base * 1.0, 10, block, x)
    expected = base.detach().clone()
    expected[10:] += dense[10:] @ x.detach()
    torch.testing.assert_close(out, expected)
    grad = torch.randn(30, 4)
    out.backward(grad)
    torch.testing.assert_close(base.grad, grad)
    torch.testing.assert_close(x.grad, dense[10:].T @ grad[10:])
    with pytest.raises(ValueError, match="cannot add 19 rows"):
        add_spmm_(torch.zeros(30, 4), 10, block, torch.randn(19, 4))


def test_shape_mismatch_is_an_error():
    adj, _ = _random_csr(5, 7, 0.5, seed=3)
    with pytest.raises(ValueError, match="7 columns"):
        spmm(adj, torch.randn(6, 2))


@pytest.mark.parametrize(
    ("rows", "cols"),
    [(slice(0, 30), slice(0, 20)), (slice(8, 30), slice(12, 20)), (slice(5, 5), slice(0, 20))],
)
def test_count_is_the_blocks_number_of_entries(rows, cols):
    adj, dense = _random_csr(30, 20, 0.3, seed=6)
    assert adj.count(rows, cols) == int((dense[rows, cols] != 0).sum())
    assert adj.count(slice(0, None), slice(0, None)) == adj.forward.values().numel() > 0


class _Doubled(LinearAggregation):
    def __call__(self, block, x_MD, rows):
        return 2 * spmm(block, x_MD)


@pytest.mark.parametrize("aggregation", [PRODUCT, _Doubled()], ids=["product", "doubled"])
def test_a_linear_aggregation_adds_a_block_into_its_rows(aggregation):
    """``add_``: the product's in place, the default (any other) out of place; both
    differentiable in the rows added to and the rows aggregated."""
    scale = 1.0 if aggregation is PRODUCT else 2.0
    adj, dense = _random_csr(30, 20, 0.3, seed=7)
    block = adj.block(slice(10, 30), slice(0, 20))
    base = torch.randn(30, 4, requires_grad=True)
    x = torch.randn(20, 4, requires_grad=True)
    out = aggregation.add_(base * 1.0, 10, block, x, slice(10, 30))
    expected = base.detach().clone()
    expected[10:] += scale * dense[10:] @ x.detach()
    torch.testing.assert_close(out, expected)
    grad = torch.randn(30, 4)
    out.backward(grad)
    torch.testing.assert_close(base.grad, grad)
    torch.testing.assert_close(x.grad, scale * dense[10:].T @ grad[10:])
