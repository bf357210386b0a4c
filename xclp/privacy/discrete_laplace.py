"""Noisy vote counts: the discrete Laplace mechanism (the "Laplace(1/γ)" of PATE, FedKT and FREDY).

A vote count is an integer, so it gets integer noise: the discrete Laplace (two-sided geometric)
distribution P(k) = (1 − q)/(1 + q) · q^|k|, q = e^(−γ), k ∈ Z (Ghosh, Roughgarden & Sundararajan
2009; Canonne, Kamath & Steinke 2020). With parameter γ it is γ·Δ-DP for a query of L1 sensitivity
Δ, exactly the ε of continuous Laplace(1/γ), and it has none of the floating-point weaknesses of a
continuous Laplace sampler (Mironov 2012). The ledger accounts it by dp-accounting's PLD of the
discrete Laplace mechanism.

Sampling: X = G₁ − G₂ with G_i geometric on {0, 1, …}, P(G = g) = (1 − q)·q^g, each by inversion,
G = ⌊ln U / ln q⌋ with U uniform in (0, 1] (53 bits). U comes from AES-256-CTR
(crypto.secure_sum.prg_uint64) keyed with os.urandom at a real site, never from numpy's generator;
a simulation may pass a key derived from its seed, to be reproducible.

A vote count vector (one count per class) changes in two classes when one voter changes its vote:
the argmax of noisy counts is accounted as TWO releases of a sensitivity-s query per point (s: the
weight of one voter's vote; the privacy loss of independent noise on each count is the sum of the
losses of the counts that moved).
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from crypto.secure_sum import prg_uint64
from xclp.privacy.ledger import DiscreteLaplaceEvent, epsilon_of


def sample(shape, gamma: float, key: bytes | None = None) -> np.ndarray:
    """Discrete Laplace noise with parameter γ > 0 (int64 array of `shape`)."""
    if not (gamma > 0 and math.isfinite(gamma)):
        raise ValueError(f"the discrete Laplace parameter γ must be a positive number, got {gamma}")
    count = int(np.prod(shape))
    words = prg_uint64(key if key is not None else os.urandom(32), 2 * count)
    u = ((words >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # uniform in (0, 1]
    g = np.floor(np.log(u) / -gamma).astype(np.int64)  # ln q = −γ
    return (g[:count] - g[count:]).reshape(shape)


def event(gamma: float, sensitivity: int = 1) -> DiscreteLaplaceEvent:
    return DiscreteLaplaceEvent(float(gamma), int(sensitivity))


def noisy_argmax(counts: np.ndarray, gamma: float | None, threshold: float, key: bytes | None = None) -> np.ndarray:
    """Per row of `counts` (points × classes): the class of the largest (noisy) count, or −1 where it
    is below `threshold` — a point nobody voted for is never labelled class 0. The threshold is
    applied to the noisy counts, so the answer is post-processing of the mechanism's output. Ties:
    the lowest class."""
    counts = np.asarray(counts, dtype=np.int64)
    noisy = counts if gamma is None else counts + sample(counts.shape, gamma, key)
    label = noisy.argmax(axis=1) if noisy.size else np.zeros(len(noisy), dtype=np.int64)
    top = noisy.max(axis=1) if noisy.size else np.zeros(len(noisy))
    return np.where(top >= threshold, label, -1).astype(np.int64)


def run_gamma(gamma: float | None, epsilon: float | None, delta: float, releases: int,
              sensitivity: int = 1) -> float | None:
    """γ of a run that releases `releases` noisy counts: the γ given (refused if it would spend more
    than a budget also given), else the least noise within the budget, else None (no noise)."""
    if gamma is not None:
        if epsilon is not None:
            eps = epsilon_of(event(gamma, sensitivity), releases, delta)
            if eps > epsilon:
                raise ValueError(f"γ = {gamma:g} spends ε = {eps:.4g} at δ = {delta:g} over the {releases} noisy counts, "
                                 f"past the budget ε = {epsilon:g}: give a smaller γ, or only the budget")
        return gamma
    return None if epsilon is None else gamma_for_budget(epsilon, delta, releases, sensitivity)


@functools.lru_cache(maxsize=64)
def gamma_for_budget(epsilon: float, delta: float, releases: int, sensitivity: int = 1) -> float:
    """The largest γ (least noise) for which `releases` uses of a sensitivity-`sensitivity` query with
    discrete Laplace noise compose (PLD) to at most ε at δ, to a relative 1e-5 (γ from 1e-6 to 50).

    Each evaluation composes `releases` PLDs (~1-2 s at 200), and one at a large γ costs far more
    (the loss's support grows with γ·Δ: γ = 50 took ~23 s at 200 releases), so the search starts where
    the answer is and never evaluates a point twice. Start: the pure-DP composition's γ = ε/(releases·Δ)
    (each release is γΔ-DP, k of them kγΔ-DP: the PLD's ε there is at most about ε). Walk: ε(δ) of a
    composition of discrete Laplace releases grows at least linearly in γ (linear where composition is
    pure, γ + γ² where it is "advanced": Kairouz, Oh & Viswanath 2015), so γ·ε/ε(γ) lies on the other
    side of the root — one step brackets it (a floor on the step keeps the walk finite if it did not).
    Then brentq in that bracket (it bisects at the end: the PLD's ε moves in steps of ~1e-4 relative).
    γ to a relative 1e-5 is the least noise for any purpose (1e-9 took ~36 evaluations)."""
    from scipy.optimize import brentq  # (here, not with the module: xclp.privacy.ledger's _dpa says why)

    if releases < 1:
        raise ValueError("at least one release")
    lo, hi = math.log(1e-6), math.log(50.0)

    @functools.cache
    def gap(log_gamma: float) -> float:
        return epsilon_of(event(math.exp(log_gamma), sensitivity), releases, delta) - epsilon

    def refuse():
        return ValueError(f"no discrete Laplace noise keeps {releases} releases within ε = {epsilon:g} at δ = {delta:g}")

    x = min(max(math.log(epsilon / (releases * sensitivity)), lo), hi)
    while True:  # walk to a bracket [a, b]: gap(a) ≤ 0 < gap(b)
        spent = gap(x) + epsilon
        step = math.log(epsilon / spent) if spent > 0 else 7.0  # log of ε / ε(γ) (ε(γ) = 0: a large step)
        if gap(x) <= 0:
            if x >= hi:
                return math.exp(hi)
            a, b = x, min(x + max(step, 0.01), hi)
            if gap(b) > 0:
                break
        else:
            if x <= lo or gap(lo) > 0:  # (a small γ costs little to evaluate)
                raise refuse()
            a, b = max(x + min(step, -0.01), lo), x
            if gap(a) <= 0:
                break
        x = b if gap(x) <= 0 else a
    xtol = 1e-5
    x = brentq(gap, a, b, xtol=xtol)
    while gap(x) > 0:  # step to the root's safe side if brentq lands a hair past it
        x -= xtol
    return math.exp(x)
