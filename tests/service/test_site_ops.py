"""The operator takes a site out of service (`POST /sites/{name}/revoke`, `xclp site revoke`) or gives
it a new token (`POST /sites/{name}/token`, `xclp site rotate-token`); an idle site's agent waits
on the coordinator for work (`GET /work?wait=`) instead of asking again and again."""

import json
import stat
import threading
import time

import numpy as np
import pytest
from svc import ADMIN, add, admin_headers

from service.app import Settings, create_app

FINGERPRINT = "SHA256:" + "A" * 43


def _wait_for(client, job, pred, what, timeout=60):
    end = time.monotonic() + timeout
    while not pred(st := client.get(f"/jobs/{job}", headers=admin_headers()).json()):
        assert time.monotonic() < end, f"timed out waiting for {what}: {st}"
        time.sleep(0.02)
    return st


def test_a_revoked_site_is_refused_dropped_from_its_running_jobs_and_kept_out_of_new_ones(app_client):
    heads = {s: add(app_client, s) for s in ("a", "b", "c")}
    job = app_client.post("/jobs", json={"sites": ["a", "b", "c"], "crypto": "plaintext", "classes": 2},
                          headers=admin_headers()).json()["job"]
    assert app_client.get("/work", headers=heads["a"]).json()["jobs"] == [job]
    assert app_client.post("/sites/a/revoke", headers=heads["b"]).status_code == 403  # the operator's call

    r = app_client.post("/sites/a/revoke", headers=admin_headers())
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["site"] == "a" and out["jobs"] == [job] and out["revoked_at"].endswith("Z")
    # its token stops working at once, saying so
    for path in ("/work", f"/jobs/{job}"):
        r = app_client.get(path, headers=heads["a"])
        assert r.status_code == 401 and r.json()["detail"] == (f"site 'a' was revoked by the operator at "
                                                                f"{out['revoked_at']}: its token no longer works")
    # its running job drops it at once, by the rules of a refusal, and goes on with the others
    st = _wait_for(app_client, job, lambda s: "a" not in s["live"], "the job to drop a")
    assert st["status"] == "running" and st["live"] == ["b", "c"] and st["dropped"] == {"a": "setup"}
    assert st["refused"]["a"] == f"revoked by the operator at {out['revoked_at']}"
    # no new job may name it (either kind)
    for path, body in (("/jobs", {"crypto": "plaintext", "classes": 2}),
                       ("/jobs/train", {"algorithm": "fedavg", "classes": 2, "crypto": "plaintext"})):
        r = app_client.post(path, json={"sites": ["b", "a"], **body}, headers=admin_headers())
        assert r.status_code == 409 and r.json()["detail"] == ("revoked site(s) cannot take part in a new job: "
                                                               f"a (revoked at {out['revoked_at']})"), r.text
    # once only; no new token for it; `site list` says so
    r = app_client.post("/sites/a/revoke", headers=admin_headers())
    assert r.status_code == 409 and "was revoked at" in r.json()["detail"]
    assert app_client.post("/sites/a/token", headers=admin_headers()).status_code == 409
    assert app_client.post("/sites/nobody/revoke", headers=admin_headers()).status_code == 404
    sites = app_client.get("/sites", headers=admin_headers()).json()
    assert sites["sites"] == ["a", "b", "c"] and sites["revoked"] == {"a": out["revoked_at"]}
    # a site's dashboard login with the revoked token fails as an unknown token
    r = app_client.post("/ui/login", content=f"token={heads['a']['Authorization'][7:]}",
                        headers={"Content-Type": "application/x-www-form-urlencoded",
                                 "Origin": str(app_client.base_url)}, follow_redirects=False)
    assert r.status_code == 401


def test_a_site_revoked_from_a_two_site_job_fails_it_with_the_reason(app_client):
    for s in ("a", "b"):
        add(app_client, s)
    job = app_client.post("/jobs", json={"sites": ["a", "b"], "crypto": "plaintext", "classes": 2},
                          headers=admin_headers()).json()["job"]
    assert app_client.post("/sites/b/revoke", headers=admin_headers()).json()["jobs"] == [job]
    st = _wait_for(app_client, job, lambda s: s["status"] != "running", "the job to end")
    assert st["status"] == "failed" and "b: revoked by the operator at" in st["failure"], st


