"""The exact discrete Gaussian N_Z(0, σ²): P(x) ∝ exp(−x²/(2σ²)) on the integers, for the noise shares
of DP-FedAvg and of XCLP's label-DP sums (xclp.privacy.gaussian_shares, label_dp).

Why not Box–Muller: normal variates from 53-bit uniforms never exceed |Z| = √(−2 ln 2^−53) ≈ 8.57,
so the noise has no tail past 8.57σ, and one release whose sensitivity is μσ has δ ≥ Φ(μ − 8.57)
whatever the accountant says (1.1·10^−4 at ε = 32, 0.25 at ε = 64, where δ = 10^−5 was stated;
issue 22 item 7). Nor do floating-point samplers have the density they claim (Mironov 2012).

This is Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020),
Algorithms 1–3, in exact integer arithmetic (σ² is a rational, every probability a ratio of Python
integers, every coin a uniform integer below a bound, drawn by rejection from CSPRNG bits):

    Bernoulli(exp(−γ)), γ = a/b ∈ [0, 1]:  K ← 1; while Bernoulli(γ/K): K ← K + 1; return K odd
                        γ > 1:             ⌊γ⌋ coins of Bernoulli(exp(−1)), then one of exp(−(γ − ⌊γ⌋))
    discrete Laplace of scale t (t = ⌊σ⌋ + 1):  U ← uniform{0..t−1}, keep if Bernoulli(exp(−U/t));
                        V ← geometric (count Bernoulli(exp(−1)) successes); Y = U + t·V;
                        sign B; reject (B = 1, Y = 0)
    discrete Gaussian:  Z = ±Y kept with probability exp(−(|Z| − σ²/t)² / (2σ²))

Its output has exactly the distribution N_Z(0, σ²) (CKS, Section 5): unbounded tails,
no rounding. The coins come from AES-256-CTR (crypto.secure_sum.prg_uint64) under a 32-byte key —
os.urandom at a real site, derived from a simulation's seed only to be reproducible — consumed as
whole 64-bit words (a bound b is met by taking ⌈log2 b⌉ bits and rejecting values ≥ b).

:func:`sample` runs the algorithm on a batch of candidates at a time with numpy (each coin decided
from 53 random bits against float bounds on its probability, and in exact rational arithmetic in the
rare case, about 2^−29 per coin, where those bounds do not decide: the output distribution is still
exact); :func:`sample_reference` is the one-value-at-a-time version it is tested against.
Rate (one core of the shared development machine, docs/privacy.md): about 1.3·10^6 values a second
for σ of 10^7–10^11 grid steps (the reference: 7·10^4). A DP-FedAvg share of the 235,146 weights of
the MLP takes about 0.2 s. MAX_VALUES bounds one call (about a minute).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np

from crypto.secure_sum import prg_uint64

MAX_VALUES = 1 << 26  # one call: about a minute; larger vectors are refused
_CHUNK = 1 << 14  # words of keystream drawn at a time


class CoinSource:
    """Uniform integers below a bound, from the AES-256-CTR keystream under `key` (os.urandom if None).
    Rejection sampling: exact, whatever the bound."""

    def __init__(self, key: bytes | None = None):
        self.key = key if key is not None else os.urandom(32)
        self.stream = 0
        self.words: list[int] = []

    def word(self) -> int:
        if not self.words:
            self.words = prg_uint64(self.key, _CHUNK, stream=self.stream).tolist()
            self.words.reverse()
            self.stream += 1
        return self.words.pop()

    def below(self, bound: int) -> int:
        """Uniform in {0, …, bound − 1}."""
        if bound <= 1:
            if bound == 1:
                return 0
            raise ValueError("a uniform integer needs a bound ≥ 1")
        k = (bound - 1).bit_length()
        while True:
            if k <= 64:
                r = self.word() >> (64 - k)
            else:
                r = 0
                for _ in range((k + 63) // 64):
                    r = (r << 64) | self.word()
                r >>= -k % 64
            if r < bound:
                return r

    def bit(self) -> int:
        return self.word() >> 63


def bernoulli_exp(a: int, b: int, coins: CoinSource) -> bool:
    """True with probability exp(−a/b), a ≥ 0, b > 0 integers (CKS Algorithm 1 and its extension)."""
    while a > b:  # exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋))
        if not _bernoulli_exp_unit(1, 1, coins):
            return False
        a -= b
    return _bernoulli_exp_unit(a, b, coins)


def _bernoulli_exp_unit(a: int, b: int, coins: CoinSource) -> bool:
    # γ = a/b ∈ [0, 1]: K ← 1; while Bernoulli(γ/K) K ← K + 1; the answer is whether K is odd
    k = 1
    while coins.below(b * k) < a:
        k += 1
    return k % 2 == 1


def _one(num: int, den: int, t: int, coins: CoinSource) -> int:
    """One draw of N_Z(0, σ²), σ² = num/den, t = ⌊σ⌋ + 1 (CKS Algorithm 3 with Algorithm 2 inlined)."""
    accept_den = 2 * t * t * num * den  # exp(−(Y − σ²/t)²/(2σ²)) = exp(−(Y·t·den − num)² / (2 t² num den))
    while True:
        u = coins.below(t)
        if not bernoulli_exp(u, t, coins):
            continue
        v = 0
        while bernoulli_exp(1, 1, coins):
            v += 1
        y = u + t * v
        negative = coins.bit()
        if negative and y == 0:
            continue
        d = y * t * den - num
        if bernoulli_exp(d * d, accept_den, coins):
            return -y if negative else y


def sigma_squared(sigma) -> Fraction:
    """σ² exactly: σ a positive int, Fraction or finite float (a float is taken at its exact value)."""
    s = Fraction(sigma)
    if not s > 0 or (isinstance(sigma, float) and not math.isfinite(sigma)):
        raise ValueError(f"a discrete Gaussian needs σ > 0, got {sigma!r}")
    return s * s


def _prepare(count: int, sigma, sigma2) -> tuple[int, int, int]:
    count = int(count)
    if not 0 <= count <= MAX_VALUES:
        raise ValueError(f"between 0 and {MAX_VALUES} values per call, got {count}")
    s2 = sigma_squared(sigma) if sigma2 is None else Fraction(sigma2)
    if not s2 > 0:
        raise ValueError("σ² must be positive")
    if s2 > 1 << 112:
        raise ValueError("σ above 2^56 grid steps: the values would not fit int64 with room for their tails")
    num, den = s2.numerator, s2.denominator
    return num, den, math.isqrt(num * den) // den + 1  # t = ⌊σ⌋ + 1


def sample_reference(count: int, sigma, key: bytes | None = None, *, sigma2: Fraction | None = None) -> np.ndarray:
    """CKS Algorithm 3 one value at a time, every coin by Algorithm 1 (slow: the reference that
    :func:`sample` is tested against)."""
    num, den, t = _prepare(count, sigma, sigma2)
    coins = CoinSource(key)
    return np.fromiter((_one(num, den, t, coins) for _ in range(int(count))), dtype=np.int64, count=int(count))


# -- the vectorised sampler ---------------------------------------------------------------------------
#
# The same algorithm, a batch of candidates at a time. Each coin Bernoulli(exp(−γ)) is decided by the
# exact event U < exp(−γ) for a uniform real U whose first 53 bits R are drawn for the whole batch:
# with γ known to relative precision 2^−49 (it is a ratio of integers, converted with correct
# rounding) and exp evaluated to within MARGIN, R + 1 ≤ 2^53 · exp(−γ)·(lower bound) proves U < exp(−γ)
# and R ≥ 2^53 · (upper bound) proves the opposite. Only when R falls between the bounds (probability
# about 2^−29 per coin) are further bits of U drawn and compared with exp(−γ) in exact rational
# arithmetic (:func:`_less_than_exp`). So every coin has probability exactly exp(−γ), and the output is
# exactly N_Z(0, σ²), as the one-at-a-time reference.

BATCH = 1 << 18  # candidates at a time: bounded memory for any count
MARGIN = 2.0**-30  # relative slack allowed to numpy's exp (it is within a few ulp, 2^−52)
REL = 2.0**-49  # relative error of γ as a float (a correctly rounded ratio, then one product)


class _Words:
    def __init__(self, key: bytes | None):
        import hashlib

        self.key = key if key is not None else os.urandom(32)
        self.stream = 0
        self.coins = CoinSource(hashlib.sha256(b"xclp/discrete-gaussian/exact-bits/v1" + self.key).digest())

    def words(self, n: int) -> np.ndarray:
        self.stream += 1
        return prg_uint64(self.key, int(n), stream=self.stream - 1)

    def below(self, bound: int, n: int) -> np.ndarray:
        """n uniform integers in {0, …, bound − 1} (bound ≤ 2^62), as int64."""
        k = (bound - 1).bit_length()
        out = np.empty(n, dtype=np.int64)
        have = 0
        while have < n:
            w = self.words(max(64, (n - have) * 2))
            w = (w >> np.uint64(64 - k)) if k else np.zeros_like(w)
            w = w[w < np.uint64(bound)][: n - have]
            out[have : have + w.size] = w.astype(np.int64)
            have += w.size
        return out


def _exp_bounds(g: Fraction, terms: int) -> tuple[Fraction, Fraction]:
    """Rational bounds lo ≤ exp(−g) ≤ hi (g ≥ 0) from `terms` terms of the series of exp(g)."""
    if g > 64:  # exp(−g) = exp(−g/k)^k with g/k ≤ 64: the series below converges for each factor
        k = math.ceil(g / 64)
        lo, hi = _exp_bounds(g / k, terms)
        return lo**k, hi**k
    total, term = Fraction(1), Fraction(1)
    for k in range(1, terms + 1):
        term = term * g / k
        total += term
    n = terms
    rest = term * g / (n + 1) * Fraction(n + 2, n + 2 - g) if n + 2 > g else None
    if rest is None:
        return Fraction(0), 1 / total
    return 1 / (total + rest), 1 / total


def _less_than_exp(r: int, gamma: Fraction, coins: CoinSource) -> bool:
    """Whether U < exp(−γ), U uniform in [0, 1) with first 53 bits r: draws further bits of U and
    refines the bounds on exp(−γ) until they decide."""
    lo_u, width = Fraction(r, 1 << 53), Fraction(1, 1 << 53)
    terms = 32
    while True:
        lo, hi = _exp_bounds(gamma, terms)
        if lo_u + width <= lo:
            return True
        if lo_u >= hi:
            return False
        lo_u += Fraction(coins.below(1 << 64), 1 << 64) * width  # the next 64 bits of U
        width /= 1 << 64
        terms += 32


def _bernoulli_exp_batch(g: np.ndarray, exact, words: _Words) -> np.ndarray:
    """Coins with probabilities exp(−γ_i): g ≈ γ (relative error ≤ REL), exact(i) → γ_i as a Fraction."""
    n = g.size
    if n == 0:
        return np.zeros(0, dtype=bool)
    r = (words.words(n) >> np.uint64(11)).astype(np.float64)  # 53 bits, exact in float64
    with np.errstate(under="ignore"):
        p_lo = np.exp(-g * (1 + REL)) * (1 - MARGIN) * 2.0**53
        p_hi = np.exp(-g * (1 - REL)) * (1 + MARGIN) * 2.0**53
    p_hi = np.maximum(p_hi, 0.5)  # exp(−γ) > 0 always: R = 0 is never rejected on a float that underflowed
    yes = r + 1 <= p_lo
    open_ = ~yes & (r < p_hi)
    for i in np.flatnonzero(open_).tolist():
        yes[i] = _less_than_exp(int(r[i]), exact(i), words.coins)
    return yes


def sample(count: int, sigma, key: bytes | None = None, *, sigma2: Fraction | None = None) -> np.ndarray:
    """`count` independent draws of N_Z(0, σ²) as int64 (σ in grid steps; or σ² given exactly as
    `sigma2`). Refuses σ that could overflow int64 (|x| < 2^62 needs σ ≤ 2^56: 64σ of room)."""
    num, den, t = _prepare(count, sigma, sigma2)
    count = int(count)
    words = _Words(key)
    accept_den = 2 * t * t * num * den
    tden = t * den
    out: list[np.ndarray] = []
    have = 0
    e1 = Fraction(1)
    while have < count:
        n = min(max(256, int((count - have) * 1.7) + 64), BATCH)
        # discrete Laplace of scale t (CKS Algorithm 2): U uniform below t, kept with prob exp(−U/t) …
        u = words.below(t, n)
        keep = _bernoulli_exp_batch(u.astype(np.float64) / float(t), lambda i, u=u: Fraction(int(u[i]), t), words)
        u = u[keep]
        # … V geometric: the number of Bernoulli(exp(−1)) successes before the first failure …
        v = np.zeros(u.size, dtype=np.int64)
        live = np.arange(u.size)
        while live.size:
            hit = _bernoulli_exp_batch(np.ones(live.size), lambda i: e1, words)
            live = live[hit]
            v[live] += 1
        negative = (words.words(u.size) >> np.uint64(63)).astype(bool)
        y = [int(a) + t * int(b) for a, b in zip(u.tolist(), v.tolist())]
        ok = [not (neg and yy == 0) for neg, yy in zip(negative.tolist(), y)]
        y = [yy for yy, o in zip(y, ok) if o]
        negative = negative[np.array(ok, dtype=bool)] if ok else negative[:0]
        # … and ±Y kept with probability exp(−(Y − σ²/t)² / (2σ²)) (CKS Algorithm 3)
        gnum = [(yy * tden - num) ** 2 for yy in y]
        g = np.array([a / accept_den for a in gnum], dtype=np.float64)
        keep = _bernoulli_exp_batch(g, lambda i, gnum=gnum: Fraction(gnum[i], accept_den), words)
        vals = np.array(y, dtype=object)[keep] if y else np.zeros(0, dtype=object)
        signs = np.where(negative[keep], -1, 1) if y else np.zeros(0, dtype=np.int64)
        got = (vals * signs).astype(np.int64) if vals.size else np.zeros(0, dtype=np.int64)
        out.append(got[: count - have])
        have += out[-1].size
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def pmf(values, sigma) -> np.ndarray:
    """Exact-enough probabilities of N_Z(0, σ²) at integer `values` (float64; the normaliser summed
    over ±(40σ + 10), beyond which the mass is below 10^−300), for tests."""
    s2 = float(sigma_squared(sigma))
    span = int(40 * math.sqrt(s2)) + 10
    norm = math.fsum(math.exp(-k * k / (2 * s2)) for k in range(-span, span + 1))
    v = np.asarray(values, dtype=np.float64)
    return np.exp(-v * v / (2 * s2)) / norm
