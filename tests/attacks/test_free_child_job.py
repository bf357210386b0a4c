"""Attack: the coordinator calls a job a training round's XCLP job ("parent": an old training job) so that
the site's ledger records nothing for it — at --max-epsilon 2, 1,000 label-DP jobs were admitted that way,
each a fresh release. Defence: a child is inside its parent's budget only if the parent is a training run
this site admitted, the child's id is one of that run's rounds' and its parameters are those the run's
accepted specification gives (xclp.site_admission); otherwise it is refused and nothing is recorded."""

import json
from dataclasses import asdict, replace

import numpy as np
import pytest

from clients.agent import Agent
from xclp.job_params import JobParams
from xclp.privacy.site_ledger import SiteLedger
from xclp.site_admission import AcceptedRuns, Offer, SiteAdmission, child_params
from xclp.site_policy import PolicyError, SitePolicy

SITES = ("a", "b", "c")
CONFIG = {"rounds": 3, "dp_epsilon": 1.0, "clip": 1.0, "secure_aggregation": True, "crypto": "lattice", "bits": 64,
          "k": 6, "sites_per_round": 3}
TRAIN = {"algorithm": "fedavg-xclp", "config": CONFIG, "classes": 10}


class _Pins:  # a membership of the three sites
    def refusal(self, sites, me):  # (e: a member that is not in the run)
        return None if set(sites) <= {*SITES, "e"} else "outsider"


@pytest.fixture
def site(tmp_path):
    ledger = SiteLedger(tmp_path, delta=1e-5)
    return SiteAdmission("a", SitePolicy(max_epsilon=2.0), _Pins(), ledger, "d" * 64, AcceptedRuns(tmp_path)), ledger


def _label_dp(job: str, flip: float = 0.8) -> dict:
    return asdict(JobParams(job_id=job, n_classes=10, bits=64, k=6, crypto="lattice", label_flip=flip).validate())


def test_a_child_of_a_run_the_site_never_admitted_is_refused_and_costs_nothing(site):
    adm, ledger = site
    with pytest.raises(PolicyError, match="never admitted"):
        adm.admit(Offer("Tr1", "predict", _label_dp("Tr1"), SITES, parent="T"))
    assert ledger.epsilon("d" * 64) == 0.0


def test_children_that_are_not_the_accepted_runs_rounds_are_refused(site):
    adm, ledger = site
    adm.admit(Offer("T", "train", TRAIN, SITES))  # the run this site accepts: ε = 1 stated
    spent = ledger.epsilon("d" * 64)
    assert spent == pytest.approx(1.0)
    honest = asdict(child_params(AcceptedRuns.get(adm.runs, "T"), "T", "Tr1"))
    adm.admit(Offer("Tr1", "predict", honest, SITES, parent="T"))  # a round's job: inside the run's budget
    assert ledger.epsilon("d" * 64) == spent
    for n in range(20):  # the attack: many label-DP jobs under the old run's name
        with pytest.raises(PolicyError, match="not one of the run's rounds"):
            adm.admit(Offer(f"evil{n}", "predict", _label_dp(f"evil{n}"), SITES, parent="T"))
    other = {**honest, "label_flip": 0.8}  # a round's id with other noise: a fresh release
    with pytest.raises(PolicyError, match="label_flip differ"):
        adm.admit(Offer("Tr2", "predict", {**other, "job_id": "Tr2"}, SITES, parent="T"))
    with pytest.raises(PolicyError, match="outside the run"):
        adm.admit(Offer("Tr2", "predict", {**honest, "job_id": "Tr2"}, ("a", "b", "e"), parent="T"))
    assert ledger.epsilon("d" * 64) == spent  # nothing of the refused jobs recorded
    adm.admit(Offer("Tr2", "predict", {**honest, "job_id": "Tr2"}, SITES, parent="T"))


def test_the_agent_refuses_a_parent_job_it_did_not_accept(tmp_path):
    """Through the agent: the status names a training job whose state file exists (the attack's old job),
    but the child's parameters are a label-DP job of its own: refused, the ledger untouched."""
    X = np.random.default_rng(0).random((8, 3))
    np.savez(tmp_path / "d.npz", X=X, y=np.array([0, 1, -1, -1, 0, 1, -1, -1]))
    params = _label_dp("evil1")

    class Api:
        def job(self, job_id):
            return {"job": job_id, "kind": "predict", "status": "running", "phase": "setup", "sites": list(SITES),
                    "live": list(SITES), "params": params, "parent": "T"}

    agent = Agent(Api(), "a", tmp_path / "d.npz", tmp_path / "out", policy=SitePolicy(max_epsilon=2.0),
                  pins={"b": "SHA256:" + "b" * 43, "c": "SHA256:" + "c" * 43})
    agent.state("T")["noise"] = "00" * 32  # the old training job's state file is there
    before = json.loads(agent.ledger.path.read_text()) if agent.ledger.path.exists() else None
    with pytest.raises(PolicyError, match="never admitted"):
        agent.step("evil1")
    after = json.loads(agent.ledger.path.read_text()) if agent.ledger.path.exists() else None
    assert before == after
    # the same job offered as a job of its own (no parent) is charged as one: ε of randomized response
    params_own = replace(JobParams(**params), job_id="own1")
    got = agent.admission.admit(Offer("own1", "predict", asdict(params_own), SITES))
    assert got["new"] and got["epsilon"] > 0
