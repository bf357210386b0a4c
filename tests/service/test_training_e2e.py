"""Training jobs end to end: a real coordinator process and real agent processes training at home.

The service runs the simulation's own round functions with randomness fixed by (seed, round, site),
so the same job in process and through the service must give the same model, bit for bit — also
when the coordinator is killed with SIGKILL between rounds and restarted on the same database.
The FedAvg family here; FedCT (over a public set) in test_training_e2e_public.py, FedKT and FREDY in
test_training_e2e_votes.py.
"""

# SQLite only (tests/service/conftest.py): a training job's state is the same JSON column as a prediction
# job's, whose SIGKILL-and-restart on PostgreSQL is test_e2e's test_coordinator_killed_mid_phase_resumes[postgres].

import time

import numpy as np
import pytest
import torch
from svc import cluster_fixture
from train_cluster import TrainCluster

from xclp.training.fedavg import FedAvgConfig
from xclp.training.messages import load_state
from xclp.training.models import build_network
from xclp.training.simulation import run_fedavg

pytestmark = pytest.mark.slow


cluster_factory = cluster_fixture(TrainCluster)

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


FEDAVG = dict(rounds=3, sites_per_round=2, local_epochs=1, lr=0.1, seed=5)  # secure aggregation: the default


def _sim_fedavg(c: TrainCluster, algorithm: str, **kw) -> dict:
    cfg = FedAvgConfig(algorithm=algorithm, secure_aggregation=True, **{**FEDAVG, **kw})
    test = (c.ds.X[:10].astype(np.float32), c.ds.y_true[:10])
    return run_fedavg(c.sites(), test, 10, cfg)


def _service_weights(c: TrainCluster, job: str) -> dict:
    net = build_network("mlp", 64, 10)
    state, _ = load_state(c.admin.model(job), net.state_dict())
    return state


def test_fedavg_job_survives_coordinator_and_agent_kills_and_equals_the_simulation(cluster_factory):
    c = cluster_factory()
    c.start_agents()
    job = c.admin.submit_train(algorithm="fedavg", sites=c.ds.sites, classes=10, crypto="plaintext", **FEDAVG)
    c.wait(job, lambda st: len(st["training"].get("history") or []) >= 1, what="round 1")
    c.kill_coordinator()  # between (or inside) rounds: the checkpoint of the last closed round survives
    c.kill_agent(c.ds.sites[0])  # and a site: restarted, it repeats its update byte for byte
    c.start_coordinator()
    c.start_agent(c.ds.sites[0])
    st = c.wait(job, lambda st: st["status"] == "done", what="job done")
    hist = st["training"]["history"]
    assert [r["round"] for r in hist] == [1, 2, 3]
    assert st["training"]["final"]["local_accuracy"] is not None and st["training"]["final"]["local_accuracy"] > 0.3
    # the sites' files carry y_true: the model is scored on the points whose labels it never trained on
    assert st["training"]["final"]["local_accuracy_of"] == "accuracy on unlabelled points (truth column)"
    assert all(m["eval_on"] == "unlabelled" for m in st["training"]["final"]["site_metrics"].values())
    sim = _sim_fedavg(c, "fedavg")
    got = _service_weights(c, job)
    want = sim["model"].state_dict()
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k  # bit for bit: same plan, same batches, same average
    assert [r["sites"] for r in hist] == [r["sites"] for r in sim["history"]]
    for s in c.ds.sites:  # each site keeps the final model and its own predictions
        res = np.load(c.result(job, s))
        assert res["labels"].shape == res["confidence"].shape == ((c.ds.site == s).sum(),)
        assert c.result(job, s, ".model.npz").stat().st_size > 0


@sqlite_only
def test_a_dp_fedavg_job_adds_noise_shares_inside_the_secure_sum_and_keeps_its_ledger(cluster_factory):
    # Each agent clips its update and adds its Gaussian share (os.urandom) inside the masked sum; the
    # coordinator decodes the noisy average and spends one Gaussian release per decoded round.
    c = cluster_factory()
    c.start_agents()
    job = c.admin.submit_train(algorithm="fedavg", sites=c.ds.sites, classes=10, crypto="plaintext",
                               clip=0.5, dp_epsilon=200.0, **{**FEDAVG, "rounds": 2})
    st = c.wait(job, lambda st: st["status"] == "done", what="job done")
    led = st["training"]["privacy"]
    assert len(led["events"]) == 2 and all(e["event"]["mechanism"] == "gaussian" for e in led["events"])
    assert 0 < led["epsilon"] <= 200.0 and led["neighbouring"] == "replace the whole data of one site"
    assert all(r["decoded"] for r in st["training"]["history"])
    # under DP the uploads carry no statistics of the sites' data in the clear
    assert all(set(m) <= {"participants"} for r in st["training"]["history"] for m in r["site_metrics"].values())
    # nor does their score of the final model (no ledger accounts for it)
    assert st["training"]["final"]["local_accuracy"] is None
    noisy = _service_weights(c, job)
    clean = _sim_fedavg(c, "fedavg", rounds=2, clip=0.5)["model"].state_dict()  # clipped, no noise
    assert any(not torch.equal(noisy[k], clean[k]) for k in clean)  # the shares did not cancel
    assert all(torch.isfinite(v).all() for v in noisy.values())


