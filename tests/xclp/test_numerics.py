"""The numerics against the spec: LSH, kNN graph, influence solve, scores."""

import numpy as np
import pytest
import scipy.sparse as sp

from xclp import graph as graphs
from xclp import lsh
from xclp.influence import dense_inverse_columns, influence_columns, propagate
from xclp.propagation import class_weights, label_matrix, predict_from_scores

SEED = bytes(range(32))


def test_hyperplanes_depend_on_the_full_seed_only():
    a = lsh.hyperplanes(SEED, 64, 5)
    assert np.array_equal(a, lsh.hyperplanes(SEED, 64, 5))
    other = bytearray(SEED)
    other[31] ^= 1  # the last byte matters: the whole 256-bit seed is used
    assert not np.allclose(a, lsh.hyperplanes(bytes(other), 64, 5))
    with pytest.raises(ValueError):
        lsh.hyperplanes(b"short", 64, 5)


def test_packed_hashes_match_signs(rng):
    X = rng.normal(size=(7, 9))
    bits = lsh.hash_vectors(X, SEED, 20)
    assert bits.shape == (7, 3) and bits.dtype == np.uint8
    expect = (lsh.l2_normalise(X) @ lsh.hyperplanes(SEED, 20, 9).T) > 0
    assert np.array_equal(lsh.unpack(bits, 20), expect)


def test_hamming_matrix_is_exact(rng):
    a = np.packbits(rng.integers(0, 2, (13, 77)).astype(np.uint8), axis=1)
    b = np.packbits(rng.integers(0, 2, (9, 77)).astype(np.uint8), axis=1)
    ref = np.bitwise_count(a[:, None, :] ^ b[None, :, :]).sum(axis=2)
    assert np.array_equal(lsh.hamming_matrix(a, b, 77), ref)


def test_lsh_cosine_estimate_converges_as_L_grows(digits):
    X = lsh.l2_normalise(digits[0][:150])
    true = X @ X.T
    errors = []
    for L in (64, 512, 4096):
        b = lsh.hash_vectors(X, SEED, L)
        est = graphs.hamming_to_similarity(lsh.hamming_matrix(b, b, L), L)
        errors.append(np.abs(est - true).mean())
    # The estimate's error shrinks like 1/sqrt(L): each 8× more bits should cut it by ~2.8×.
    assert errors[0] > 2 * errors[1] > 4 * errors[2]
    assert errors[2] < 0.02


def _dense_knn_reference(D, k):
    """Independent kNN: stable sort by distance then index, self excluded."""
    n = D.shape[0]
    B = np.zeros_like(D, dtype=bool)
    for i in range(n):
        order = sorted((j for j in range(n) if j != i), key=lambda j: (D[i, j], j))[:k]
        B[i, order] = True
    return B


def test_knn_accumulator_is_order_independent_with_ties(rng):
    n, k = 40, 5
    D = rng.integers(0, 6, (n, n))  # many ties
    D = np.triu(D, 1) + np.triu(D, 1).T
    ref = _dense_knn_reference(D, k)
    cuts = [0, 7, 19, 40]
    blocks = [(i, j) for i in range(3) for j in range(i, 3)]
    for perm in (blocks, blocks[::-1], [blocks[3], blocks[0], blocks[5], blocks[1], blocks[4], blocks[2]]):
        acc = graphs.KnnAccumulator(n, k)
        for i, j in perm:
            r, c = np.arange(cuts[i], cuts[i + 1]), np.arange(cuts[j], cuts[j + 1])
            acc.add_block(r, c, D[np.ix_(r, c)])
        assert acc.complete()
        got = np.zeros((n, n), dtype=bool)
        got[np.repeat(np.arange(n), k), acc.idx.ravel()] = True
        assert np.array_equal(got, ref)


def test_normalised_adjacency_matches_the_formula(rng):
    B = sp.random(30, 30, density=0.2, random_state=1, format="csr")
    W = graphs.normalised_adjacency(B).toarray()
    Wd = B.toarray() + B.toarray().T
    np.fill_diagonal(Wd, 0)
    d = Wd.sum(1)
    d[d == 0] = 1
    assert np.allclose(W, Wd / np.sqrt(np.outer(d, d)))


def test_edge_weight_keeps_sign():
    assert np.allclose(graphs.edge_weight(np.array([-0.5, 0.5]), 3), [-0.125, 0.125])
    assert np.allclose(graphs.edge_weight(np.array([-0.5, 0.5]), 2), [-0.25, 0.25])


@pytest.fixture(scope="module")
def digits_graph(digits):
    from xclp.baselines import build_graph

    return build_graph(digits[0][:1200], k=10, power=3, similarity="exact")


def test_cg_dense_and_inverse_agree(digits_graph, digits):
    y = digits[1][:1200]
    cols = np.random.default_rng(0).choice(1200, 120, replace=False)
    S_cg, info = influence_columns(digits_graph, cols, method="cg", tol=1e-10)
    S_dense, _ = influence_columns(digits_graph, cols, method="dense")
    S_inv = dense_inverse_columns(digits_graph, cols)
    assert info.method == "cg" and info.max_relative_residual < 1e-9
    assert np.allclose(S_dense, S_inv, atol=1e-8)
    assert np.abs(S_cg - S_dense).max() < 1e-6 * np.abs(S_dense).max()
    Y = label_matrix(y[cols], np.bincount(y[cols], minlength=10))
    assert np.array_equal((S_cg @ Y).argmax(1), (S_inv @ Y).argmax(1))


