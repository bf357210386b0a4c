"""One order, three drivers: the same job, with the same site vanishing in the same phase, run through
the simulation, the coordinator's engine with its agents (the real app, real Agent objects) and Flower
(its in-process Grid, every Context through Flower's serialisation). Each ends with the same drop, in
the same phase, the same restarts of the masked sums, and, for every site left, the simulation's labels
(with that driver's seed contributions). Until the order lived in xclp/prediction_job.py, each driver
wrote its own, and they disagreed (Flower failed a job the engine went on with)."""

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from svc import ADMIN, expire_deadline

from clients.agent import Agent
from clients.api import CoordinatorClient
from service.app import Settings, create_app
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.prediction_job import PredictState
from xclp.simulation import run_xclp
from xclp.splits import simulate_sites

GONE = "site1"


@pytest.fixture(scope="module")
def ds():
    X, y = load_arrays("digits", limit=150, seed=6)
    return simulate_sites(X, y, 3, "iid", 0.2, seed=6)


class _Vanished(Exception):
    pass


class _VanishingClient(CoordinatorClient):
    """The silent site's client: once the job's status it is given has reached `phase`, the site is
    gone (its step ends there, before it sends anything of that phase). Decided on the status the agent
    itself fetches, not on an earlier look of the test's: the engine moves on in its own thread."""

    def __init__(self, *args, phase: str, **kw):
        super().__init__(*args, **kw)
        self.phase = phase

    def job(self, job_id: str) -> dict:
        st = super().job(job_id)
        if PredictState.of(st).reached(self.phase):
            raise _Vanished
        return st


def through_the_service(ds, params, phase, tmp_path):
    settings = Settings(database=f"sqlite:///{tmp_path / 'o.db'}", admin_token=ADMIN, engine_interval=0.02)
    with TestClient(create_app(settings)) as tc:
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)
        agents = {}
        for s in ds.sites:
            token = admin.add_site(s)["token"]
            np.savez(tmp_path / f"{s}.npz", X=ds.X[ds.site == s], y=ds.y[ds.site == s])
            client = (_VanishingClient("http://testserver", token, transport=tc._transport, phase=phase) if s == GONE
                      else CoordinatorClient("http://testserver", token, transport=tc._transport))
            agents[s] = Agent(client, s,
                              tmp_path / f"{s}.npz", tmp_path / f"out-{s}", long_poll=0, trust_on_first_use=True)
            # (long_poll=0: this loop steps the agents one after another; a site's wait on the coordinator
            # would only run out, since the peers whose parts it waits for are stepped after it)
        graph = {} if params.graph == "exact" else {
            "graph": params.graph, "blocking_tables": params.blocking_tables, "max_bucket": params.max_bucket,
            "descent_rounds": params.descent_rounds, "influence_rank": params.influence_rank}
        job = admin.submit_job(kind="predict", sites=ds.sites, crypto=params.crypto, bits=params.bits, k=params.k,
                               classes=params.n_classes, **graph)
        last, still, end = None, 0, time.monotonic() + 180
        while time.monotonic() < end:
            st = admin.job(job)
            if st["status"] != "running":
                break
            for a in agents.values():
                try:
                    a.step(job)
                except _Vanished:  # silent from `phase` on
                    pass
            now = (st["phase"], st["attempt"], tuple(st["live"]), st["progress"]["received"])
            still = still + 1 if now == last else 0
            last = now
            m, prog = len(st["live"]), st["progress"]
            gone_parts = 1 + 2 * (m - 1) if st["phase"] == "hamming" else 1  # its distances and pair shares, or its sum
            if params.graph == "blocked" and st["phase"] == "hamming":
                gone_parts = 2  # its tags and within-site lists (round 0)
            if (still >= 10 and st["phase"] == phase and GONE in st["live"]
                    and prog["received"] >= prog["expected"] - gone_parts):
                # everyone else's part is in, the silent site's never comes: the phase's deadline passes
                expire_deadline(tc.app.state.sessionmaker, job)
                still = 0
            time.sleep(0.01)
        for s, a in agents.items():
            if s != GONE:
                a.step(job)  # take the sums
        st = admin.job(job)
        assert st["status"] == "done", st.get("failure")
        labels = {s: np.load(a.result_path(job))["labels"] for s, a in agents.items() if a.result_path(job).exists()}
        contributions = {s: bytes.fromhex(a.state(job)["contribution"]) for s, a in agents.items()}
        return st["dropped"], st["attempts"], labels, contributions, JobParams(**st["params"])


