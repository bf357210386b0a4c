"""FedCT jobs end to end over a public set U: a real coordinator process and real agent processes, each
site's local model equal to the in-process simulation's, bit for bit. (A module apart from
test_training_e2e.py's FedAvg family and test_training_e2e_votes.py's FedKT and FREDY so that
pytest-xdist's --dist loadscope can run them on different workers: each test makes its own cluster,
nothing is shared between them.)
"""

import json

import numpy as np
import pytest
from svc import cluster_fixture
from train_cluster import TrainCluster

from xclp.training.fedct import FedCTConfig, public_digest
from xclp.training.saved_learners import load_model_file
from xclp.training.simulation import run_fedct

pytestmark = pytest.mark.slow

cluster_factory = cluster_fixture(TrainCluster)

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@sqlite_only
def test_fedct_jobs_equal_the_simulation_and_add_xclp_labels(cluster_factory):
    c = cluster_factory(public=200)
    c.start_agents()
    cfg = dict(rounds=3, seed=2, bits=256, k=8)
    pin = dict(public_sha256=public_digest(c.public_X), public_size=len(c.public_X))
    job = c.admin.submit_train(algorithm="fedct", sites=c.ds.sites, classes=10, model="tree", **pin, **cfg)
    c.wait(job, lambda st: len(st["training"].get("history") or []) >= 1, what="exchange 1")
    c.kill_agent(c.ds.sites[1])  # its learner is on disk after every exchange: restarted, it goes on
    c.start_agent(c.ds.sites[1])
    st = c.wait(job, lambda st: st["status"] == "done", what="job done")
    hist = st["training"]["history"]
    assert [r["round"] for r in hist] == [1, 2, 3] and all(r["left_out"] == [] for r in hist)
    sim = run_fedct(c.sites(), c.public_X, (c.public_X[:5], np.zeros(5, int)), 10, FedCTConfig(learners="tree", **cfg))
    for i, s in enumerate(c.ds.sites):  # the same consensus rounds give the same local models
        learner = load_model_file(c.result(job, s, ".model.skops"))
        assert np.array_equal(learner.predict(c.public_X), sim["models"][i].predict(c.public_X)), s
        # on inputs standardised by the same pooled μ, σ (U's too), written beside the model
        assert json.loads(c.result(job, s, ".scaling.json").read_text()) == sim["scaling"].to_json(), s
    assert [h["public_coverage"] for h in hist] == pytest.approx([h["public_coverage"] for h in sim["history"]])

    short = {**cfg, "rounds": 2}  # (the XCLP jobs below: what they show needs no third exchange)
    job2 = c.admin.submit_train(algorithm="fedct-xclp", sites=c.ds.sites, classes=10, model="tree",
                                crypto="plaintext", **pin, **short)
    st = c.wait(job2, lambda st: st["status"] == "done", what="job done")
    first = st["training"]["history"][0]
    assert first["xclp_job"] is not None and c.admin.job(first["xclp_job"])["status"] == "done"
    assert first["xclp_pseudo_label_accuracy"] > 0.5
    assert all(m["n_pseudo"] > 0 for m in first["site_metrics"].values())

    # FedCT+XCLP under a budget: half of it for the randomized labels XCLP propagates, drawn once per
    # site for the whole job (one event, whatever the rounds), half for FedCT's labels on U.
    job4 = c.admin.submit_train(algorithm="fedct-xclp", sites=c.ds.sites, classes=10, model="tree",
                                crypto="plaintext", dp_epsilon=16.0, **pin, **short)
    st = c.wait(job4, lambda st: st["status"] == "done", what="job done")
    led = st["training"]["privacy"]
    assert [e["what"].startswith("xclp:") for e in led["events"]] == [True, False, False]
    assert 0 < led["epsilon"] <= 16.0 and "label" in led["neighbouring"]
    child = c.admin.job(st["training"]["history"][0]["xclp_job"])
    assert 0 < child["params"]["label_flip"] < 1 and child["privacy"]["epsilon"] == pytest.approx(8.0, rel=1e-3)
    assert child["status"] == "done"
    # under a budget the sites report no statistics of their data (no ledger accounts for them)
    hist = st["training"]["history"]
    assert all(r["xclp_pseudo_label_accuracy"] is None and r["local_accuracy"] is None for r in hist)
    assert all(m == {} for r in hist for m in r["site_metrics"].values())

    # Under a DP budget every site draws randomized-response noise for its labels and the coordinator
    # keeps the job's ledger: the consensus is no longer the noise-free one, and ε stays in budget.
    job3 = c.admin.submit_train(algorithm="fedct", sites=c.ds.sites, classes=10, model="tree", dp_epsilon=20.0,
                                **pin, **cfg)
    st = c.wait(job3, lambda st: st["status"] == "done", what="job done")
    led = st["training"]["privacy"]
    assert [e["count"] for e in led["events"]] == [len(c.public_X)] * 3 and 0 < led["epsilon"] <= 20.0
    hist3 = st["training"]["history"]
    assert all(r["left_out"] == [] for r in hist3)
    differ = []
    for i, s in enumerate(c.ds.sites):  # trained on a noisy consensus, the local models are not the noise-free ones
        model = load_model_file(c.result(job3, s, ".model.skops"))
        differ.append(not np.array_equal(model.predict(c.public_X), sim["models"][i].predict(c.public_X)))
    assert any(differ)


@sqlite_only
def test_fedct_job_refuses_a_site_whose_public_set_differs(cluster_factory):
    c = cluster_factory(public=50)
    forged = c.public_X.copy()
    forged[0, 0] += 1.0
    np.savez(c.tmp / "public.npz", X=forged)  # every agent now holds a U that is not the pinned one
    c.start_agents()
    job = c.admin.submit_train(algorithm="fedct", sites=c.ds.sites, classes=10, model="tree", rounds=1,
                               public_sha256=public_digest(c.public_X), public_size=len(c.public_X),
                               deadlines={"setup": 3})
    st = c.wait(job, lambda st: st["status"] != "running", timeout=60, what="job ended")
    assert st["status"] == "failed" and set(st["dropped"]) == set(c.ds.sites)
