"""An agent waiting inside SecureHamming for its peers' pair messages asks only for those messages:
it reuses its job status and /work answer for agent.QUIET_SECONDS, and asks again once it moves on."""

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from svc import ADMIN

import clients.agent as agent_mod
from clients.agent import Agent
from clients.api import CoordinatorClient
from service.app import Settings, create_app
from xclp.data import load_arrays
from xclp.site_policy import SitePolicy
from xclp.splits import simulate_sites

REFERENCE_OK = SitePolicy(allow_plaintext=True)  # these sites opt in to the plaintext reference


class Counting:
    def __init__(self, api):
        self.api, self.calls = api, []

    def __getattr__(self, name):
        fn = getattr(self.api, name)

        def call(*a, **kw):
            self.calls.append(name)
            return fn(*a, **kw)

        return call


@pytest.fixture
def rig(tmp_path, monkeypatch):
    monkeypatch.setattr(agent_mod, "QUIET_SECONDS", 3600.0)  # no clock in the test: the window never ends
    settings = Settings(database=f"sqlite:///{tmp_path / 'p.db'}", admin_token=ADMIN, engine_interval=0.02)
    with TestClient(create_app(settings)) as tc:
        X, y = load_arrays("digits", limit=120, seed=3)
        ds = simulate_sites(X, y, 2, "iid", 0.2, seed=3)
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)
        agents = {}
        for s in ds.sites:
            token = admin.add_site(s)["token"]
            idx = np.flatnonzero(ds.site == s)
            np.savez(tmp_path / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])
            agents[s] = Agent(Counting(CoordinatorClient("http://testserver", token, transport=tc._transport)), s,
                              tmp_path / f"{s}.npz", tmp_path / f"out-{s}", policy=REFERENCE_OK, trust_on_first_use=True)
        yield ds, admin, agents


def test_waiting_for_pair_messages_asks_only_for_them(rig):
    ds, admin, agents = rig
    a, b = (agents[s] for s in ds.sites)
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="ot", bits=32, k=4, classes=10)
    for _ in range(400):  # up to the Hamming phase, then b speaks once (its reply to a's HELLO is pending)
        for ag in (a, b):
            ag.run(once=True)
        if b.pairs.get(job) and b.pairs[job][a.site]["side"].got == 1:
            break
        time.sleep(0.01)
    else:
        raise AssertionError(admin.job(job))
    a.run(once=True)  # a takes b's BASE1 and answers; from here a waits for b's EXT
    a.run(once=True)
    a.api.calls.clear()
    for _ in range(10):
        a.run(once=True)
    assert a.api.calls == ["get"] * 10  # no /work, no job status: only the pair message
    b.run(once=True)  # b answers
    a.api.calls.clear()
    a.run(once=True)  # a moves on: it takes b's message and answers
    assert a.api.calls[:2] == ["get", "put"]
    a.api.calls.clear()
    a.run(once=True)  # and then asks again what the job is doing
    assert a.api.calls[:2] == ["work", "job"]
    # the job finishes as before
    for _ in range(600):
        for ag in (a, b):
            ag.run(once=True)
        if all(ag.result_path(job).exists() for ag in (a, b)):
            break
        time.sleep(0.01)
    assert admin.job(job)["status"] == "done"
    assert all(ag.result_path(job).exists() for ag in (a, b))


def test_a_long_poll_returns_the_message_or_404(app_client):
    from crypto.keys import SiteKeyPair
    from xclp.announce import encode_announce

    heads = {}
    for s in ("a", "b"):
        r = app_client.post("/sites", json={"name": s}, headers={"Authorization": f"Bearer {ADMIN}"})
        heads[s] = {"Authorization": f"Bearer {r.json()['token']}"}
    job = app_client.post("/jobs", json={"sites": ["a", "b"], "crypto": "plaintext", "classes": 2},
                          headers={"Authorization": f"Bearer {ADMIN}"}).json()["job"]
    url = f"/jobs/{job}/messages"
    assert app_client.get(f"{url}/roster?wait=0.2", headers=heads["a"]).status_code == 404  # not there in time
    for s in ("a", "b"):
        body = encode_announce(s, SiteKeyPair.generate().public_bytes(), 4, np.array([0]), bytes(32))
        assert app_client.put(f"{url}/announce", content=body, headers=heads[s]).status_code == 200
    r = app_client.get(f"{url}/roster?wait=10", headers=heads["a"])  # the engine writes it within the wait
    assert r.status_code == 200 and r.content