def through_flower(ds, params, phase, tmp_path):
    pytest.importorskip("flwr", reason="Flower is the optional extra")
    from xclp_flower.client_app import app as client_app
    from xclp_flower.grid import InProcessGrid
    from xclp_flower.prediction import FlowerXCLP

    configs = []
    for s in ds.sites:
        np.savez(tmp_path / f"f-{s}.npz", X=ds.X[ds.site == s], y=ds.y[ds.site == s])
        configs.append({"trust-on-first-use": "true", "site": s, "data-path": str(tmp_path / f"f-{s}.npz"), "out": str(tmp_path / f"fout-{s}")})
    grid = InProcessGrid(client_app, configs)
    grid.vanish_in = {100 + ds.sites.index(GONE): phase}
    out = FlowerXCLP(grid, params).run()
    labels = {s: np.load(out["written"][s])["labels"] for s in out["written"]}
    contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in out["written"]}
    node = grid.contexts[100 + ds.sites.index(GONE)]
    from xclp.protocol import SiteSession  # the vanished node's contribution, from the session it saved

    saved = bytes(node.state[f"xclp:{params.job_id}"]["session"])
    contributions[GONE] = SiteSession.from_bytes(saved, ds.X[ds.site == GONE], ds.y[ds.site == GONE]).my_contribution()
    state = out["state"]
    return state["dropped"], state["attempts"], labels, contributions, params


@pytest.mark.parametrize("phase", ["counts", "hamming", "row_sums"])
def test_the_same_drop_restart_and_labels_through_every_driver(ds, phase, tmp_path):
    params = JobParams(job_id="one-order", n_classes=10, bits=64, k=5, crypto="lattice")
    sim = run_xclp(ds, params, drops={GONE: phase})
    want_dropped, want_attempts = sim.job.dropped, sim.job.attempts
    assert want_dropped == {GONE: phase}
    # a masked sum the site left restarts once without it, the others complete at their first attempt
    assert want_attempts == {"setup": 0, "seed": 0, "counts": int(phase == "counts"), "hamming": 0,
                             "row_sums": int(phase == "row_sums")}
    for name, driver in (("service", through_the_service), ("flower", through_flower)):
        (tmp_path / name).mkdir()
        dropped, attempts, labels, contributions, used = driver(ds, params, phase, tmp_path / name)
        assert {s: p.split(":")[0] for s, p in dropped.items()} == want_dropped, name
        assert attempts == want_attempts, name
        assert sorted(labels) == sorted(s for s in ds.sites if s != GONE), name
        ref = run_xclp(ds, used, contributions=contributions, drops={GONE: phase})
        for s, got in labels.items():
            assert np.array_equal(got, ref.predictions[s].labels), (name, s)


def test_a_blocked_job_through_every_driver(ds, tmp_path):
    # issue 23's blocked graph in the one order: the same rounds of candidate blocks (lattice), the same
    # drop of a site silent from the hamming phase on, and the simulation's labels, through every driver
    # (a descent round: its entries answered from the first round's kept results, crypto.lattice_kept, a
    # Flower site saving them with its session)
    params = JobParams(job_id="one-order-blocked", n_classes=10, bits=64, k=5, crypto="lattice", graph="blocked",
                       blocking_tables=4, max_bucket=4, descent_rounds=1, influence_rank=8)
    sim = run_xclp(ds, params, drops={GONE: "hamming"})
    assert sim.job.dropped == {GONE: "hamming"} and sim.job.attempts["hamming"] >= 1  # rounds of blocks ran
    for name, driver in (("service", through_the_service), ("flower", through_flower)):
        (tmp_path / name).mkdir()
        dropped, attempts, labels, contributions, used = driver(ds, params, "hamming", tmp_path / name)
        assert {s: p.split(":")[0] for s, p in dropped.items()} == sim.job.dropped, name
        # the rounds depend on the codes, hence on the seed: the same as the simulation with the driver's
        ref = run_xclp(ds, used, contributions=contributions, drops={GONE: "hamming"})
        assert attempts == ref.job.attempts, name
        assert sorted(labels) == sorted(s for s in ds.sites if s != GONE), name
        for s, got in labels.items():
            assert np.array_equal(got, ref.predictions[s].labels), (name, s)
