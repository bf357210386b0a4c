"""The DP noise samplers, tested on exact integers — and the tests tested: every check here fails on
biased, truncated and low-bit-zeroed mutants of its sampler (issue 22 items 7 and 8).

Checks (tests/distributions.py: each with a false-failure budget of 1e-11, below 1e-9 with the χ²
approximation's slack; fixed keys, so deterministic):
  discrete Gaussian   χ² against the exact pmf and a sign test at σ = 1 and 3 (2^17 draws each); at σ = 2^20:
                      χ² over 32 bins of equal mass, the low 8 bits χ²-uniform, the count beyond
                      3.5σ exact-binomial (a cut tail shows there)
  discrete Laplace    χ² against the exact pmf at γ = 0.5 and 2, and the count beyond 3/γ
  randomized response χ² of the (label, response) pairs against the mechanism's transition matrix

What no sampling test can see is a tail cut far out: Box–Muller's 8.57σ has mass 1e-17 beyond it.
That is why the Gaussian sampler is exact by construction (xclp.privacy.discrete_gaussian); its
rounded-Box–Muller predecessor is among the mutants, and fails at small σ, where rounding a
continuous Gaussian is visibly not the discrete Gaussian.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from distributions import ALPHA, binomial_ok, chi2_fit, chi2_uniform
from scipy import stats

from crypto.secure_sum import prg_uint64
from xclp.privacy import discrete_gaussian as dg
from xclp.privacy import discrete_laplace as dl
from xclp.privacy import gaussian_shares as gs
from xclp.privacy import randomized_response as rr

REAL_DG, REAL_DL, REAL_RR = dg.sample, dl.sample, rr.respond


# -- the checks ------------------------------------------------------------------------------------


def check_discrete_gaussian(alpha=ALPHA):
    for i, sigma in enumerate((1.0, 3.0)):
        x = dg.sample(1 << 17, sigma, bytes([i + 1]) * 32)
        assert x.dtype == np.int64
        span = int(12 * sigma) + 2
        support = np.arange(-span, span + 1)
        chi2_fit(x, support, dg.pmf(support, sigma), alpha / 7, f"discrete Gaussian σ = {sigma}")
        # symmetry: the sign of the non-zero draws is a fair coin
        binomial_ok(int((x > 0).sum()), int((x != 0).sum()), 0.5, alpha / 7, f"discrete Gaussian σ = {sigma}: signs")
    sigma = float(1 << 20)
    n = 1 << 17
    x = dg.sample(n, sigma, b"\x07" * 32)
    # 32 bins of (nearly) equal mass; the discrete Gaussian's mass on [a, b] is Φ((b + ½)/σ) − Φ((a − ½)/σ)
    # up to terms of order e^(−2π²σ²) (Poisson summation): exact for any test.
    edges = np.round(sigma * stats.norm.ppf(np.arange(1, 32) / 32)).astype(np.int64)
    lower = np.concatenate([[-np.inf], edges + 0.5]) / sigma
    upper = np.concatenate([edges + 0.5, [np.inf]]) / sigma
    probs = stats.norm.cdf(upper) - stats.norm.cdf(lower)
    chi2_fit(np.searchsorted(edges, x, side="left"), np.arange(32), probs, alpha / 7, "discrete Gaussian σ = 2^20: bins")
    chi2_uniform(np.bincount(x & 255, minlength=256), alpha / 7, "discrete Gaussian σ = 2^20: low 8 bits")
    beyond = int((np.abs(x) > 3.5 * sigma).sum())
    binomial_ok(beyond, n, 2 * stats.norm.sf(3.5 + 0.5 / sigma), alpha / 7, "discrete Gaussian σ = 2^20: beyond 3.5σ")


def dl_pmf(k, gamma):
    q = math.exp(-gamma)
    return (1 - q) / (1 + q) * np.exp(-gamma * np.abs(np.asarray(k, dtype=np.float64)))


def check_discrete_laplace(alpha=ALPHA):
    n = 1 << 18
    for i, gamma in enumerate((0.5, 2.0)):
        x = dl.sample((n,), gamma, bytes([i + 9]) * 32)
        support = np.arange(-int(60 / gamma), int(60 / gamma) + 1)
        chi2_fit(x, support, dl_pmf(support, gamma), alpha / 4, f"discrete Laplace γ = {gamma}")
        k0 = math.ceil(3 / gamma)
        q = math.exp(-gamma)
        binomial_ok(int((np.abs(x) >= k0).sum()), n, 2 * q**k0 / (1 + q), alpha / 4, f"discrete Laplace γ = {gamma}: tail")


def check_randomized_response(alpha=ALPHA):
    k, p = 5, 0.3
    labels = np.repeat(np.arange(k), 1 << 16)
    out = rr.respond(labels, p, k, b"\x05" * 32)
    assert out.shape == labels.shape
    pairs = labels * k + out
    trans = np.full((k, k), p / k) + np.eye(k) * (1 - p)
    chi2_fit(pairs, np.arange(k * k), (trans / k).ravel(), alpha, "randomized response")


# -- the samplers pass ------------------------------------------------------------------------------


def test_the_discrete_gaussian_is_exact():
    check_discrete_gaussian()


def test_the_discrete_laplace_has_its_pmf():
    check_discrete_laplace()


def test_randomized_response_flips_at_its_rate():
    check_randomized_response()


def test_noise_shares_come_from_the_exact_sampler_on_the_grid(monkeypatch):
    calls = []

    def spy(count, sigma, key=None, *, sigma2=None):
        calls.append(sigma2)
        return REAL_DG(count, sigma, key, sigma2=sigma2)

    monkeypatch.setattr(dg, "sample", spy)
    share = gs.noise_share(1000, 0.25, 32, key=b"s" * 32).view(np.int64)
    assert calls == [(gs.grid_sigma(0.25, 32)) ** 2] and share.std() == pytest.approx(0.25 * 2**32, rel=0.1)
    from xclp.privacy import label_dp

    noise = label_dp.noise((30, 4), 0.5, b"k" * 32, 40)
    assert noise.dtype == np.int64 and noise.shape == (30, 4) and calls[-1] == gs.grid_sigma(0.5, 40) ** 2


def test_the_exact_coins_have_their_probabilities():
    # Bernoulli(exp(−a/b)) (CKS Algorithm 1, and ⌊γ⌋ coins of exp(−1) past 1) and the uniform integers
    # below a bound, which everything else is built of.
    coins = dg.CoinSource(b"t" * 32)
    n = 40_000
    for a, b in ((3, 10), (1, 1), (5, 2), (0, 7)):
        hits = sum(dg.bernoulli_exp(a, b, coins) for _ in range(n))
        binomial_ok(hits, n, math.exp(-a / b), ALPHA / 5, f"Bernoulli(exp(−{a}/{b}))")
    draws = np.array([coins.below(3 << 70) >> 70 for _ in range(30_000)])  # three bins of 2^70 values
    chi2_uniform(np.bincount(draws, minlength=3), ALPHA / 5, "uniform below 3·2^70")


# -- the mutants fail ---------------------------------------------------------------------------------


def _every(n: int, k: int) -> np.ndarray:
    return (np.arange(n) % k == 0).astype(np.int64)


def box_muller_rounded(count, sigma, key=None, *, sigma2=None):
    """The sampler before issue 22: Box–Muller on 53-bit uniforms, scaled and rounded to the grid."""
    s = float(sigma) if sigma2 is None else math.sqrt(float(sigma2))
    pairs = (count + 1) // 2
    words = prg_uint64(key or b"\x00" * 32, 2 * pairs)
    u = ((words >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u[:pairs]))
    z = np.concatenate([r * np.cos(2 * np.pi * u[pairs:]), r * np.sin(2 * np.pi * u[pairs:])])[:count]
    return np.rint(z * s).astype(np.int64)


DG_MUTANTS = {
    "rounded Box–Muller": box_muller_rounded,
    "truncated at 3σ": lambda count, sigma, key=None, **kw: np.clip(REAL_DG(count, sigma, key, **kw),
                                                                     -3 * sigma, 3 * sigma).astype(np.int64),
    "biased": lambda count, sigma, key=None, **kw: REAL_DG(count, sigma, key, **kw) + _every(count, 16),
    "low bit zeroed": lambda count, sigma, key=None, **kw: REAL_DG(count, sigma, key, **kw) & ~1,
}
DL_MUTANTS = {
    "biased (γ 10 % off)": lambda shape, gamma, key=None: REAL_DL(shape, gamma * 1.1, key),
    "truncated at 3/γ": lambda shape, gamma, key=None: np.clip(REAL_DL(shape, gamma, key), -int(3 / gamma),
                                                               int(3 / gamma)),
    "low bit zeroed": lambda shape, gamma, key=None: REAL_DL(shape, gamma, key) & ~1,
}


def _rr_truncated(labels, p, k, key=None):
    out = REAL_RR(labels, p, k, key)
    out[(out == k - 1) & (labels != k - 1)] = 0  # the replacement never k − 1
    return out


RR_MUTANTS = {
    "biased (p 10 % low)": lambda labels, p, k, key=None: REAL_RR(labels, p * 0.9, k, key),
    "truncated": _rr_truncated,
    "low bit zeroed": lambda labels, p, k, key=None: REAL_RR(labels, p, k, key) & ~1,
}


@pytest.mark.parametrize("name", DG_MUTANTS)
def test_the_discrete_gaussian_check_catches(name, monkeypatch):
    monkeypatch.setattr(dg, "sample", DG_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_discrete_gaussian()


@pytest.mark.parametrize("name", DL_MUTANTS)
def test_the_discrete_laplace_check_catches(name, monkeypatch):
    monkeypatch.setattr(dl, "sample", DL_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_discrete_laplace()


@pytest.mark.parametrize("name", RR_MUTANTS)
def test_the_randomized_response_check_catches(name, monkeypatch):
    monkeypatch.setattr(rr, "respond", RR_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_randomized_response()


def test_the_fast_sampler_is_exact_where_its_float_bounds_do_not_decide(monkeypatch):
    # With a huge slack most coins fall between the float bounds and are decided by the exact rational
    # comparison; the distribution must not move. And the exact comparison itself: P(U < exp(−γ)).
    monkeypatch.setattr(dg, "MARGIN", 0.05)
    x = dg.sample(1 << 14, 1.0, b"m" * 32)
    support = np.arange(-14, 15)
    chi2_fit(x, support, dg.pmf(support, 1.0), ALPHA, "discrete Gaussian, mostly exact coins")
    coins = dg.CoinSource(b"c" * 32)
    n = 4000
    for gamma in (Fraction(1, 3), Fraction(5, 2), Fraction(130)):
        hits = sum(dg._less_than_exp(coins.below(1 << 53), gamma, coins) for _ in range(n))
        binomial_ok(hits, n, math.exp(-float(gamma)), ALPHA / 3, f"U < exp(−{gamma})")


def test_the_fast_sampler_and_the_reference_agree():
    # Same distribution (χ² homogeneity of the two samples at σ = 2.5), different algorithms' coins.
    a = dg.sample(1 << 15, 2.5, b"a" * 32)
    b = dg.sample_reference(1 << 15, 2.5, b"b" * 32)
    values = np.arange(-12, 13)
    table = np.array([[(np.clip(s, -12, 12) == v).sum() for v in values] for s in (a, b)])
    table = table[:, table.sum(axis=0) >= 50]
    assert stats.chi2_contingency(table)[1] > ALPHA