def test_job_ids_that_are_not_plain_names_are_refused_and_never_become_paths(tmp_path):
    """A coordinator that names a job '../x' must not make the agent write (or load) outside its folders."""
    from crypto.errors import ProtocolError

    class Evil:
        def work(self):
            return {"jobs": ["../../escape", "ok_job-1"], "done": ["/etc/passwd"]}

        def job(self, job_id):
            raise AssertionError(f"asked for {job_id}")

    X = np.random.default_rng(0).random((6, 3))
    np.savez(tmp_path / "d.npz", X=X, y=np.array([0, 1, -1, -1, 0, 1]))
    agent = Agent(Evil(), "s", tmp_path / "d.npz", tmp_path / "out", trust_on_first_use=True)
    assert agent._work() == {"jobs": ["ok_job-1"], "done": []}
    assert {"../../escape", "/etc/passwd"} <= agent.given_up
    for bad in ("../../escape", "a/b", "", ".hidden", "x" * 65):
        with pytest.raises(ProtocolError, match="not a plain name"):
            agent.result_path(bad)
        with pytest.raises(ProtocolError, match="not a plain name"):
            agent.state(bad)
    assert agent.result_path("ok_job-1") == tmp_path / "out" / "ok_job-1.npz"
    assert not (tmp_path / "escape.json").exists() and not (tmp_path.parent / "escape.json").exists()


def test_keys_of_failed_and_dropped_jobs_are_wiped(tmp_path):
    """/work lists only running and finished jobs: the agent asks about the others it holds keys for
    and wipes the private key of every job that failed, dropped this site, or that the coordinator forgot."""
    from clients.agent import JobState
    from clients.api import ApiError

    statuses = {"failedjob": {"status": "failed", "live": ["s", "t"]},
                "dropped": {"status": "running", "live": ["t"]},
                "running": {"status": "running", "live": ["s", "t"]}}

    class Api:
        def work(self):
            return {"jobs": [], "done": []}

        def job(self, job_id):
            if job_id == "forgotten":
                raise ApiError(404, "no such job")
            if job_id == "unreachable":
                raise ApiError(503, "down")
            return statuses[job_id]

    np.savez(tmp_path / "d.npz", X=np.random.default_rng(0).random((4, 2)), y=np.array([0, 1, -1, -1]))
    agent = Agent(Api(), "s", tmp_path / "d.npz", tmp_path / "out", trust_on_first_use=True)
    names = ("failedjob", "dropped", "running", "forgotten", "unreachable")
    for job in names:
        st = agent.state(job)
        st.data["contribution"] = "11" * 32
        st["key"] = "22" * 32
    agent._work()
    assert sorted(agent.sweep_keys()) == ["dropped", "failedjob", "forgotten"]
    for job in names:
        data = JobState(agent.state_dir / f"{job}.json").data
        kept = job in ("running", "unreachable")
        assert ("key" in data) == kept and "contribution" in data, job
        assert ("22" * 32 in (agent.state_dir / f"{job}.json").read_text()) == kept
    assert JobState(agent.state_dir / "dropped.json")["wiped"] == "dropped"
    with pytest.raises(Exception, match="wiped"):
        agent.session("dropped", {"params": {}})


def _until_done(admin, job, agents, rounds=600):
    for _ in range(rounds):
        for ag in agents:
            ag.run(once=True)
        if all(ag.result_path(job).exists() for ag in agents):
            return
        time.sleep(0.01)
    raise AssertionError(admin.job(job))


