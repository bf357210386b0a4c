"""Every training algorithm, by name, and the strategy that runs it (xclp/training/strategy.py).

The drivers look an algorithm up here and call its strategy's hooks; a new algorithm is one more
entry (and its Strategy), not a branch in each driver.
"""

from __future__ import annotations

from xclp.training.fedavg import FedAvgStrategy
from xclp.training.fedct import FedCTStrategy
from xclp.training.fedkt import FedKTStrategy
from xclp.training.fredy import FREDYStrategy
from xclp.training.options import ALGORITHMS, FEDAVG_ALGORITHMS, FEDCT_ALGORITHMS, FEDKT_ALGORITHMS, FREDY_ALGORITHMS
from xclp.training.strategy import Strategy

STRATEGIES: dict[str, type[Strategy]] = {**{a: FedAvgStrategy for a in FEDAVG_ALGORITHMS},
                                         **{a: FedCTStrategy for a in FEDCT_ALGORITHMS},
                                         **{a: FedKTStrategy for a in FEDKT_ALGORITHMS},
                                         **{a: FREDYStrategy for a in FREDY_ALGORITHMS}}
assert tuple(STRATEGIES) == ALGORITHMS, "a strategy for every algorithm the command line offers"


def check_dp_budget(algorithm: str) -> None:
    """Refuse a DP budget that no mechanism backs (the drivers' one check, before any config). With
    XCLP (fedct-xclp, fedavg-xclp) part of the budget goes to the randomized labels it propagates
    (xclp/privacy/label_dp.py; Strategy.xclp_label_flip)."""
    if STRATEGIES[algorithm].dp_mechanism is None:
        raise ValueError(f"{algorithm} has no DP mechanism: no budget can be promised (fedct — "
                         f"{STRATEGIES['fedct'].dp_mechanism}; fedavg — {STRATEGIES['fedavg'].dp_mechanism})")


def strategy_for(algorithm: str, config: dict, n_classes: int, n_sites: int, *, n_features: int | None = None,
                 n_public: int | None = None) -> Strategy:
    """The strategy of a run or job from its stored parameters (`config`: the algorithm's config as a dict)."""
    if algorithm not in STRATEGIES:
        raise ValueError(f"unknown training algorithm {algorithm!r}; choose from {ALGORITHMS}")
    return STRATEGIES[algorithm].from_config(config, n_classes, n_sites, n_features=n_features, n_public=n_public)


def strategy_of_status(status: dict) -> Strategy:
    """A training job's strategy from its status as a site sees it (params: algorithm, config, classes; its
    sites): what a site's policy and ledger read of a run are this strategy's traits (weights in the clear,
    the server's noise, Gaussian releases), never the algorithm's name. Sizes that only shape models do not
    change them (one feature, one public point)."""
    params = status.get("params") or {}
    return strategy_for(str(params.get("algorithm")), dict(params.get("config") or {}), int(params.get("classes", 2)),
                        max(len(status.get("sites") or ()), 2), n_public=int(params.get("public_size") or 1 << 16),
                        n_features=1)
