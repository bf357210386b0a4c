"""Attack: DP-FedAvg's noise share of a site has σ = zC/√planned, and `planned` was the length of the
round's plan — a list the coordinator writes. A plan naming 10,000 sites over two real participants
shrank a share's σ from 0.707 to 0.010. Defence: the site sizes its noise from the participants it masks
over, and refuses a plan that names others (xclp.training_job.TrainSite._planned), in every driver."""

import pytest

from crypto.errors import ProtocolError
from crypto.keys import SiteKeyPair
from xclp.training.fedavg import FedAvgStrategy
from xclp.training.messages import dump_json
from xclp.training.strategy import Weights
from xclp.training_job import RunSpec, TrainSite, TrainState

CONFIG = {"rounds": 2, "dp_epsilon": 1.0, "clip": 1.0, "secure_aggregation": True, "sites_per_round": 2}
FEATURES = 4


class _Work:
    def __init__(self, spec):
        self.spec = spec

    def round(self, s, t, plan, inbox):
        template = s.network().state_dict()
        return Weights(template, template, {"n": 3})


class _Inbox:
    def __init__(self, shared):
        self._shared = shared

    def shared(self, topic):
        return self._shared.get(topic)

    def get(self, topic):
        return None


def _round_one(plan_sites, monkeypatch):
    """Site a's round-1 step with a plan naming `plan_sites`: (what it sent, the `planned` its noise used)."""
    spec = RunSpec("T", "fedavg", CONFIG, 10)
    keys = {s: SiteKeyPair.generate() for s in "ab"}
    site = TrainSite("a", spec, _Work(spec), record={"key": keys["a"].private_bytes().hex()},
                     n_features=FEATURES)
    view = TrainState(sites=["a", "b"], live=["a", "b"], phase="round", round=1, participants=["a", "b"])
    inbox = _Inbox({"plan/1": dump_json({"sites": plan_sites, "xclp": None, "xclp_job": None}),
                    "keys": dump_json({s: k.public_bytes().hex() for s, k in keys.items()})})
    used = []
    share = FedAvgStrategy.noise_share
    monkeypatch.setattr(FedAvgStrategy, "noise_share",
                        lambda self, n, planned, key=None: used.append(planned) or share(self, n, planned, key))
    sent = []
    site.step(view, inbox, sent.append)
    return sent, used


def test_an_honest_plan_sizes_the_noise_from_the_sites_masked_over(monkeypatch):
    sent, used = _round_one(["a", "b"], monkeypatch)
    assert [m.topic for m in sent] == ["update/1/0"] and used == [2]


@pytest.mark.parametrize("padded", [["a", "b", *(f"ghost-{i}" for i in range(9998))], ["a", "b", "b"], ["a"]])
def test_a_plan_that_names_other_sites_than_the_masked_sum_is_refused_before_any_upload(monkeypatch, padded):
    with pytest.raises(ProtocolError, match="noise is sized"):
        _round_one(padded, monkeypatch)