def test_a_training_job_drops_a_revoked_site_at_once(app_client):
    for s in ("a", "b", "c"):
        add(app_client, s)
    r = app_client.post("/jobs/train", json={"algorithm": "fedavg", "sites": ["a", "b", "c"], "classes": 2,
                                             "crypto": "plaintext", "secure_aggregation": False},
                        headers=admin_headers())
    assert r.status_code == 201, r.text
    job = r.json()["job"]
    assert app_client.post("/sites/c/revoke", headers=admin_headers()).json()["jobs"] == [job]
    st = _wait_for(app_client, job, lambda s: "c" not in s["live"], "the job to drop c")
    assert st["status"] == "running" and st["live"] == ["a", "b"] and st["refused"]["c"].startswith("revoked by")


def test_a_rotated_token_replaces_the_old_one_and_the_site_keeps_its_identity_and_jobs(app_client):
    r = app_client.post("/sites", json={"name": "a", "fingerprint": FINGERPRINT}, headers=admin_headers())
    old = {"Authorization": f"Bearer {r.json()['token']}"}
    add(app_client, "b")
    job = app_client.post("/jobs", json={"sites": ["a", "b"], "crypto": "plaintext", "classes": 2},
                          headers=admin_headers()).json()["job"]
    r = app_client.post("/sites/a/token", headers=admin_headers())
    assert r.status_code == 200 and r.json()["site"] == "a"
    new = {"Authorization": f"Bearer {r.json()['token']}"}
    r = app_client.get("/work", headers=old)
    assert r.status_code == 401 and r.json()["detail"] == "unknown site token"
    assert app_client.get("/work", headers=new).json() == {"site": "a", "jobs": [job], "done": []}
    assert app_client.get(f"/jobs/{job}", headers=new).json()["live"] == ["a", "b"]
    assert app_client.get("/sites", headers=admin_headers()).json()["fingerprints"] == {"a": FINGERPRINT}
    assert app_client.post("/sites/nobody/token", headers=admin_headers()).status_code == 404


