"""Attack: the coordinator registers a site of its own making (a Sybil) and puts it in a job with real
sites. With m = 3, τ = 1, the Sybil's share of a victim's self-mask seed is the seed itself; through seed
agreement it gives the coordinator the job's LSH seed. Defence: each site takes part only with the peers
its operator admitted (crypto.identity.Membership, xclp.site_admission) — refused before any share
leaves it, with a reason naming the Sybil, through the agent and through Flower."""

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from svc import ADMIN

from clients.agent import Agent
from clients.api import CoordinatorClient
from crypto.identity import Identity
from service.app import Settings, create_app
from xclp.data import load_arrays
from xclp.refusal import REFUSE
from xclp.site_policy import SitePolicy
from xclp.splits import simulate_sites

SYBIL = "sybil-d"


def _membership(tmp_path, keys: dict) -> dict:
    """Each real site's identity (its key made where its driver finds it) in one membership file."""
    members = {s: Identity.load_or_create(key).fingerprint for s, key in keys.items()}
    (tmp_path / "membership.json").write_text(json.dumps({"sites": members}))
    return members


@pytest.fixture
def consortium(tmp_path):
    from crypto.identity import Membership

    settings = Settings(database=f"sqlite:///{tmp_path / 'e.db'}", admin_token=ADMIN, engine_interval=0.02)
    with TestClient(create_app(settings)) as tc:
        X, y = load_arrays("digits", limit=150, seed=4)
        ds = simulate_sites(X, y, 3, "iid", 0.3, seed=4)
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)
        _membership(tmp_path, {s: tmp_path / f"out-{s}" / ".agent-state" / "identity.key" for s in ds.sites})
        members = Membership.load(tmp_path / "membership.json")
        agents, sent = {}, {s: [] for s in ds.sites}
        for s in ds.sites:
            token = admin.add_site(s)["token"]
            idx = np.flatnonzero(ds.site == s)
            np.savez(tmp_path / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])
            client = CoordinatorClient("http://testserver", token, transport=tc._transport)
            put = client.put

            def spy(job, topic, body, *a, _put=put, _s=s, **kw):  # every upload a site makes, recorded
                sent[_s].append(topic)
                return _put(job, topic, body, *a, **kw)

            client.put = spy
            agents[s] = Agent(client, s, tmp_path / f"{s}.npz", tmp_path / f"out-{s}", membership=members,
                              policy=SitePolicy(allow_plaintext=True, allow_unmasked=True))
        admin.add_site(SYBIL)  # the coordinator's own site: it could run an agent for it
        yield ds, admin, agents, sent


@pytest.mark.parametrize("kind", ["predict", "train"])
def test_agents_refuse_a_job_with_a_site_their_operators_never_admitted(consortium, kind):
    ds, admin, agents, sent = consortium
    sites = [*ds.sites, SYBIL]
    if kind == "predict":
        job = admin.submit_job(kind="predict", sites=sites, crypto="lattice", bits=64, k=6, classes=10)
    else:
        job = admin.submit_train(algorithm="fedavg", sites=sites, classes=10, rounds=2, sites_per_round=4, seed=1)
    for _ in range(3):
        for a in agents.values():
            a.run(once=True)
    st = admin.job(job)
    assert sorted(st["refused"]) == sorted(ds.sites)
    for s in ds.sites:
        assert SYBIL in st["refused"][s] and "did not admit" in st["refused"][s]
        assert sent[s] == [REFUSE]  # the refusal, and not one share, key or announce before it


def test_without_a_membership_or_the_flag_an_agent_takes_part_with_no_peer(tmp_path):
    np.savez(tmp_path / "d.npz", X=np.zeros((4, 2)), y=np.array([0, 1, -1, -1]))

    class Api:
        pass

    agent = Agent(Api(), "a", tmp_path / "d.npz", tmp_path / "out")
    from xclp.site_admission import Offer
    from xclp.site_policy import PolicyError

    with pytest.raises(PolicyError, match="no membership"):
        agent.admission.admit(Offer("j", "predict", {"job_id": "j", "n_classes": 2, "crypto": "lattice"}, ("a", "b")))


def test_flower_nodes_refuse_a_run_with_a_node_outside_their_membership(tmp_path):
    pytest.importorskip("flwr")
    from xclp.job_params import JobParams
    from xclp_flower.client_app import app as client_app
    from xclp_flower.grid import InProcessGrid
    from xclp_flower.server_app import FlowerXCLP, SiteFailed

    X, y = load_arrays("digits", limit=150, seed=1)
    ds = simulate_sites(X, y, 4, "iid", 0.3, seed=1)
    real, sybil = ds.sites[:3], ds.sites[3]
    _membership(tmp_path, {s: tmp_path / f"out-{s}" / "identity.key" for s in real})
    configs = []
    for s in ds.sites:
        m = ds.site == s
        np.savez(tmp_path / f"{s}.npz", X=ds.X[m], y=ds.y[m])
        configs.append({"site": s, "data-path": str(tmp_path / f"{s}.npz"), "out": str(tmp_path / f"out-{s}"),
                        "allow-plaintext": "true", **({"membership": str(tmp_path / "membership.json")} if s in real
                                                      else {"trust-on-first-use": "true"})})
    grid = InProcessGrid(client_app, configs)
    with pytest.raises(SiteFailed) as exc:
        FlowerXCLP(grid, JobParams(job_id="flower-sybil", n_classes=10, bits=64, k=6, crypto="lattice")).run()
    assert repr(sybil) in str(exc.value) and "did not admit" in str(exc.value)
    assert not any((tmp_path / f"out-{s}" / "flower-sybil.npz").exists() for s in real)


@pytest.mark.slow
def test_real_agents_with_a_membership_file_refuse_a_training_job_with_a_fourth_site(tmp_path):
    """Real processes: a coordinator and three agents started with the consortium's membership file. The
    coordinator registers a fourth site and starts a training job with it: every real site refuses, with a
    reason naming the unknown site, and nothing but its refusal leaves it."""
    import time

    from svc import ProcessCluster

    X, y = load_arrays("digits", limit=150, seed=2)
    ds = simulate_sites(X, y, 3, "iid", 0.3, seed=2)
    sites = {s: {"X": (ds.X[ds.site == s] / 16.0).astype(np.float32), "y": ds.y[ds.site == s]} for s in ds.sites}
    c = ProcessCluster(tmp_path, f"sqlite:///{tmp_path / 'coord.db'}", sites)
    try:
        for s in ds.sites:
            c.start_agent(s)
        c.admin.add_site(SYBIL)  # the coordinator's own site (it could run an agent for it)
        job = c.admin.submit_train(algorithm="fedavg", sites=[*ds.sites, SYBIL], classes=10, rounds=2,
                                   sites_per_round=4, seed=1)
        end = time.monotonic() + 120
        while len((st := c.admin.job(job)).get("refused") or {}) < 3 and time.monotonic() < end:
            time.sleep(0.1)
        assert sorted(st["refused"]) == sorted(ds.sites), f"{st}\n{c.logs()}"
        for s in ds.sites:
            assert repr(SYBIL) in st["refused"][s] and "did not admit" in st["refused"][s]
        # each real site's refusal, and no hello, key or upload
        assert {(x, t) for x, t in c.received(job) if x != SYBIL} == {(s, REFUSE) for s in ds.sites}
        for s in ds.sites:
            assert "refused by this site's membership" in (tmp_path / f"agent-{s}.log").read_text()
    finally:
        c.close()
