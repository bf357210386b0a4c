"""Exact-integer distribution tests for the samplers (shared by tests/crypto and tests/xclp).

Every check works on the exact integers a sampler returns (never on float64 conversions of values
wider than 53 bits) and raises AssertionError when the sample is implausible. Each check is given a
false-failure budget `alpha` and splits it among its sub-tests (Bonferroni): exact binomial tails for
single bits and tail counts; the χ² approximation for histograms, with bins pooled until every
expected count is at least 50, where the approximation's relative error in the tail is a small
factor. The callers use alpha = 1e-11 per check, so that a check of a correct sampler fails with
probability below 1e-9 even allowing for that factor; the samplers are fed fixed keys where they take
one (or a fixed keystream by monkeypatching), so the suite is deterministic.

tests/crypto/test_sampler_distributions.py and tests/xclp/test_noise_distributions.py apply biased,
truncated and low-bit-zeroed mutants of every sampler and assert that these checks fail on each.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 1e-11
MIN_EXPECTED = 50


def chi2_fit(values, support, probs, alpha: float, what: str) -> None:
    """Counts of the integers `values` at `support` (with probabilities `probs`, summing to ≤ 1)
    against their expectation. Values outside the support go to a rest bin with the missing mass;
    a value where the mass is (numerically) zero fails at once."""
    values = np.asarray(values)
    support = np.asarray(support)
    probs = np.asarray(probs, dtype=np.float64)
    n = values.size
    index = {int(v): i for i, v in enumerate(support.tolist())}
    uniq, cnt = np.unique(values, return_counts=True)
    observed = np.zeros(support.size + 1)
    for v, c in zip(uniq.tolist(), cnt.tolist()):
        observed[index.get(int(v), support.size)] += c
    rest = max(0.0, 1.0 - float(probs.sum()))
    expected = np.append(probs, rest) * n
    if expected[-1] < 1e-6:
        assert observed[-1] == 0, f"{what}: {int(observed[-1])} values outside the support"
        observed, expected = observed[:-1], expected[:-1]
    _chi2(observed, expected, alpha, what)


def chi2_uniform(counts, alpha: float, what: str) -> None:
    counts = np.asarray(counts, dtype=np.float64)
    _chi2(counts, np.full(counts.size, counts.sum() / counts.size), alpha, what)


def _chi2(observed, expected, alpha, what) -> None:
    # pool bins (in order of expectation, smallest first) until every bin expects ≥ MIN_EXPECTED
    order = np.argsort(expected, kind="stable")
    obs, exp = [], []
    o_acc = e_acc = 0.0
    for i in order:
        o_acc += observed[i]
        e_acc += expected[i]
        if e_acc >= MIN_EXPECTED:
            obs.append(o_acc)
            exp.append(e_acc)
            o_acc = e_acc = 0.0
    if e_acc > 0 or o_acc > 0:
        if obs:
            obs[-1] += o_acc
            exp[-1] += e_acc
        else:
            obs.append(o_acc)
            exp.append(e_acc)
    obs, exp = np.array(obs), np.array(exp)
    assert obs.size >= 2, f"{what}: too few samples for a χ² test"
    stat = float(((obs - exp) ** 2 / exp).sum())
    p = stats.chi2.sf(stat, obs.size - 1)
    assert p > alpha, f"{what}: χ² = {stat:.1f} on {obs.size - 1} degrees of freedom, p = {p:.3g} ≤ {alpha:g}"


def binomial_ok(successes: int, n: int, p: float, alpha: float, what: str) -> None:
    """Two-sided exact binomial test."""
    lo = stats.binom.cdf(successes, n, p)
    hi = stats.binom.sf(successes - 1, n, p)
    pval = min(1.0, 2 * min(lo, hi))
    assert pval > alpha, f"{what}: {successes} of {n} where p = {p:g} (expected {n * p:.1f}), p-value {pval:.3g}"


def bits_fair(words: np.ndarray, nbits: int, alpha: float, what: str, offset: int = 0) -> None:
    """Every bit 0 … nbits−1 of the non-negative int64 `words` is 1 in half the samples (exact
    binomial test per bit, alpha split among the bits). `offset` only names the bits in messages."""
    w = np.asarray(words).astype(np.uint64).ravel()
    assert (np.asarray(words) >= 0).all(), f"{what}: negative word"
    n = w.size
    for j in range(nbits):
        ones = int(((w >> np.uint64(j)) & np.uint64(1)).sum())
        binomial_ok(ones, n, 0.5, alpha / nbits, f"{what}: bit {j + offset}")
    assert int((w >> np.uint64(nbits)).max(initial=0)) == 0, f"{what}: a value has bits above bit {nbits + offset - 1}"


def split_words(values: list[int], word: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative Python ints (< 2^(2·word)) → (low word, high word) int64 arrays, exactly."""
    mask = (1 << word) - 1
    assert all(v >= 0 for v in values)
    return (np.array([v & mask for v in values], dtype=np.int64), np.array([v >> word for v in values], dtype=np.int64))
