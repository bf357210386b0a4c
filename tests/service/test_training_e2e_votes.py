"""FedKT and FREDY jobs end to end over a public set U (the noisy vote of teachers' labels on U): a real
coordinator process and real agent processes, each site's final model equal to the in-process
simulation's, bit for bit. (Apart from test_training_e2e_public.py's FedCT so that pytest-xdist's
--dist loadscope can run them on different workers: each test makes its own cluster.)
"""

import json

import numpy as np
import pytest
from svc import cluster_fixture
from train_cluster import TrainCluster

from xclp.training.fedct import public_digest
from xclp.training.fedkt import FedKTConfig
from xclp.training.fredy import FREDYConfig
from xclp.training.saved_learners import load_model_file
from xclp.training.simulation import run_fedkt, run_fredy

pytestmark = pytest.mark.slow

cluster_factory = cluster_fixture(TrainCluster)

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@sqlite_only
def test_a_fedkt_job_gives_every_site_the_simulations_final_model_and_accounts_its_noise(cluster_factory):
    c = cluster_factory(public=200)
    c.start_agents()
    pin = dict(public_sha256=public_digest(c.public_X), public_size=len(c.public_X))
    cfg = dict(partitions=2, teachers=3, seed=4)
    job = c.admin.submit_train(algorithm="fedkt", sites=c.ds.sites, classes=10, model="tree", **pin, **cfg)
    st = c.wait(job, lambda st: st["status"] == "done", what="job done")
    assert [r["round"] for r in st["training"]["history"]] == [1] and not st["training"].get("privacy")
    sim = run_fedkt(c.sites(), c.public_X, (c.public_X[:5], np.zeros(5, int)), 10,
                    FedKTConfig(teacher="tree", **cfg))
    for s in c.ds.sites:  # one upload a party, the server's labels back, the same final model at every site
        model = load_model_file(c.result(job, s, ".model.skops"))
        assert np.array_equal(model.predict(c.public_X), sim["model"].predict(c.public_X)), s
        assert json.loads(c.result(job, s, ".scaling.json").read_text()) == sim["scaling"].to_json(), s
        assert np.load(c.result(job, s))["labels"].size == (c.ds.site == s).sum()
    # under L2 noise each party draws once, keeps its votes, and the ledger spends 2·s·|U1| counts
    job2 = c.admin.submit_train(algorithm="fedkt", sites=c.ds.sites, classes=10, model="tree", levels="L2",
                                gamma=2.0, **pin, **cfg)
    st = c.wait(job2, lambda st: st["status"] == "done", what="job done")
    (event,) = st["training"]["privacy"]["events"]
    assert event["count"] == 2 * 2 * 100 and event["event"]["mechanism"] == "discrete_laplace"
    assert st["training"]["privacy"]["neighbouring"] == "replace one training example of one site"
    assert all((c.tmp / f"out-{s}" / ".agent-state" / f"{job2}.votes.npy").exists() for s in c.ds.sites)


@sqlite_only
def test_a_fredy_job_runs_fedavg_then_the_vote_and_gives_every_site_the_simulations_student(cluster_factory):
    # FedAvg's rounds (secure aggregation), then one vote round: each site's teacher (FedAvg's last model
    # fine-tuned on its labels) labels the queries, the coordinator takes the noisy argmax, every site
    # trains the same student. γ = 40: noise that (almost surely) changes no argmax, so the labels are
    # the simulation's, and the ledger still spends 2·Q counts of sensitivity m.
    c = cluster_factory(public=200)
    c.start_agents()
    pin = dict(public_sha256=public_digest(c.public_X), public_size=len(c.public_X))
    cfg = dict(rounds=2, sites_per_round=3, local_epochs=1, queries=120, gamma=40.0, seed=4)
    job = c.admin.submit_train(algorithm="fredy", sites=c.ds.sites, classes=10, model="mlp", student_model="tree",
                               **pin, **cfg)
    st = c.wait(job, lambda st: st["status"] == "done", what="job done")
    assert [r["round"] for r in st["training"]["history"]] == [1, 2, 3]
    (event,) = st["training"]["privacy"]["events"]
    assert event["count"] == 2 * 120 and event["event"]["sensitivity"] == 3
    sim = run_fredy(c.sites(), c.public_X, (c.public_X[:5], np.zeros(5, int)), 10,
                    FREDYConfig(model="mlp", student="tree", secure_aggregation=True, **cfg))
    for s in c.ds.sites:
        model = load_model_file(c.result(job, s, ".model.skops"))
        assert np.array_equal(model.predict(c.public_X), sim["model"].predict(c.public_X)), s
