"""The privacy ledger: every release that touches private data, composed into one (ε, δ).

Each release is an event spent `count` times — dp-accounting's `RandomizedResponseDpEvent` or
`GaussianDpEvent` (DP-FedAvg's noisy sums), or :class:`DiscreteLaplaceEvent` (the noisy vote counts of FedKT and FREDY; dp-accounting 0.6 has the
PLD of the discrete Laplace mechanism but no event for it) — and the ledger composes their privacy
loss distributions (PLD: Meiser & Mohammadi 2018, Koskela et al. 2020; dp_accounting.pld,
pessimistic estimates) and reports ε(δ) of everything spent so far. With a budget, a release that
would take ε(δ) past it is refused before it happens.

Neighbouring relation, stated per ledger: by default datasets that differ by replacing ONE training
example of ONE site (example-level, replace-one; randomized response has no add/remove form), or
replacing the whole data of one site (site-level: FedKT's server-side noise protects a party, not
an example). Sites hold disjoint data, so a run's ε is that of the site whose data is released
most: each site's releases are composed, and the ledger records one site's (they are the same for
every site in the mechanisms here).

Why not dp-accounting's PLDAccountant: in dp-accounting 0.6.0 it ignores the count of a
self-composed randomized-response event (`compose(RR, 3)` gives the ε of one release; composing it
three times one by one gives three times as much) — tests/training/test_privacy.py shows it. The
ledger builds the same library's PLDs itself and self-composes them, which that accountant does for
every other event.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

NEIGHBOURING = "replace one training example of one site"
SITE_LEVEL = "replace the whole data of one site"
ACCOUNTANT = "PLD (dp-accounting, pessimistic)"
DISCRETIZATION = 1e-4  # of the privacy loss: dp-accounting's default; ε is an upper bound at this grid


def _dpa():
    """dp_accounting, imported where an event is accounted rather than with this module: with the SciPy it
    loads it costs ~2 CPU-s, and most importers never account one (a training run without DP noise
    spends nothing, and each message at a Flower site is a process of its own that imports this module)."""
    import dp_accounting

    return dp_accounting


class BudgetExceeded(ValueError):
    """A release would take the run past its privacy budget: it is not made."""


@dataclass(frozen=True)
class DiscreteLaplaceEvent:
    """One integer query of L1 sensitivity `sensitivity` released with discrete Laplace noise,
    P(k) ∝ exp(−parameter·|k|): pure DP with ε = parameter · sensitivity."""

    parameter: float
    sensitivity: int = 1


@dataclass(frozen=True)
class EpsilonDeltaEvent:
    """A release known only by the (ε, δ) it states (a training job as the site sees it): composed as the
    worst (ε, δ)-DP mechanism, whose privacy loss is ±ε, and +∞ with probability δ (dp-accounting's
    `from_privacy_parameters`). Two such releases at δ each hold together only at a δ above 2δ."""

    epsilon: float
    delta: float


def _composed(event, count: int):
    """The PLD of `event` released `count` times (not kept: a self-composition's PMF grows with count)."""
    return _pld(event) if count == 1 else _pld(event).self_compose(count)


@functools.lru_cache(maxsize=16)
def _pld(event):
    """The PLD of one release of `event`, kept per event (the last 16; each at most a few MB): a PLD is
    never changed once made (compose and self_compose make new ones), and one costs up to seconds (a
    Gaussian's at this discretisation ≈ 2 s) while a coordinator or a site rebuilds the same few again
    and again — every round's ε of a DP FedAvg+XCLP run composed its randomized-response PLD with a
    Gaussian rebuilt each time, and a ledger read back from JSON replays every release (35 of a Flower
    DP run's 45 s went there)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    dpa = _dpa()
    relation = dpa.NeighboringRelation.REPLACE_ONE
    if isinstance(event, dpa.RandomizedResponseDpEvent):
        return pld_lib.from_randomized_response(event.noise_parameter, event.num_buckets,
                                                value_discretization_interval=DISCRETIZATION,
                                                neighboring_relation=relation)
    if isinstance(event, DiscreteLaplaceEvent):
        return pld_lib.from_discrete_laplace_mechanism(event.parameter, sensitivity=event.sensitivity,
                                                       value_discretization_interval=DISCRETIZATION)
    if isinstance(event, EpsilonDeltaEvent):
        from dp_accounting.pld import common

        return pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(event.epsilon, event.delta),
                                               value_discretization_interval=DISCRETIZATION)
    if isinstance(event, dpa.GaussianDpEvent):  # σ/Δ = noise_multiplier (the ledger composes these apart)
        return pld_lib.from_gaussian_mechanism(event.noise_multiplier, sensitivity=1.0,
                                               value_discretization_interval=DISCRETIZATION)
    raise TypeError(f"the ledger does not account {type(event).__name__} yet")


def _describe(event) -> dict:
    dpa = _dpa()
    if isinstance(event, dpa.RandomizedResponseDpEvent):
        return {"mechanism": "randomized_response", "noise_parameter": event.noise_parameter,
                "num_buckets": event.num_buckets}
    if isinstance(event, DiscreteLaplaceEvent):
        return {"mechanism": "discrete_laplace", "parameter": event.parameter, "sensitivity": event.sensitivity}
    if isinstance(event, dpa.GaussianDpEvent):
        return {"mechanism": "gaussian", "noise_multiplier": event.noise_multiplier}
    if isinstance(event, EpsilonDeltaEvent):
        return {"mechanism": "epsilon_delta", "epsilon": event.epsilon, "delta": event.delta}
    raise TypeError(f"the ledger does not account {type(event).__name__} yet")


# A stored release, by its mechanism: the accountant's event (the one reader of every ledger's JSON).
EVENTS = {
    "randomized_response": lambda d: _dpa().RandomizedResponseDpEvent(noise_parameter=float(d["noise_parameter"]),
                                                                      num_buckets=int(d["num_buckets"])),
    "discrete_laplace": lambda d: DiscreteLaplaceEvent(float(d["parameter"]), int(d["sensitivity"])),
    "gaussian": lambda d: _dpa().GaussianDpEvent(float(d["noise_multiplier"])),
    "epsilon_delta": lambda d: EpsilonDeltaEvent(float(d["epsilon"]), float(d["delta"])),
}


def _event(d: dict):
    make = EVENTS.get(d.get("mechanism"))
    if make is None:
        raise ValueError(f"unknown mechanism in a stored ledger: {d!r}")
    return make(d)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε(δ) of a Gaussian mechanism with Δ/σ = μ, exactly (Balle & Wang 2018, Thm. 8):
    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2). T Gaussian releases compose to one with
    μ = √(Σ μ_i²) (Dong, Roth & Su 2019), so a run of Gaussian rounds needs no discretised PLD."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if mu <= 0:
        return 0.0

    def excess(eps: float) -> float:
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2))) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return float(brentq(excess, 0.0, hi, xtol=1e-12))


def epsilon_of(event, count: int, delta: float) -> float:
    """ε(δ) of `event` released `count` times (and nothing else)."""
    if isinstance(event, _dpa().GaussianDpEvent):
        return gaussian_epsilon(math.sqrt(count) / event.noise_multiplier, delta)
    return float(_composed(event, count).get_epsilon_for_delta(delta))


@dataclass
class PrivacyLedger:
    delta: float
    budget: float | None = None  # ε; None: record only
    events: list[dict] = field(default_factory=list)
    neighbouring: str = NEIGHBOURING

    def __post_init__(self):
        if not 0 < self.delta < 1:
            raise ValueError(f"δ must be in (0, 1), got {self.delta}")
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise ValueError(f"an ε budget must be a positive number, got {self.budget}")
        self._pld = None  # the composed PLD of every non-Gaussian release
        self._mu2 = 0.0  # Σ μ² of the Gaussian releases (their composition is one Gaussian)

    def _epsilon(self, pld, mu2: float) -> float | None:
        if pld is None:
            return gaussian_epsilon(math.sqrt(mu2), self.delta) if mu2 > 0 else None
        if mu2 > 0:
            pld = pld.compose(_pld(_dpa().GaussianDpEvent(1 / math.sqrt(mu2))))
        return float(pld.get_epsilon_for_delta(self.delta))

    def spend(self, what: str, event, count: int = 1) -> float:
        """Record a release (`count` independent uses of `event`); returns ε(δ) of all spent so far.
        Raises BudgetExceeded, recording nothing, if it would exceed the budget."""
        if count < 1:
            raise ValueError("a release is spent at least once")
        pld, mu2 = self._pld, self._mu2
        if isinstance(event, _dpa().GaussianDpEvent):
            mu2 += count / event.noise_multiplier**2
        else:
            new = _composed(event, count)
            pld = new if pld is None else pld.compose(new)
        eps = self._epsilon(pld, mu2)
        if self.budget is not None and eps > self.budget * (1 + 1e-9):
            raise BudgetExceeded(f"{what}: ε would reach {eps:.4g} at δ = {self.delta:g}, past the budget "
                                 f"{self.budget:g}; not released")
        self._pld, self._mu2 = pld, mu2
        self.events.append({"what": what, "event": _describe(event), "count": int(count), "epsilon_after": eps})
        return eps

    @classmethod
    def from_json(cls, record: dict) -> PrivacyLedger:
        """The ledger `to_json` wrote, its releases composed again."""
        ledger = cls(record["delta"], record.get("budget"), neighbouring=record.get("neighbouring", NEIGHBOURING))
        for e in record.get("events", []):
            ledger.spend(e["what"], _event(e["event"]), e["count"])
        return ledger

    def epsilon(self) -> float | None:
        """ε(δ) of everything spent (None: nothing private released through a mechanism yet)."""
        return self._epsilon(self._pld, self._mu2)

    def to_json(self) -> dict:
        return {"epsilon": self.epsilon(), "delta": self.delta, "budget": self.budget, "accountant": ACCOUNTANT,
                "neighbouring": self.neighbouring, "events": list(self.events)}


def no_privacy() -> dict:
    """The record of a run that adds no noise: ε is not bounded (null in JSON)."""
    return {"epsilon": None, "delta": None, "budget": None, "accountant": None, "neighbouring": NEIGHBOURING,
            "events": []}
