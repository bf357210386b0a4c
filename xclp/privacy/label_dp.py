"""Label-DP for XCLP itself: randomized response on the labels, or Gaussian noise shares inside the
label-count sum and SecureRowSums, or both.

What XCLP releases to a site j about the OTHER sites' labels is two sums (xclp.protocol):
  counts    N = Σ_k class_counts(y^(k))                         (every site learns it)
  row sums  Z[R_j] = Σ_{k≠j} S^(k)[R_j] Y^(k)                  (site j learns its own rows only)
with S^(k) the influence columns of site k's labelled points (n × l_k, computed by the coordinator
from the graph, which does not depend on any label) and Y^(k) their one-hot labels.

Neighbouring relation (label-DP, Ghazi et al., NeurIPS 2021): two runs differ in the label of ONE
labelled point of one site. The features, the graph and WHICH points are labelled are not
protected (the coordinator learns the labelled rows at setup; the graph is built from the LSH bits).

Two mechanisms (JobParams.label_flip, JobParams.dp_noise), either or both:

1. Randomized response on the labels (`respond`): each site replaces each of its labels, with
   probability p, by a uniform one BEFORE they enter any sum; counts and row sums are then
   post-processing of ε₀-DP labels, ε₀ = ln(1 + k(1 − p)/p) (xclp.privacy.randomized_response),
   whoever looks — the coordinator, any coalition of sites. Drawn once from a site's secret
   (`respond_key`), the same randomized labels serve every job of a training run: the budget is
   spent once, not per round. The site's own labelled points keep their true labels in its result.
2. Gaussian noise shares inside the sums, below.

bench/xclp_dp.py measures both: at equal ε, (1) keeps far more accuracy — propagation averages many
randomized labels, while (2) adds noise to every one of the n × C scores.

Sensitivities of the sums (mechanism 2), when one label at site k changes from c to c':
  counts    N moves by −1 in class c and +1 in c': L2 sensitivity √2.
  row sums  S^(k)[:, i] (e_c' − e_c)ᵀ changes: L2 (Frobenius) sensitivity ‖S^(k)[R_¬k, i]‖·√2. Site k
            scales every influence column so that its norm over the other sites' rows is at most C
            (`clip_columns`), which bounds it by C·√2. The scaling depends on the graph alone, so it
            leaks no label.
Class balancing (Y scaled by 1/N_c) would make the row sums depend on the exact counts; under DP the
sites sum unbalanced scores and divide by the NOISY counts afterwards — post-processing, no cost.

Noise: each of the m' participants of a sum adds, on every entry it sends, a share of N(0, σ²/(m'−1))
(σ = z·√2 for the counts, z·C·√2 for the row sums): what site j receives carries the shares of the
m'−1 other participants, N(0, σ²) — its own share protects nothing from itself, and its own rows are
never sent. So each sum is one Gaussian mechanism with σ/Δ = z for any one site that looks at it;
the coordinator sees only masked values. A job spends two of them (`events`), composed exactly
(ledger: μ = √(Σ 1/z²), Dong, Roth & Su 2019). A coalition of sites can subtract its own shares: it
sees the noise of the others only (the same trust model as DP-FedAvg's shares, stated in
docs/privacy.md).

Shares are exact discrete Gaussians on the 2^−f grid of the fixed-point sum (f = 40;
xclp.privacy.discrete_gaussian, Canonne, Kamath & Steinke 2020, from AES-CTR keyed by os.urandom at a
real site), added to the site's mask as integers: no rounding, no cut tail (docs/privacy.md).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from xclp.privacy import discrete_gaussian, randomized_response
from xclp.privacy.gaussian_shares import MIN_MULTIPLIER, grid_sigma

# The accountant's imports (dp-accounting: half a second) wait until a run accounts: the protocol
# imports this module for its noise alone.

LABEL_LEVEL = "replace the label of one labelled point of one site (features and which points are labelled are public)"
RELEASES_PER_JOB = ("label counts", "row sums")
DEFAULT_CLIP = 1.0  # C: the L2 norm of an influence column over the other sites' rows (see bench/xclp_dp.py)




def validate(noise_multiplier: float, clip: float, flip: float = 0.0) -> None:
    if not (math.isfinite(flip) and 0 <= flip < 1):
        raise ValueError(f"the randomized-response noise parameter p must be in [0, 1), got {flip}")
    if not math.isfinite(noise_multiplier) or noise_multiplier < 0:
        raise ValueError(f"the noise multiplier must be a number ≥ 0, got {noise_multiplier}")
    if 0 < noise_multiplier < MIN_MULTIPLIER:
        raise ValueError(f"a noise multiplier below {MIN_MULTIPLIER} hides nothing worth accounting; got {noise_multiplier}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"the clip bound C must be a positive number, got {clip}")


def respond_key(noise_seed: bytes | None) -> bytes | None:
    """The key of a site's randomized labels: from its secret noise seed alone (the same labels in
    every job of a run), or None (a fresh os.urandom key)."""
    return None if noise_seed is None else hashlib.sha256(noise_seed + b"/xclp/label-dp/labels").digest()


def respond(labels: np.ndarray, flip: float, n_classes: int, key: bytes | None) -> np.ndarray:
    return randomized_response.respond(labels, flip, n_classes, key)


def flip_for_budget(epsilon_budget: float, delta: float, n_classes: int) -> float:
    """The least p whose one release of the labels is within ε at δ (pure DP: ε₀ ≤ ε)."""
    return randomized_response.noise_for_budget(epsilon_budget, delta, 1, n_classes)


def clip_columns(columns: np.ndarray, others: np.ndarray, clip: float) -> np.ndarray:
    """Each column scaled by min(1, C / its L2 norm over the rows `others`): the whole column, so that
    a site's own rows (never sent) keep the same scale as what it sends."""
    norms = np.linalg.norm(columns[others], axis=0) if others.size else np.zeros(columns.shape[1])
    scale = np.minimum(1.0, clip / np.maximum(norms, np.finfo(np.float64).tiny))
    return columns * scale[None, :]


