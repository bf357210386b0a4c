"""k-ary randomized response (Warner 1965; the form of dp-accounting's RandomizedResponseDpEvent).

With noise parameter p, a label y ∈ {0..k−1} is kept with probability 1 − p and replaced, with
probability p, by a label drawn uniformly from all k (so it stays y with probability 1 − p + p/k).
One release is ε₀-DP with ε₀ = ln((1 − p + p/k) / (p/k)) = ln(1 + k(1 − p)/p).

The coins and the replacement labels come from AES-256-CTR (crypto.secure_sum.prg_uint64) keyed
with 32 bytes from os.urandom at a real site, never from numpy's generator: noise an observer could
predict protects nothing. A simulation may pass a key derived from its seed, to be reproducible.
A uniform label is u mod k of a 64-bit u: its bias is below k/2^64.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from crypto.secure_sum import prg_uint64

# dp-accounting (half a second to import) waits until a run accounts: the protocol imports `respond`
# on every site (through xclp.privacy.label_dp).


def epsilon_one(p: float, k: int) -> float:
    """ε₀ of one release (pure DP; ∞ for p = 0)."""
    return math.inf if p <= 0 else math.log1p(k * (1 - p) / p)


def event(p: float, k: int):
    import dp_accounting as dpa

    return dpa.RandomizedResponseDpEvent(noise_parameter=float(p), num_buckets=int(k))


@functools.lru_cache(maxsize=64)  # a few seconds each; the drivers ask again at every step
def noise_for_budget(epsilon: float, delta: float, releases: int, k: int) -> float:
    """The smallest noise parameter p for which `releases` randomized responses over k labels
    compose (PLD) to at most ε at δ."""
    from scipy.optimize import brentq

    from xclp.privacy.ledger import epsilon_of

    if releases < 1 or k < 2:
        raise ValueError("randomized response needs at least one release and two labels")

    def gap(p: float) -> float:
        return epsilon_of(event(p, k), releases, delta) - epsilon

    lo, hi = 1e-12, 1 - 1e-12  # dp-accounting takes p strictly inside (0, 1)
    if gap(lo) <= 0:
        return lo  # a budget so large that (almost) no noise is needed
    if gap(hi) > 0:
        raise ValueError(f"no randomized response over {k} labels keeps {releases} releases within ε = {epsilon:g} "
                         f"at δ = {delta:g}")
    # ε falls as p grows: the root is bracketed. brentq may answer a hair on the wrong side of it. The
    # PLD's ε moves in steps, so brentq bisects: each evaluation composes every release (~1 CPU-s at
    # 600), and p to 1e-7 (23 of them; 1e-10 took 33) is the least noise for any purpose.
    xtol = 1e-7
    p = brentq(gap, lo, hi, xtol=xtol)
    while gap(p) > 0:
        p = min(hi, p + xtol)
    return p


def respond(labels: np.ndarray, p: float, k: int, key: bytes | None = None) -> np.ndarray:
    """Randomized response on every label (values 0..k−1); `key`: 32 bytes, or None for os.urandom."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"randomized response takes labels in 0..{k - 1}")
    n = labels.size
    u = prg_uint64(key if key is not None else os.urandom(32), 2 * n)
    coin = (u[:n] >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < p
    fresh = (u[n:] % np.uint64(k)).astype(np.int64)
    return np.where(coin, fresh, labels)