def test_a_fresh_out_skips_the_sites_old_jobs_quietly_and_takes_part_in_new_ones(rig, tmp_path, caplog):
    """An agent started on a new --out folder holds no key of the site's earlier jobs: it cannot open
    their sealed messages, and says so once (info) instead of reporting each as tampered with."""
    import logging
    import threading

    ds, admin, agents = rig
    a, b = (agents[s] for s in ds.sites)
    old = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=32, k=4, classes=10)
    _until_done(admin, old, [a, b])
    # the site keeps its identity (the key its peers pinned) when it moves to a new --out
    fresh = Agent(a.api, a.site, tmp_path / f"{a.site}.npz", tmp_path / "fresh-out", policy=REFERENCE_OK,
                  identity_key=a.state_dir / "identity.key", trust_on_first_use=True)
    caplog.clear()  # (the old job's own lines: its agents' first unbounded ledger entry, at WARNING)
    with caplog.at_level(logging.INFO, logger="xclp.agent"):
        fresh.run(once=True)
        fresh.run(once=True)
    # (this thread's records only: an earlier test's agent thread may still be logging under load)
    lines = [r for r in caplog.records if r.name == "xclp.agent" and r.thread == threading.get_ident()]
    assert [r.levelname for r in lines] == ["INFO"] and "skipping 1 job(s)" in lines[0].getMessage()
    assert old in fresh.not_ours and not fresh.given_up and not fresh.result_path(old).exists()
    new = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=32, k=4, classes=10)
    _until_done(admin, new, [fresh, b])  # a job that begins after it started: it takes part
    assert admin.job(new)["status"] == "done"


def test_one_agent_per_out_folder(tmp_path):
    from clients.agent import AgentError

    class Idle:
        def work(self):
            return {"site": "s", "jobs": [], "done": []}

    np.savez(tmp_path / "d.npz", X=np.random.default_rng(0).random((4, 2)), y=np.array([0, 1, -1, -1]))
    first = Agent(Idle(), "s", tmp_path / "d.npz", tmp_path / "out", trust_on_first_use=True)
    first.run(once=True)
    with pytest.raises(AgentError, match=r"--out .*out is in use by another agent \(pid \d+\)"):
        Agent(Idle(), "s", tmp_path / "d.npz", tmp_path / "out", trust_on_first_use=True).run(once=True)
    Agent(Idle(), "s", tmp_path / "d.npz", tmp_path / "out2", trust_on_first_use=True).run(once=True)  # its own folder: fine


def test_an_idle_agent_backs_off_and_polls_fast_again_once_a_job_appears(tmp_path, monkeypatch):
    """No job: the wait between polls doubles from --poll up to max_poll; a job of the site brings
    it back to --poll."""
    from clients.agent import AgentError

    class Api:
        url = "http://x"
        polls = 0

        def work(self):
            self.polls += 1
            return {"site": "s", "jobs": ["j1"] if 8 <= self.polls < 10 else [], "done": []}

        def job(self, job_id):
            return {"status": "running", "live": ["t"], "kind": "predict"}  # not this site's any more

    sleeps = []

    def sleep(s):
        sleeps.append(round(s, 3))
        if len(sleeps) == 12:
            raise KeyboardInterrupt

    monkeypatch.setattr(agent_mod.time, "sleep", sleep)
    np.savez(tmp_path / "d.npz", X=np.random.default_rng(0).random((4, 2)), y=np.array([0, 1, -1, -1]))
    agent = Agent(Api(), "s", tmp_path / "d.npz", tmp_path / "out", poll=0.1, max_poll=1.0, trust_on_first_use=True)
    with pytest.raises(KeyboardInterrupt):
        agent.run()
    assert sleeps == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.2, 0.4]

    class Refused(Api):
        def work(self):
            from clients.api import ApiError

            raise ApiError(401, "unknown site token")

    with pytest.raises(AgentError, match="refused the token of site 's'"):  # stops at once, never loops
        Agent(Refused(), "s", tmp_path / "d.npz", tmp_path / "out3", trust_on_first_use=True).run()