def share_std(noise_multiplier: float, sensitivity: float, participants: int) -> float:
    """σ_share = z·Δ / √(m' − 1): the m' − 1 shares a site receives add up to N(0, (zΔ)²)."""
    if participants < 2:
        return 0.0  # nobody else's labels are in what a lone participant receives
    return noise_multiplier * sensitivity / math.sqrt(participants - 1)


def noise(shape: tuple[int, ...], std: float, key: bytes | None, frac_bits: int) -> np.ndarray:
    """One share on the 2^−f grid of the fixed-point sum: the exact discrete Gaussian N_Z(0, (std·2^f)²)
    per entry, int64 (CSPRNG; `key` None draws a fresh os.urandom key). The site adds it to its
    mask, so it reaches the sum exactly, with no rounding."""
    count = int(np.prod(shape))
    if std == 0.0 or count == 0:
        return np.zeros(shape, dtype=np.int64)
    return discrete_gaussian.sample(count, None, key, sigma2=grid_sigma(std, frac_bits) ** 2).reshape(shape)


def counts_sensitivity() -> float:
    return math.sqrt(2.0)


def rows_sensitivity(clip: float) -> float:
    return clip * math.sqrt(2.0)


def events(noise_multiplier: float) -> list:
    """The Gaussian releases of one job, (what, GaussianDpEvent): the label counts and the row sums,
    each with σ/Δ = z."""
    import dp_accounting as dpa

    return [(what, dpa.GaussianDpEvent(noise_multiplier)) for what in RELEASES_PER_JOB]


def label_event(flip: float, n_classes: int):
    """The randomized labels' release (once per draw: per run when the site keeps its noise seed)."""
    return randomized_response.event(flip, n_classes)