def _wait_passing_the_steps_that_wait_on(c: TrainCluster, job: str, gone: str, timeout: float) -> dict:
    """Wait for the job to end; a step that waits for the `gone` site alone — its round's XCLP job's
    setup (its announce), the round's masked sum (its update), the evaluation (its score) — runs past
    its deadline at once (ProcessCluster.expire) instead of after it: every other site's part is in and
    none of the gone site's, so nothing but the deadline could end that step. What the deadline then
    does is the coordinator's own. A step in any other state is left to its own deadline."""

    def part(st: dict):
        """Whether a topic is the gone site's part of the step `st` is in (None: a step not waited for here)."""
        if st["kind"] == "predict":
            return (lambda t: t == "announce") if st["phase"] == "setup" else None
        if st["phase"] == "round" and not st["training"].get("survivors"):  # its uploads, not its unmask step
            return lambda t: t.startswith(f"update/{st['round']}/")
        return (lambda t: t == "eval") if st["phase"] == "evaluate" else None

    def waits_on_gone(job_id: str, st: dict) -> bool:
        prog, ours = st.get("progress") or {}, part(st)
        return (st["status"] == "running" and ours is not None and gone in st["live"]
                and bool(prog.get("expected")) and prog["received"] == prog["expected"] - 1
                and not any(s == gone and ours(t) for s, t in c.received(job_id)))

    looked, expired = [0.0], set()

    def check(st: dict) -> bool:
        if st["status"] != "running":
            return st["status"] == "done"
        if time.monotonic() < looked[0] + 0.25:  # (the jobs and their messages: a few looks a second)
            return False
        looked[0] = time.monotonic()
        children = [j["job"] for j in c.admin.jobs() if j["parent"] == job and j["status"] == "running"]
        for job_id, view in [(job, st), *((j, c.admin.job(j)) for j in children)]:
            step = (job_id, view["phase"], view["round"], bool((view.get("training") or {}).get("survivors")))
            if step not in expired and waits_on_gone(job_id, view):
                expired.add(step)  # once: a second look could come after the coordinator took the first,
                c.expire(job_id)  # and expire the next step, which the other sites have not answered yet
        return False

    return c.wait(job, check, timeout=timeout, what="job done")


@sqlite_only
def test_fedavg_xclp_job_runs_secure_xclp_children_and_a_dropped_site_is_left_out(cluster_factory):
    c = cluster_factory()
    c.start_agents()
    sites = c.ds.sites
    job = c.admin.submit_train(algorithm="fedavg-xclp", sites=sites, classes=10, crypto="ot", bits=128, k=8,
                               rounds=2, sites_per_round=3, local_epochs=1, seed=1, max_missed_rounds=5,
                               deadlines={"round": 150, "evaluate": 60}, xclp_deadlines={"setup": 60})
    # (deadlines no step of the live sites comes near, even on a loaded machine — round 1 of a run beside
    # other work missed a 25 s one and left every site out; the gone site's steps below do not wait for
    # them: _wait_passing_the_steps_that_wait_on expires each step that waits on it alone)
    st = c.wait(job, lambda st: len(st["training"].get("history") or []) >= 1, what="round 1")
    first = st["training"]["history"][0]
    child = first["xclp_job"]
    assert child and c.admin.job(child)["status"] == "done" and c.admin.job(child)["parent"] == job
    assert first["left_out"] == [] and sorted(first["trained"]) == sorted(sites)
    assert first["pseudo_label_accuracy"] is not None and first["pseudo_label_accuracy"] > 0.5
    assert all(m["pseudo"] == "fresh" for m in first["site_metrics"].values())
    gone = sites[-1]
    c.kill_agent(gone)  # vanishes: round 2 (its XCLP child, then its masked sum) closes at the deadline without it
    st = _wait_passing_the_steps_that_wait_on(c, job, gone, timeout=400)
    hist = st["training"]["history"]
    assert len(hist) == 2
    assert any(gone in r["left_out"] for r in hist[1:])
    # secure aggregation: its round's masked sum went on without it through the unmask step (double
    # masking), decoded, no one's weights masked twice, not waited for forever
    assert all(r["attempts"] == 1 and r["decoded"] for r in hist[1:] if gone in r["left_out"])
    assert all(gone not in r["trained"] for r in hist[1:])
    assert gone not in st["dropped"]  # left out of rounds, not dropped from the job (max_missed_rounds=5)
    for s in sites[:-1]:
        assert np.load(c.result(job, s))["labels"].size == (c.ds.site == s).sum()
