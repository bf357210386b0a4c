"""Single-party label propagation, and the two baselines every XCLP run is compared with.

- per-site LP: each site alone, on a graph of its own points (what a site can do without XCLP);
- centralized LP: all points pooled, exact cosine — the non-private upper reference.

Both use the same numerics as XCLP (kNN, weight power, symmetric normalisation, class-balanced Y,
clipping, confidences), so a difference in accuracy is the graph's doing, not the recipe's. With
`standardize` (XCLP's default) they scale features as a party alone can: a site by its own points'
moments, the pooled reference by all points' — what XCLP's federated standardisation reaches.
"""

from __future__ import annotations

import numpy as np

from xclp import graph as graphs
from xclp import lsh
from xclp.data import Dataset
from xclp.influence import propagate
from xclp.job_options import JOB_DEFAULTS
from xclp.propagation import Prediction, class_counts, label_matrix, predict_from_scores
from xclp.standardisation import standardisation_stats, standardise


def standardised(X: np.ndarray) -> np.ndarray:
    """X scaled by its own points' mean and variance, with the protocol's rule for a constant feature."""
    return standardise(X, standardisation_stats(X))[0]


def build_graph(X: np.ndarray, k: int = JOB_DEFAULTS["k"], power: float = 3.0, similarity: str = "exact", bits: int = 4096,
                seed: bytes = b"\0" * 32, normalise: bool = True):
    gp = graphs.GraphParams(k=k, power=power, similarity=similarity)
    if similarity == "exact":
        return graphs.exact_cosine_graph(X, gp)
    b = lsh.hash_vectors(X, seed, bits, normalise)
    acc = graphs.KnnAccumulator(X.shape[0], k)
    idx = np.arange(X.shape[0])
    acc.add_block(idx, idx, lsh.hamming_matrix(b, b, bits))
    return graphs.graph_from_hamming_blocks(acc, bits, gp)


def label_spreading(X: np.ndarray, y: np.ndarray, n_classes: int, k: int = JOB_DEFAULTS["k"], alpha: float = 0.99,
                    power: float = 3.0, similarity: str = "exact", bits: int = 4096, seed: bytes = b"\0" * 32,
                    balanced: bool = True, solver: str = "auto", tol: float = 1e-8) -> Prediction:
    """Label spreading on one party's points (Z = (I − α𝒲)^{-1} Y, then the XCLP post-processing)."""
    n = X.shape[0]
    lab = np.flatnonzero(y >= 0)
    if n < 2 or lab.size == 0:
        # Nothing to propagate over: labelled points keep their labels, the rest stay unreached.
        return predict_from_scores(np.zeros((n, n_classes)), y)
    W = build_graph(X, min(k, n - 1), power, similarity, bits, seed)
    Y = np.zeros((n, n_classes))
    Y[lab] = label_matrix(y[lab], class_counts(y, n_classes), balanced)
    Z, _ = propagate(W, Y, alpha, solver, tol)
    return predict_from_scores(Z, y)


def per_site_lp(ds: Dataset, standardize: bool = False, **kw) -> np.ndarray:
    """Labels from each site propagating alone on its own graph, aligned with the data set's rows."""
    out = np.empty(ds.n, dtype=np.int64)
    for s in ds.sites:
        idx = np.flatnonzero(ds.site == s)
        X = standardised(ds.X[idx]) if standardize else ds.X[idx]
        out[idx] = label_spreading(X, ds.y[idx], ds.n_classes, **kw).labels
    return out


def centralized_lp(ds: Dataset, standardize: bool = False, **kw) -> np.ndarray:
    """Labels from one graph over all points pooled (exact cosine by default): the upper reference."""
    return label_spreading(standardised(ds.X) if standardize else ds.X, ds.y, ds.n_classes, **kw).labels