def spend(ledger, params, jobs: int = 1, labels_drawn: bool = True) -> float | None:
    """Record what `jobs` jobs with `params` release: the Gaussian sums of each job, and the randomized
    labels once if this call draws them (a run that reuses them passes labels_drawn=False after the
    first). Returns ε so far (raises BudgetExceeded, recording nothing more, past the budget)."""
    eps = ledger.epsilon()
    if params.label_flip > 0 and labels_drawn:
        eps = ledger.spend("xclp: randomized labels", label_event(params.label_flip, params.n_classes))
    if params.dp_noise > 0:
        for what, event in events(params.dp_noise):
            eps = ledger.spend(f"xclp: {what}", event, jobs)
    return eps


def epsilon(noise_multiplier: float, jobs: int, delta: float) -> float:
    """ε(δ) of `jobs` XCLP jobs at noise multiplier z: 2·jobs Gaussians, μ = √(2·jobs)/z."""
    from xclp.privacy.ledger import gaussian_epsilon

    return gaussian_epsilon(math.sqrt(len(RELEASES_PER_JOB) * jobs) / noise_multiplier, delta)


def multiplier_for_budget(epsilon_budget: float, delta: float, jobs: int = 1) -> float:
    """The least z whose `jobs` jobs compose to at most ε at δ (exact: ε(δ) of a Gaussian is monotone
    in μ, Balle & Wang 2018)."""
    from scipy.optimize import brentq

    from xclp.privacy.ledger import gaussian_epsilon

    if not (epsilon_budget > 0 and math.isfinite(epsilon_budget)):
        raise ValueError(f"an ε budget must be a positive number, got {epsilon_budget}")
    if jobs < 1:
        raise ValueError("at least one job")
    releases = len(RELEASES_PER_JOB) * jobs
    hi = 1.0
    while gaussian_epsilon(hi, delta) < epsilon_budget:
        hi *= 2.0
    mu = brentq(lambda m: gaussian_epsilon(m, delta) - epsilon_budget, 0.0, hi, xtol=1e-12)
    z = math.sqrt(releases) / mu
    while epsilon(z, jobs, delta) > epsilon_budget:  # brentq's last step may land just past it
        z *= 1 + 1e-12
    return max(z, MIN_MULTIPLIER)  # more noise than a huge budget needs: the least z that is accounted


def job_fields(n_classes: int, epsilon: float | None = None, delta: float = 1e-5, mechanism: str = "rr",
               flip: float | None = None, noise: float | None = None, clip: float | None = None,
               jobs: int = 1) -> dict:
    """JobParams' label-DP fields: the noise itself (`flip`: rr's p; `noise`: gaussian's z), or a budget
    ε at δ that calibrates `mechanism` ("rr" or "gaussian") for `jobs` jobs; None leaves a field out
    (the job's default). The CLI's flags and the estimators (xclp.estimator) both come here."""
    if epsilon is not None and (flip is not None or noise is not None):
        raise ValueError("give either a budget ε or the noise itself (the flip p or the multiplier z), not both")
    if mechanism not in MECHANISMS:
        raise ValueError(f"the label-DP mechanism must be one of {tuple(MECHANISMS)}, got {mechanism!r}")
    out = {}
    if clip is not None:
        out["dp_clip"] = clip
    if flip is not None:
        out["label_flip"] = flip
    if noise is not None:
        out["dp_noise"] = noise
    if epsilon is not None:
        out.update(MECHANISMS[mechanism](epsilon, delta, n_classes, jobs))
    return out


# The label-DP mechanisms, each with JobParams' noise field that meets a budget ε at δ (over `jobs` jobs
# of C classes): randomized response on the labels (its flip p); Gaussian noise shares in the sums (z).
MECHANISMS = {
    "rr": lambda epsilon, delta, n_classes, jobs: {"label_flip": flip_for_budget(epsilon, delta, n_classes)},
    "gaussian": lambda epsilon, delta, n_classes, jobs: {"dp_noise": multiplier_for_budget(epsilon, delta, jobs)},
}
