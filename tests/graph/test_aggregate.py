"""CSR aggregation with a precomputed transpose equals dense matrix products."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from adaqp.graph.aggregate import SparseAdjacency, spmm


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


def test_shape_mismatch_is_an_error():
    adj, _ = _random_csr(5, 7, 0.5, seed=3)
    with pytest.raises(ValueError, match="7 columns"):
        spmm(adj, torch.randn(6, 2))
