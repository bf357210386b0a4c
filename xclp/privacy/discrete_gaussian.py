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

Rate: pure Python, about 7·10^4 values a second for σ of 10^9–10^11 grid steps (up to 1.7·10^5 at
small σ) on one core of the shared development machine (docs/privacy.md); the expected number of
loop iterations per value is below 2 whatever σ. A DP-FedAvg share of the 235,146 weights of the MLP
takes about 3.5 s. MAX_VALUES bounds one call (about 15 minutes).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np

from crypto.secure_sum import prg_uint64

MAX_VALUES = 1 << 26  # one call: about 15 minutes; larger vectors are refused, not slowed down silently
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


def sample(count: int, sigma, key: bytes | None = None, *, sigma2: Fraction | None = None) -> np.ndarray:
    """`count` independent draws of N_Z(0, σ²) as int64 (σ in grid steps; or σ² given exactly as
    `sigma2`). Refuses σ that could overflow int64 (|x| < 2^62 needs σ ≤ 2^56: 64σ of room)."""
    count = int(count)
    if not 0 <= count <= MAX_VALUES:
        raise ValueError(f"between 0 and {MAX_VALUES} values per call, got {count}")
    s2 = sigma_squared(sigma) if sigma2 is None else Fraction(sigma2)
    if not s2 > 0:
        raise ValueError("σ² must be positive")
    if s2 > 1 << 112:
        raise ValueError("σ above 2^56 grid steps: the values would not fit int64 with room for their tails")
    num, den = s2.numerator, s2.denominator
    t = math.isqrt(num * den) // den + 1  # ⌊σ⌋ + 1
    coins = CoinSource(key)
    out = np.fromiter((_one(num, den, t, coins) for _ in range(count)), dtype=np.int64, count=count)
    return out


def pmf(values, sigma) -> np.ndarray:
    """Exact-enough probabilities of N_Z(0, σ²) at integer `values` (float64; the normaliser summed
    over ±(40σ + 10), beyond which the mass is below 10^−300), for tests."""
    s2 = float(sigma_squared(sigma))
    span = int(40 * math.sqrt(s2)) + 10
    norm = math.fsum(math.exp(-k * k / (2 * s2)) for k in range(-span, span + 1))
    v = np.asarray(values, dtype=np.float64)
    return np.exp(-v * v / (2 * s2)) / norm
