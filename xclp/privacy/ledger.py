"""The privacy ledger: every release that touches private data, composed into one (ε, δ).

Each release is a dp-accounting `DpEvent` (so far: randomized response) spent `count` times; the ledger composes their privacy loss distributions (PLD: Meiser & Mohammadi 2018, Koskela
et al. 2020; dp_accounting.pld, pessimistic estimates) and reports ε(δ) of everything spent so far.
With a budget, a release that would take ε(δ) past it is refused before it happens.

Neighbouring relation: datasets that differ by replacing ONE training example of ONE site
(example-level, replace-one; randomized response has no add/remove form). Sites hold disjoint data,
so a run's ε is that of the site whose data is released most: each site's releases are composed,
and the ledger records one site's (they are the same for every site in the mechanisms here).

Why not dp-accounting's PLDAccountant: in dp-accounting 0.6.0 it ignores the count of a
self-composed randomized-response event (`compose(RR, 3)` gives the ε of one release; composing it
three times one by one gives three times as much) — tests/training/test_privacy.py shows it. The
ledger builds the same library's PLDs itself and self-composes them, which that accountant does for
every other event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import dp_accounting as dpa
from dp_accounting.pld import privacy_loss_distribution as pld_lib

NEIGHBOURING = "replace one training example of one site"
ACCOUNTANT = "PLD (dp-accounting, pessimistic)"
DISCRETIZATION = 1e-4  # of the privacy loss: dp-accounting's default; ε is an upper bound at this grid


class BudgetExceeded(ValueError):
    """A release would take the run past its privacy budget: it is not made."""


def _pld(event: dpa.DpEvent):
    relation = dpa.NeighboringRelation.REPLACE_ONE
    if isinstance(event, dpa.RandomizedResponseDpEvent):
        return pld_lib.from_randomized_response(event.noise_parameter, event.num_buckets,
                                                value_discretization_interval=DISCRETIZATION,
                                                neighboring_relation=relation)
    # (Laplace and Gaussian noise — FedKT's and FREDY's votes, DP-FedAvg — come with those mechanisms.)
    raise TypeError(f"the ledger does not account {type(event).__name__} yet")


def _describe(event: dpa.DpEvent) -> dict:
    if isinstance(event, dpa.RandomizedResponseDpEvent):
        return {"mechanism": "randomized_response", "noise_parameter": event.noise_parameter,
                "num_buckets": event.num_buckets}
    raise TypeError(f"the ledger does not account {type(event).__name__} yet")


def _event(d: dict) -> dpa.DpEvent:
    if d.get("mechanism") == "randomized_response":
        return dpa.RandomizedResponseDpEvent(noise_parameter=float(d["noise_parameter"]),
                                             num_buckets=int(d["num_buckets"]))
    raise ValueError(f"unknown mechanism in a stored ledger: {d!r}")


def epsilon_of(event: dpa.DpEvent, count: int, delta: float) -> float:
    """ε(δ) of `event` released `count` times (and nothing else)."""
    return float(_pld(event).self_compose(count).get_epsilon_for_delta(delta))


@dataclass
class PrivacyLedger:
    delta: float
    budget: float | None = None  # ε; None: record only
    events: list[dict] = field(default_factory=list)

    def __post_init__(self):
        if not 0 < self.delta < 1:
            raise ValueError(f"δ must be in (0, 1), got {self.delta}")
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise ValueError(f"an ε budget must be a positive number, got {self.budget}")
        self._pld = None

    def _composed(self, event: dpa.DpEvent, count: int):
        new = _pld(event).self_compose(count)
        return new if self._pld is None else self._pld.compose(new)

    def spend(self, what: str, event: dpa.DpEvent, count: int = 1) -> float:
        """Record a release (`count` independent uses of `event`); returns ε(δ) of all spent so far.
        Raises BudgetExceeded, recording nothing, if it would exceed the budget."""
        if count < 1:
            raise ValueError("a release is spent at least once")
        pld = self._composed(event, count)
        eps = float(pld.get_epsilon_for_delta(self.delta))
        if self.budget is not None and eps > self.budget * (1 + 1e-9):
            raise BudgetExceeded(f"{what}: ε would reach {eps:.4g} at δ = {self.delta:g}, past the budget "
                                 f"{self.budget:g}; not released")
        self._pld = pld
        self.events.append({"what": what, "event": _describe(event), "count": int(count), "epsilon_after": eps})
        return eps

    @classmethod
    def from_json(cls, record: dict) -> PrivacyLedger:
        """The ledger `to_json` wrote, its releases composed again."""
        ledger = cls(record["delta"], record.get("budget"))
        for e in record.get("events", []):
            ledger.spend(e["what"], _event(e["event"]), e["count"])
        return ledger

    def epsilon(self) -> float | None:
        """ε(δ) of everything spent (None: nothing private released through a mechanism yet)."""
        return None if self._pld is None else float(self._pld.get_epsilon_for_delta(self.delta))

    def to_json(self) -> dict:
        return {"epsilon": self.epsilon(), "delta": self.delta, "budget": self.budget, "accountant": ACCOUNTANT,
                "neighbouring": NEIGHBOURING, "events": list(self.events)}


def no_privacy() -> dict:
    """The record of a run that adds no noise: ε is not bounded (null in JSON)."""
    return {"epsilon": None, "delta": None, "budget": None, "accountant": None, "neighbouring": NEIGHBOURING,
            "events": []}