def test_the_cli_revokes_rotates_and_lists_revoked_sites(app_client, tmp_path, capsys, monkeypatch):
    """`xclp site revoke|rotate-token|list` (the operator's client, here on the app in process)."""
    import clients.api
    from cli.main import main

    transport = app_client._transport
    real = clients.api.CoordinatorClient.__init__
    monkeypatch.setattr(clients.api.CoordinatorClient, "__init__",
                        lambda self, url, token, **kw: real(self, url, token, **{**kw, "transport": transport}))
    url = ["--coordinator", "http://testserver", f"--admin-token={ADMIN}"]
    for s in ("a", "b"):
        add(app_client, s)
    path = tmp_path / "b.token"
    assert main(["site", "rotate-token", "b", *url, "--token-file", str(path)]) == 0
    token = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and token not in capsys.readouterr().out
    assert app_client.get("/work", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert main(["site", "rotate-token", "b", *url, "--token-file", str(path)]) == 2  # a new file only
    assert "exists" in capsys.readouterr().err
    assert main(["site", "rotate-token", "b", *url, "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"site", "token"}

    assert main(["site", "revoke", "a", *url]) == 0
    assert "site a revoked at" in capsys.readouterr().out
    assert main(["site", "revoke", "a", *url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was revoked at" in err[0], err
    assert main(["site", "rotate-token", "nobody", *url]) == 2
    assert "unknown site 'nobody'" in capsys.readouterr().err
    assert main(["site", "list", *url]) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows == {"a": "revoked", "b": "active"}


def test_a_database_of_the_previous_revision_with_a_site_is_migrated(tmp_path):
    """0003 -> 0004 (sites.revoked_at): the site is kept, in service, and its token still works."""
    from alembic import command
    from fastapi.testclient import TestClient
    from sqlalchemy import inspect, text

    from service.db import make_engine
    from service.deps import hash_token
    from service.migrate import _config, head, schema_state

    db = f"sqlite:///{tmp_path / 'previous.db'}"
    engine = make_engine(db)
    with engine.begin() as conn:
        cfg = _config(db)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0003_site_fingerprint")
        conn.execute(text("INSERT INTO sites (name, token_hash, created_at, fingerprint) VALUES "
                          "('hospital', :h, '2026-11-01 10:00:00', :f)"), {"h": hash_token("old-token"), "f": FINGERPRINT})
    assert schema_state(engine).current == "0003_site_fingerprint"
    assert "revoked_at" not in {c["name"] for c in inspect(engine).get_columns("sites")}
    engine.dispose()

    with TestClient(create_app(Settings(database=db, admin_token=ADMIN))) as client:  # migrates at start
        r = client.get("/work", headers={"Authorization": "Bearer old-token"})
        assert r.status_code == 200 and r.json()["site"] == "hospital"
        sites = client.get("/sites", headers=admin_headers()).json()
        assert sites["revoked"] == {} and sites["fingerprints"] == {"hospital": FINGERPRINT}
        assert client.post("/sites/hospital/revoke", headers=admin_headers()).status_code == 200
        assert client.get("/work", headers={"Authorization": "Bearer old-token"}).status_code == 401
    engine = make_engine(db)
    assert schema_state(engine).current == head()  # (0004_site_revoked, and every revision after it)
    engine.dispose()


# --- the long poll for work ------------------------------------------------------------------------


@pytest.fixture
def live(tmp_path):
    """The coordinator over real HTTP on 127.0.0.1 (uvicorn in a thread): the long polls are concurrent
    requests, as the agents make them."""
    import uvicorn

    from cli.demo import free_port
    from clients.api import CoordinatorClient

    settings = Settings(database=f"sqlite:///{tmp_path / 'live.db'}", admin_token=ADMIN, engine_interval=0.05,
                        max_waits_per_site=1)
    port = free_port()
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < end and thread.is_alive(), "the coordinator did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, CoordinatorClient(url, ADMIN), app
    finally:
        server.should_exit = True
        thread.join(30)


def test_a_long_poll_for_work_waits_answers_when_a_job_comes_and_is_capped_per_site(live):
    import httpx

    from clients.api import CoordinatorClient

    url, admin, app = live
    tokens = {s: admin.add_site(s)["token"] for s in ("a", "b")}
    a = CoordinatorClient(url, tokens["a"])
    # a client that goes away ends its wait (a stopped agent holds nothing, nor delays a shutdown)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{url}/work", params={"wait": 10}, headers={"Authorization": f"Bearer {tokens['a']}"}, timeout=0.5)
    end = time.monotonic() + 3
    # 0, not merely falsy: the key appears when the coordinator takes the wait up (a loaded machine may not
    # have yet when the client gives up) and drops back to 0 when that wait ends
    while app.state.work_waits.get("a") != 0:
        assert time.monotonic() < end, "the wait went on after its client left"
        time.sleep(0.02)
    t = time.monotonic()
    assert a.wait_for_work(0.6) == {"site": "a", "jobs": [], "done": [], "held": True}
    assert time.monotonic() - t >= 0.5
    assert a.work() == {"site": "a", "jobs": [], "done": []}  # no wait asked: at once, as before

    got = {}

    def poll():
        got["answer"] = a.wait_for_work(10)
        got["at"] = time.monotonic()

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.5)
    t = time.monotonic()
    assert a.wait_for_work(5)["held"] is False  # this site's one waiting poll (the test's cap) is taken
    assert time.monotonic() - t < 2
    job = admin.submit_job(kind="predict", sites=["a", "b"], crypto="plaintext", classes=2)
    submitted = time.monotonic()
    waiter.join(15)
    assert got["answer"]["jobs"] == [job] and got["answer"]["held"] is True
    assert got["at"] - submitted < 1.0, got["at"] - submitted
    t = time.monotonic()
    assert a.wait_for_work(10) == {"site": "a", "jobs": [job], "done": [], "held": False}  # work now: at once
    assert time.monotonic() - t < 2


def test_an_idle_agent_waits_on_the_coordinator_and_takes_a_new_job_within_a_second(live, tmp_path):
    from clients.agent import Agent
    from clients.api import CoordinatorClient
    from xclp.site_policy import SitePolicy

    url, admin, _ = live
    tokens = {s: admin.add_site(s)["token"] for s in ("a", "b")}
    calls: list[tuple[float, str]] = []
    stop = threading.Event()

    class Counting:
        def __init__(self, api):
            self.api = api

        def __getattr__(self, name):
            fn = getattr(self.api, name)

            def call(*a, **kw):
                if stop.is_set():
                    raise KeyboardInterrupt
                calls.append((time.monotonic(), name))
                return fn(*a, **kw)

            return call

    np.savez(tmp_path / "a.npz", X=np.random.default_rng(0).random((8, 3)), y=np.array([0, 1, -1, -1, 0, 1, -1, -1]))
    agent = Agent(Counting(CoordinatorClient(url, tokens["a"])), "a", tmp_path / "a.npz", tmp_path / "out-a",
                  poll=0.1, policy=SitePolicy(allow_plaintext=True), trust_on_first_use=True)
    errors = []

    def run():
        try:
            agent.run()
        except KeyboardInterrupt:
            pass
        except BaseException as exc:  # noqa: BLE001 — reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(4)
    idle = [n for _, n in calls]
    # Polling every 0.1 s would be ~40 requests, the backoff alone ~8: the first /work, then one held poll.
    assert idle and set(idle) <= {"work", "wait_for_work"} and len(idle) <= 3, idle
    job = admin.submit_job(kind="predict", sites=["a", "b"], crypto="plaintext", classes=2)
    submitted = time.monotonic()
    end = submitted + 10
    while not any(n == "job" and t > submitted for t, n in calls):  # it asks for the job's status
        assert time.monotonic() < end and not errors, (calls, errors)
        time.sleep(0.02)
    taken = min(t for t, n in calls if n == "job" and t > submitted) - submitted
    assert taken < 1.0, taken
    stop.set()
    admin.cancel(job)
    thread.join(15)
    assert not thread.is_alive() and not errors, errors


def test_an_agent_restarted_with_a_rotated_token_finishes_its_job_and_a_revoked_site_s_agent_stops(tmp_path):
    """Rotation keeps the site's jobs: its agent, stopped by the old token's 401, is restarted on the
    same --out with the new token and the job finishes with no site dropped. Revocation stops an
    agent with one line that says so."""
    import os

    from fastapi.testclient import TestClient

    from clients.agent import Agent, AgentError
    from clients.api import CoordinatorClient
    from xclp.data import load_arrays
    from xclp.site_policy import SitePolicy
    from xclp.splits import simulate_sites

    settings = Settings(database=f"sqlite:///{tmp_path / 'r.db'}", admin_token=ADMIN, engine_interval=0.02)
    with TestClient(create_app(settings)) as tc:
        X, y = load_arrays("digits", limit=120, seed=3)
        ds = simulate_sites(X, y, 2, "iid", 0.2, seed=3)
        a_name, b_name = ds.sites
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)

        def agent(site, token):
            idx = np.flatnonzero(ds.site == site)
            np.savez(tmp_path / f"{site}.npz", X=ds.X[idx], y=ds.y[idx])
            return Agent(CoordinatorClient("http://testserver", token, transport=tc._transport), site,
                         tmp_path / f"{site}.npz", tmp_path / f"out-{site}", policy=SitePolicy(allow_plaintext=True), trust_on_first_use=True)

        a, b = agent(a_name, admin.add_site(a_name)["token"]), agent(b_name, admin.add_site(b_name)["token"])
        job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=32, k=4, classes=10)
        for _ in range(200):  # into the job, past its setup
            for ag in (a, b):
                ag.run(once=True)
            if admin.job(job)["phase"] != "setup":
                break
            time.sleep(0.01)
        else:
            raise AssertionError(admin.job(job))
        new = admin.rotate_token(a_name)["token"]
        with pytest.raises(AgentError, match="refused the token of site"):
            a.run(once=True)
        os.close(a._lock_fd)  # (the old agent's process has ended)
        a = agent(a_name, new)
        for _ in range(600):
            for ag in (a, b):
                ag.run(once=True)
            if all(ag.result_path(job).exists() for ag in (a, b)):
                break
            time.sleep(0.01)
        st = admin.job(job)
        assert st["status"] == "done" and st["dropped"] == {}, st

        admin.revoke_site(b_name)
        with pytest.raises(AgentError, match=f"refused site '{b_name}': site '{b_name}' was revoked by the operator"):
            b.run(once=True)


def test_a_new_site_token_never_starts_with_a_dash(monkeypatch):
    # a token "-…" given as `--token -…` is an option to argparse: the agent refused its own command line
    # (seen as a flaky CLI test, 1 run in 64)
    import secrets as secrets_module

    from service.sites_api import new_token

    drawn = iter(["-first", "-second", "ok-third"])
    monkeypatch.setattr(secrets_module, "token_urlsafe", lambda n: next(drawn))
    assert new_token() == "ok-third"
