"""DP-FedAvg's noise: Gaussian noise shares that the sites add inside the secure sum.

Each site j of a round clips its update Δ_j = w_j − w_global to L2 norm C and adds, to its
fixed-point encoded weights, an integer noise share n_j on the same grid (2^−f, f = FRAC_BITS of
xclp.training.secure_aggregation): n_j ~ N_Z(0, (2^f · zC)² / m) per coordinate, the exact discrete
Gaussian (xclp.privacy.discrete_gaussian), where m is the number of sites the round planned. The masks cancel in the sum; the noise shares do
not: the coordinator decodes Σ_j (w_global + clip(Δ_j)) + Σ_j n_j·2^−f — the sum of the clipped
updates plus Gaussian noise of variance (m'/m)·(zC)² per coordinate, m' the sites whose shares are
in the sum. No party sees a single noisy update: each masked upload is uniform to the coordinator.

Accounting (xclp.privacy.ledger, site level — replacing one site's whole data moves its clipped
update by at most 2C in L2): each round is one Gaussian mechanism on the sum, noise multiplier
σ/Δ = z·√(m'/m) / 2, spent with the m' that actually contributed (a site that drops out takes its
share of the noise with it). No amplification by the sampling of sites is claimed: the bound is the
same whoever is sampled.

Discretisation: the data are encoded exactly on the grid and the shares are exact discrete
Gaussians on it (Canonne, Kamath & Steinke 2020), with a standard deviation of 2^f·zC/√m grid steps
(≈ 10^7 and more). Their sum is the distributed discrete Gaussian of Kairouz, Liu & Steinke (ICML
2021), within τ = 10 Σ_k e^{−2π²σ² k/(k+1)} (σ in grid steps: zero in any floating point) of one
discrete Gaussian of the summed variance; the ledger uses the continuous Gaussian's PLD, which the
discrete one matches up to terms of order e^{−2π²σ²} (docs/privacy.md). The shares have full tails:
Box–Muller on 53-bit uniforms, used before, stopped at 8.57σ (issue 22 item 7).

Randomness: AES-256-CTR (crypto.secure_sum.prg_uint64) keyed by os.urandom at a real site; a
simulation may pass a key derived from its seed.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from xclp.privacy import discrete_gaussian

# dp-accounting (half a second to import) waits until a run accounts: the protocol imports the
# noise of this module (through xclp.privacy.label_dp) on every site.

# Below this z the noise hides nothing worth accounting (one round alone costs ε in the hundreds), and
# the PLD of so sharp a Gaussian would need more memory than the machine has: such z are refused.
MIN_MULTIPLIER = 0.1


def grid_sigma(std: float, frac_bits: int) -> Fraction:
    """σ in grid steps, exactly: std · 2^f (std taken at its exact binary value)."""
    if not (std > 0 and math.isfinite(std)):
        raise ValueError(f"a noise share needs a positive standard deviation, got {std}")
    return Fraction(std) * (1 << frac_bits)


def share_std(noise_multiplier: float, clip: float, planned: int) -> float:
    """The standard deviation of one site's share (in weight units): zC/√m."""
    if planned < 1:
        raise ValueError("a round plans at least one site")
    return noise_multiplier * clip / math.sqrt(planned)


def noise_share(n_values: int, std: float, frac_bits: int, key: bytes | None = None) -> np.ndarray:
    """One site's share on the fixed-point grid: the exact discrete Gaussian N_Z(0, (std·2^f)²), as
    uint64 (two's complement: it adds mod 2^64 like the encoded weights and the masks)."""
    sigma = grid_sigma(std, frac_bits)
    if sigma > 1 << 56:
        raise ValueError("noise too large for the fixed-point sum")
    grid = discrete_gaussian.sample(n_values, None, key, sigma2=sigma * sigma)
    if np.abs(grid).max(initial=0) >= 2**62:
        raise ValueError("noise too large for the fixed-point sum")
    return grid.view(np.uint64)


def event(noise_multiplier: float, contributed: int, planned: int):
    """One round's release, a GaussianDpEvent: Gaussian on the sum with σ/Δ = z·√(m'/m)/2 (Δ = 2C,
    site-level replace)."""
    import dp_accounting as dpa

    if not 1 <= contributed:
        raise ValueError("a sum that was decoded has at least one share in it")
    return dpa.GaussianDpEvent(noise_multiplier * math.sqrt(contributed / planned) / 2.0)


@functools.lru_cache(maxsize=64)
def multiplier_for_budget(epsilon: float, delta: float, rounds: int) -> float:
    """The least noise multiplier z (≥ MIN_MULTIPLIER) for which `rounds` rounds with every planned
    share in the sum compose (PLD) to at most ε at δ."""
    from scipy.optimize import brentq

    from xclp.privacy.ledger import epsilon_of

    if rounds < 1:
        raise ValueError("at least one round")

    def gap(log_z: float) -> float:
        return epsilon_of(event(math.exp(log_z), 1, 1), rounds, delta) - epsilon

    lo, hi = math.log(MIN_MULTIPLIER), math.log(1e4)
    if gap(hi) > 0:
        raise ValueError(f"no noise multiplier up to 1e4 keeps {rounds} rounds within ε = {epsilon:g} at δ = {delta:g}")
    if gap(lo) <= 0:
        return math.exp(lo)
    x = brentq(gap, lo, hi, xtol=1e-9)  # ε falls as z grows
    while gap(x) > 0:
        x += 1e-9
    return math.exp(x)
