"""Federated standardisation: each feature to the mean and variance of ALL sites' points. A site's share
of the global moments ([n, Σx, Σx²], `standardisation_stats`) rides on a masked secure sum — the label
counts' in a prediction job (`counts_length`: the sum's values), its own in a training job — so the
coordinator never learns them and every site does; `standardise` applies the sum."""

from __future__ import annotations

import numpy as np

from crypto.errors import ProtocolError
from crypto.fixedpoint import LIMBS

STATS_FRAC_BITS = 32  # the standardisation sums' fixed point (crypto.fixedpoint.to_limbs: 96-bit limbs)
CONSTANT_VAR = 1e-12  # a feature whose variance is below this (relative to max(1, μ²)) is constant


def counts_length(params, features: int) -> int:
    """The counts sum's uint64 values (`params`: a prediction job's JobParams): one per class, then
    (with `standardize`) the limbs of the sites' point count, per-feature sums and sums of squares."""
    return params.n_classes + (LIMBS * (1 + 2 * int(features)) if params.standardize else 0)


def standardisation_stats(X: np.ndarray) -> np.ndarray:
    """A site's share of the global moments: [n, Σx (per feature), Σx² (per feature)]."""
    X = np.asarray(X, dtype=np.float64)
    return np.concatenate([[float(X.shape[0])], X.sum(axis=0), (X * X).sum(axis=0)])


def standardise(X: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X − μ)/σ with μ, σ of all sites' points, from the summed `standardisation_stats`; a feature
    with no spread keeps σ = 1. Returns (standardised X, μ, σ)."""
    d = X.shape[1]
    n, s1, s2 = total[0], total[1:1 + d], total[1 + d:1 + 2 * d]
    if n < 1:
        raise ProtocolError("standardisation over no points")
    mean = s1 / n
    var = np.maximum(s2 / n - mean * mean, 0.0)
    std = np.sqrt(var)
    # Σx²/n − μ² cancels: a constant feature comes out at rounding noise (≈ 1e-16·μ² plus the sums'
    # 2^-32 grain), not 0. Below this it is constant, and is only centred.
    std[var <= CONSTANT_VAR * np.maximum(1.0, mean * mean)] = 1.0
    return (np.asarray(X, dtype=np.float64) - mean) / std, mean, std
