"""Sparse influence columns (xclp.push) against the exact solve, and the executors (xclp.executor)."""

import numpy as np
import pytest

from xclp import graph as graphs
from xclp import lsh
from xclp.executor import make_executor
from xclp.influence import influence_columns, propagate
from xclp.push import push_batch, sparse_influence

ALPHA = 0.99


@pytest.fixture(scope="module")
def small_graph(digits):
    X, y = digits
    codes = lsh.hash_vectors(X.astype(np.float64), bytes(range(32)), 512)
    n = codes.shape[0]
    acc = graphs.KnnAccumulator(n, 10)
    acc.add_block(np.arange(n), np.arange(n), lsh.hamming_matrix(codes, codes, 512))
    B = graphs.knn_matrix(acc, lambda h: graphs.edge_weight(graphs.hamming_to_similarity(h, 512), 3.0))
    labelled = np.flatnonzero(np.random.default_rng(0).random(n) < 0.1)
    return graphs.normalised_adjacency(B), graphs.degrees(B), labelled, y


def test_push_meets_its_error_bound(small_graph):
    W, deg, cols, _ = small_graph
    eps = 1e-3
    x, r = push_batch(W, np.sqrt(deg), cols, ALPHA, eps)
    S, _ = influence_columns(W, cols, ALPHA, method="dense")
    bound = eps * np.sqrt(np.outer(deg, deg[cols])) / (1 - ALPHA)
    err = S - x.toarray()
    assert err.min() >= -1e-12  # push underestimates: what is left is S r ≥ 0
    assert np.all(err <= bound + 1e-12)
    # the invariant S e_u = x_u + S r_u, exactly
    assert np.allclose(S, x.toarray() + _solve(W, r.toarray()))
    assert x.nnz < 0.1 * x.shape[0] * x.shape[1]  # sparse


def _solve(W, R):
    n = W.shape[0]
    return np.linalg.solve(np.eye(n) - ALPHA * W.toarray(), R)


def test_sparse_influence_gives_the_exact_labels(small_graph):
    W, deg, cols, y = small_graph
    cols_approx = sparse_influence(W, deg, cols, ALPHA, eps=1e-3, rank=48)
    Y = np.eye(10)[y[cols]]
    exact = propagate(W, _embed(Y, cols, W.shape[0]), ALPHA)[0].argmax(axis=1)
    assert np.mean((cols_approx @ Y).argmax(axis=1) == exact) >= 0.99
    pushed_only = sparse_influence(W, deg, cols, ALPHA, eps=1e-3, rank=0)
    assert np.mean((cols_approx @ Y).argmax(axis=1) == exact) > np.mean((pushed_only @ Y).argmax(axis=1) == exact)


def _embed(Y, cols, n):
    out = np.zeros((n, Y.shape[1]))
    out[cols] = Y
    return out


def test_negative_weights_are_refused(small_graph):
    W, deg, cols, _ = small_graph
    W = W.copy()
    W.data[0] = -abs(W.data[0])
    with pytest.raises(ValueError, match="non-negative"):
        sparse_influence(W, deg, cols)


def test_process_pool_and_dask_give_identical_columns(small_graph):
    distributed = pytest.importorskip("distributed")
    W, deg, cols, _ = small_graph
    serial = sparse_influence(W, deg, cols, ALPHA, rank=16)
    import xclp.push as push

    old, push.BATCH = push.BATCH, 64  # several tasks per executor
    try:
        with make_executor("process", workers=2) as ex:
            pooled = sparse_influence(W, deg, cols, ALPHA, rank=16, executor=ex)
        with distributed.LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster, \
                distributed.Client(cluster) as client, make_executor("dask", client=client) as ex:
            dasked = sparse_influence(W, deg, cols, ALPHA, rank=16, executor=ex)
    finally:
        push.BATCH = old
    for other in (pooled, dasked):
        assert (other.x != serial.x).nnz == 0
        assert np.array_equal(other.basis, serial.basis) and np.array_equal(other.coef, serial.coef)


def test_the_spectral_basis_of_a_graph_of_tiny_components_stays_finite():
    # A blocked graph over 100 points (3 sites, one dropped; max_bucket 4, no descent) that had 93
    # components: 3 pairs, 2 paths of 3, 88 points alone — eigenvalues ±1 (5 each) and 0, fewer near 1
    # than the block of 24, so the block's smallest Ritz value reached −1 and the Chebyshev filter's
    # float32 recurrence overflowed (eigh "failed to converge") before its lower edge was kept ≥ 0.
    # Its 𝒲 exactly (normalised weights, as hex: the ±1 are exact only so).
    import scipy.sparse as sp

    from xclp.push import spectral_basis

    edges = [(24, 83, "0x1.8dbc4f6383618p-1"), (29, 83, "0x1.4269d4debecf9p-1"), (31, 91, "0x1p+0"),
             (36, 88, "0x1p+0"), (40, 42, "0x1.5343f1d33186ap-1"), (42, 67, "0x1.7f763b1f4b4ffp-1"), (51, 89, "0x1p+0")]
    i, j = np.array([e[0] for e in edges]), np.array([e[1] for e in edges])
    w = np.array([float.fromhex(e[2]) for e in edges])
    W = sp.coo_matrix((np.r_[w, w], (np.r_[i, j], np.r_[j, i])), shape=(100, 100)).tocsr()
    lam, U = spectral_basis(W, 8)
    assert U.shape == (100, 8) and np.all(np.isfinite(U)) and np.allclose(lam[:5], 1.0, atol=1e-6)


def test_tall_skinny_qr_spans_the_block_over_chunks_of_any_size(monkeypatch):
    """`_tall_qr` (the basis's QR over row chunks) gives orthonormal columns spanning the block, also
    when the last chunk has fewer rows than the block has columns."""
    import torch

    from xclp import push

    A = torch.randn(203, 9, generator=torch.Generator().manual_seed(3))
    for rows in (1 << 17, 50, 16):  # one chunk; four and a short one (3 rows < 9 columns); thirteen
        monkeypatch.setattr(push, "ROWS", rows)
        Q = push._tall_qr(A)
        assert Q.dtype == torch.float64 and Q.shape == (203, 9)
        assert torch.allclose(Q.T @ Q, torch.eye(9, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(Q @ (Q.T @ A.double()), A.double(), atol=1e-5)