def test_block_solving_equals_one_block(digits_graph):
    cols = np.arange(0, 1200, 7)
    a, _ = influence_columns(digits_graph, cols, method="cg", block=16)
    b, _ = influence_columns(digits_graph, cols, method="cg", block=4096)
    assert np.allclose(a, b, atol=1e-9)


def test_auto_picks_dense_for_small_and_cg_for_large(digits_graph):
    _, small = influence_columns(digits_graph, np.arange(5), dense_max_n=5000)
    _, large = influence_columns(digits_graph, np.arange(5), dense_max_n=100)
    assert small.method == "dense" and large.method == "cg"


def test_signed_graph_still_solves_the_system(rng):
    # Negative weights can make I − α𝒲 indefinite; whatever route the solver takes (CG, or the
    # dense fallback when CG's true residual is too large), the columns must solve the system.
    B = sp.random(200, 200, density=0.05, random_state=3, format="csr")
    B.data = B.data - 0.5
    W = graphs.normalised_adjacency(B)
    S, info = influence_columns(W, np.arange(0, 200, 5), method="cg", alpha=0.99)
    E = np.eye(200)[:, ::5]
    assert np.abs((np.eye(200) - 0.99 * W.toarray()) @ S - E).max() < 1e-5, info


def test_propagate_equals_influence_times_Y(digits_graph, digits):
    y = digits[1][:1200]
    cols = np.arange(0, 1200, 10)
    Y = np.zeros((1200, 10))
    Y[cols] = label_matrix(y[cols], np.bincount(y[cols], minlength=10))
    Z, _ = propagate(digits_graph, Y, method="cg")
    S, _ = influence_columns(digits_graph, cols, method="cg")
    assert np.allclose(Z, S @ Y[cols], atol=1e-8)


def test_scores_labels_and_confidence():
    Z = np.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [-1.0, 3.0, 1.0]])
    p = predict_from_scores(Z, np.array([-1, -1, -1, 0]))
    assert p.labels.tolist() == [0, 0, -1, 0]  # row 1: tie → first; row 2: unreached; row 3: labelled keeps 0
    assert p.confidence[0] == 1.0 and abs(p.confidence[1]) < 1e-12 and p.confidence[2] == 0 and p.confidence[3] == 1
    assert np.allclose(p.probabilities[3], [0, 0.75, 0.25])  # clipped at 0, L1 rows


def test_confidence_is_divided_by_the_max():
    p = predict_from_scores(np.array([[3.0, 1.0], [1.0, 1.0], [2.0, 1.0]]))
    raw = 1 - np.array([-(0.75 * np.log(0.75) + 0.25 * np.log(0.25)), np.log(2), -(2 / 3 * np.log(2 / 3) + 1 / 3 * np.log(1 / 3))]) / np.log(2)
    assert np.allclose(p.confidence, raw / raw.max())


def test_class_balanced_label_matrix_and_class_weights():
    Y = label_matrix(np.array([0, 0, 1]), np.array([4, 2, 0]))
    assert np.allclose(Y, [[0.25, 0, 0], [0.25, 0, 0], [0, 0.5, 0]])
    w = class_weights(np.array([0, 0, 0, 1, -1]), 3)
    assert np.allclose(w, [(4 / 3) / 3, 4 / 3, 0])


def test_indefinite_system_is_solved_by_minres_and_matches_the_dense_inverse():
    # Signed weights (cos³ < 0 between points more than 90° apart) make I − α𝒲 indefinite. Beyond
    # the dense fallback's size this used to raise SolverError ("CG did not converge"); MINRES needs
    # only symmetry, and the labels must be those of the authors' dense inverse. n = 800 (ten edges a
    # point, as at 2,000, in a fifth of the CPU): I − α𝒲's least eigenvalue is −0.20 and CG fails on every
    # block (auto's method is "minres", not "cg+minres"); dense_fallback_max_n=0 stands for a large n.
    n = 800
    B = sp.random(n, n, density=10 / n, random_state=3, format="csr")
    B.data = B.data - 0.3
    W = graphs.normalised_adjacency(B)
    cols = np.arange(0, n, 5)
    S, info = influence_columns(W, cols, method="auto", dense_max_n=100, dense_fallback_max_n=0)
    assert info.method == "minres" and info.max_relative_residual < 1e-8
    S_inv = dense_inverse_columns(W, cols)
    assert np.abs(S - S_inv).max() < 1e-6 * np.abs(S_inv).max()
    y = np.random.default_rng(0).integers(0, 4, cols.size)
    Y = label_matrix(y, np.bincount(y, minlength=4))
    assert np.array_equal((S @ Y).argmax(1), (S_inv @ Y).argmax(1))
    S_m, info_m = influence_columns(W, cols, method="minres")
    assert info_m.method == "minres" and np.allclose(S_m, S, atol=1e-7)


def test_a_singular_system_raises_a_clear_solver_error():
    from xclp.influence import SolverError

    # 𝒲 = the adjacency of one edge: eigenvalues ±1; with α → 1 the matrix is nearly singular and
    # no iterative solver reaches 1e-14 within 5 iterations: a clear error, not a wrong answer.
    B = sp.csr_matrix(np.array([[0.0, 1.0], [1.0, 0.0]]))
    W = graphs.normalised_adjacency(B)
    with pytest.raises(SolverError, match="did not converge.*too large for the dense fallback"):
        influence_columns(W, np.arange(2), alpha=0.999999, method="minres", tol=1e-300, max_iter=1,
                          dense_fallback_max_n=0)
