"""The operator dashboard over HTTP (service/ui_api.py): login by token into a session cookie, what
the operator and a site may see, and the live JSON the pages draw from — with a real job run by
in-process agents. The same pages in a real browser: test_dashboard_browser.py."""

import hashlib
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from svc import ADMIN, expire_deadline

from clients.agent import Agent
from clients.api import CoordinatorClient
from service.app import Settings, create_app
from service.db import UISession
from xclp.data import load_arrays
from xclp.site_policy import SitePolicy
from xclp.splits import simulate_sites


@pytest.fixture
def rig(tmp_path):
    settings = Settings(database=f"sqlite:///{tmp_path / 'd.db'}", admin_token=ADMIN, engine_interval=0.02)
    with TestClient(create_app(settings)) as tc:
        X, y = load_arrays("digits", limit=240, seed=2)
        ds = simulate_sites(X, y, 3, "iid", 0.2, seed=2)
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)
        agents, tokens = {}, {}
        for s in ds.sites:
            tokens[s] = admin.add_site(s)["token"]
            idx = np.flatnonzero(ds.site == s)
            np.savez(tmp_path / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])
            client = CoordinatorClient("http://testserver", tokens[s], transport=tc._transport)
            agents[s] = Agent(client, s, tmp_path / f"{s}.npz", tmp_path / f"out-{s}",
                              policy=SitePolicy(allow_plaintext=True), trust_on_first_use=True)
        yield tc, ds, admin, agents, tokens


SAME_ORIGIN = {"Origin": "http://testserver"}  # what a browser sends with the login page's own form


def login(tc: TestClient, token: str):
    tc.cookies.clear()
    return tc.post("/ui/login", data={"token": token}, follow_redirects=False, headers=SAME_ORIGIN)


def test_a_login_page_first_and_the_token_only_in_a_post(rig):
    tc, ds, admin, agents, tokens = rig
    tc.cookies.clear()
    r = tc.get("/ui", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert tc.get("/ui/api/jobs").status_code == 401  # the page script's endpoints: 401, not a redirect
    page = tc.get("/ui/login")
    assert page.status_code == 200 and 'method="post"' in page.text and "<script src=\"/ui/static/" in page.text
    bad = login(tc, "not-a-token")
    assert bad.status_code == 401 and "unknown token" in bad.text and "xclp_session" not in bad.headers.get("set-cookie", "")
    assert login(tc, "x" * 10_000).status_code == 413
    ok = login(tc, ADMIN)
    assert ok.status_code == 303 and ok.headers["location"] == "/ui"  # no token in any URL
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie and ADMIN not in cookie
    assert tc.get("/ui").status_code == 200
    assert tc.get("/ui/static/dashboard.js").status_code == 200 and tc.get("/ui/static/style.css").status_code == 200
    # the database holds only the session id's hash, never the cookie itself
    sid = tc.cookies.get("xclp_session")
    with tc.app.state.sessionmaker() as db:
        rows = db.scalars(select(UISession)).all()
    assert [r.who for r in rows] == ["admin"] and rows[0].id_hash == hashlib.sha256(sid.encode()).hexdigest()
    assert all(sid not in (r.id_hash, r.who) for r in rows)
    assert tc.post("/ui/logout", follow_redirects=False, headers=SAME_ORIGIN).status_code == 303
    tc.cookies.set("xclp_session", sid, path="/ui")  # even a kept copy of the cookie
    assert tc.get("/ui/api/jobs").status_code == 401  # the session is gone on the server, not only the cookie


def test_a_dashboard_session_outlives_a_coordinator_restart_and_expires(tmp_path):
    import datetime as dt

    settings = Settings(database=f"sqlite:///{tmp_path / 'r.db'}", admin_token=ADMIN)
    with TestClient(create_app(settings)) as tc:
        assert login(tc, ADMIN).status_code == 303
        sid = tc.cookies.get("xclp_session")
    with TestClient(create_app(settings)) as tc:  # a new coordinator process on the same database
        tc.cookies.set("xclp_session", sid, path="/ui")
        assert tc.get("/ui/api/jobs").status_code == 200
        with tc.app.state.sessionmaker() as db:  # eight hours later
            db.execute(update(UISession).values(expires_at=dt.datetime(2000, 1, 1)))
            db.commit()
        assert tc.get("/ui/api/jobs").status_code == 401
        tc.cookies.set("xclp_session", "x" * 100_000, path="/ui")
        assert tc.get("/ui/api/jobs").status_code == 401  # an absurd cookie: no session, no error
        assert login(tc, ADMIN).status_code == 303  # the next login clears the expired rows
        with tc.app.state.sessionmaker() as db:
            assert db.scalar(select(func.count()).select_from(UISession)) == 1


def test_the_operator_sees_a_job_move_through_its_phases_with_its_bytes_seconds_and_dropouts(rig):
    tc, ds, admin, agents, tokens = rig
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="ot", bits=128, k=6, classes=10)
    login(tc, ADMIN)
    first = tc.get(f"/ui/api/jobs/{job}").json()
    assert first["status"] == "running" and first["phase"] == "setup"
    assert [p["phase"] for p in first["timeline"]] == ["setup", "seed", "counts", "hamming", "row_sums"]
    assert first["timeline"][0]["state"] == "running" and first["timeline"][1]["state"] == "pending"
    gone = ds.sites[-1]  # vanishes inside SecureRowSums: it never sends its masked rows
    send = agents[gone]._send
    agents[gone]._send = lambda j, m: None if m.topic.startswith("rows/") else send(j, m)
    end, expired = time.monotonic() + 120, False
    while admin.job(job)["status"] == "running":
        assert time.monotonic() < end, "the job did not finish"
        st = admin.job(job)
        if not expired and st["phase"] == "row_sums" and st["progress"]["received"] == 2:
            # the others' rows are in; gone's never come. Once: a second expiry could land on the
            # restarted sum (attempt 1) before the engine has seen both of its rows, and drop them.
            expire_deadline(tc.app.state.sessionmaker, job)
            expired = True
        for a in agents.values():
            a.step(job)
    done = tc.get(f"/ui/api/jobs/{job}").json()
    assert done["status"] == "done" and all(p["state"] == "done" for p in done["timeline"])
    assert all(p["seconds"] is not None and p["bytes"] > 0 for p in done["timeline"])
    assert [p["dropped"] for p in done["timeline"]] == [[], [], [], [], [gone]]  # who dropped where
    assert done["bytes_total"] == sum(p["bytes"] for p in done["timeline"])
    # the relayed pair traffic is deleted once the job is done; its bytes still count for the phase
    from sqlalchemy import func, select

    from service.db import Message

    with tc.app.state.sessionmaker() as db:
        end = time.monotonic() + 60
        while db.scalar(select(func.count()).where(Message.job_id == job, Message.topic.startswith("pair/"))):
            assert time.monotonic() < end, "the pair messages were not pruned"
            time.sleep(0.05)
            db.expire_all()
        stored = db.scalar(select(func.sum(Message.size)).where(Message.job_id == job, (Message.topic == "intra")
                                                                | Message.topic.startswith("share/")))
    hamming = tc.get(f"/ui/api/jobs/{job}").json()["timeline"][3]
    assert hamming["phase"] == "hamming" and hamming["bytes"] > 2 * stored
    rows = {r["job"]: r for r in tc.get("/ui/api/jobs").json()["jobs"]}
    assert rows[job]["status"] == "done"
    sites = {r["site"]: r for r in tc.get("/ui/api/sites").json()["sites"]}
    assert set(sites) == set(ds.sites) and all(r["last_contact"] for r in sites.values())
    html = tc.get(f"/ui/jobs/{job}").text
    assert job in html and "XCLP.jobPage" in html


def test_a_site_sees_only_its_own_jobs_and_its_own_page(rig):
    tc, ds, admin, agents, tokens = rig
    a, b, c = ds.sites
    theirs = admin.submit_job(kind="predict", sites=[b, c], crypto="ot", bits=128, classes=10)
    ours = admin.submit_job(kind="predict", sites=[a, b], crypto="ot", bits=128, classes=10)
    assert login(tc, tokens[a]).status_code == 303
    assert [r["job"] for r in tc.get("/ui/api/jobs").json()["jobs"]] == [ours]
    assert [r["site"] for r in tc.get("/ui/api/sites").json()["sites"]] == [a]
    assert tc.get(f"/ui/api/jobs/{ours}").status_code == 200
    assert tc.get(f"/ui/api/jobs/{theirs}").status_code == 403
    page = tc.get(f"/ui/jobs/{theirs}")
    assert page.status_code == 403 and "may not see" in page.text and "<html" in page.text  # a page, not JSON
    assert tc.get(f"/ui/sites/{b}").status_code == 403
    assert tc.get(f"/ui/sites/{a}").status_code == 200
    assert tc.get("/ui/jobs/no-such-job").status_code == 404


def test_a_failed_job_shows_a_sentence_and_a_bar_that_is_not_full(rig):
    tc, ds, admin, agents, tokens = rig
    a, b = ds.sites[:2]
    job = admin.submit_job(kind="predict", sites=[a, b], crypto="ot", bits=128, k=6, classes=10)
    end = time.monotonic() + 60
    while admin.job(job)["progress"]["received"] < 1:  # a announces; b never comes
        assert time.monotonic() < end, "a's announce did not arrive"
        agents[a].step(job)
    expire_deadline(tc.app.state.sessionmaker, job)
    while admin.job(job)["status"] == "running":
        assert time.monotonic() < end, "the job did not fail"
        time.sleep(0.05)
    assert "{" in admin.job(job)["failure"]  # the engine's reason, for the log: "… (dropped: {'site1': 'setup'})"
    login(tc, ADMIN)
    got = tc.get(f"/ui/api/jobs/{job}").json()
    assert got["status"] == "failed"
    # a sentence: no Python dict or list, a capital, a full stop, who dropped where in words
    assert got["failure"] == f"Fewer than two sites left after setup (dropped: {b} (in setup))."
    # the bar shows what was completed, in the failed state: here nothing (it failed in its first phase)
    assert got["bar"] == {"fraction": 0.0, "state": "failed"}
    html = tc.get(f"/ui/jobs/{job}").text
    assert got["failure"] in html and 'data-state="failed"' in html and "width: 100" not in html


def test_failure_sentences_and_the_rounds_table_rows():
    from service.db import Job
    from service.ui_api import _curves, failure_sentence, progress_bar

    def sentence(text, dropped=None):
        return failure_sentence(Job(failure=text, dropped=dropped or {}))

    assert sentence("hamming: ProtocolError: site1: the shares do not combine") == \
        "In phase hamming: site1: the shares do not combine."
    assert sentence("fewer than two sites left in row_sums: ['a', 'b'] missed the deadline") == \
        "Fewer than two sites left in row_sums: a, b missed the deadline."
    assert sentence("cancelled by the operator") == "Cancelled by the operator."
    assert sentence("") is None
    assert progress_bar(Job(status="failed", kind="predict", phase="row_sums"), {"fraction": 1.0}) == \
        {"fraction": 0.8, "state": "failed"}  # four of five phases completed; the fifth never did
    assert progress_bar(Job(status="failed", kind="train", phase="evaluate"),
                        {"rounds": 3, "rounds_done": 3, "received": 3, "expected": 3, "fraction": 1.0})["fraction"] < 1
    rows = _curves([{"round": 1, "local_accuracy": 0.5, "local_accuracy_of": "accuracy on unlabelled points (truth column)",
                     "left_out": ["site2", "site0"]}, {"round": 2, "left_out": []}])
    assert [(r["left_out"], r["left_out_sites"]) for r in rows] == [(2, ["site0", "site2"]), (0, [])]
    assert rows[0]["local_accuracy_of"] == "accuracy on unlabelled points (truth column)"


def test_a_revoked_site_is_marked_in_the_sites_list_its_jobs_and_its_page(rig):
    tc, ds, admin, agents, tokens = rig
    a, b, c = ds.sites
    job = admin.submit_job(kind="predict", sites=[a, b, c], crypto="plaintext", bits=64, k=5, classes=10)
    other = admin.submit_job(kind="predict", sites=[a, b], crypto="plaintext", bits=64, k=5, classes=10)
    revoked_at = admin.revoke_site(c)["revoked_at"]
    assert login(tc, ADMIN).status_code == 303
    sites = {r["site"]: r for r in tc.get("/ui/api/sites").json()["sites"]}
    assert sites[c]["revoked_at"] == revoked_at and sites[a]["revoked_at"] is None
    rows = {r["job"]: r for r in tc.get("/ui/api/jobs").json()["jobs"]}
    assert rows[job]["revoked"] == {c: revoked_at} and rows[other]["revoked"] == {}
    detail = tc.get(f"/ui/api/jobs/{job}").json()
    assert detail["revoked"] == {c: revoked_at} and "revoked by the operator" in detail["refused"][c]
    page = tc.get(f"/ui/sites/{c}").text
    assert 'id="revoked"' in page and f"revoked by the operator at {revoked_at}" in page
    assert 'data-status="revoked" data-site="' + c + '"' in tc.get(f"/ui/jobs/{job}").text
    assert 'id="revoked"' not in tc.get(f"/ui/sites/{a}").text


def test_the_operator_cancels_a_running_job_from_its_page_and_a_site_may_not(rig):
    tc, ds, admin, agents, tokens = rig
    a, b, _ = ds.sites
    job = admin.submit_job(kind="predict", sites=[a, b], crypto="plaintext", bits=64, k=5, classes=10)
    assert login(tc, tokens[a]).status_code == 303
    assert 'id="cancel"' not in tc.get(f"/ui/jobs/{job}").text  # a site's page has no button ...
    assert tc.post(f"/ui/jobs/{job}/cancel", headers=SAME_ORIGIN, follow_redirects=False).status_code == 403  # nor right
    assert login(tc, ADMIN).status_code == 303
    assert 'id="cancel"' in tc.get(f"/ui/jobs/{job}").text
    # a cross-site form cannot press it (service.guard: a POST's Origin must be the dashboard's)
    assert tc.post(f"/ui/jobs/{job}/cancel", headers={"Origin": "https://evil.example"},
                   follow_redirects=False).status_code == 403
    assert admin.job(job)["status"] == "running"
    r = tc.post(f"/ui/jobs/{job}/cancel", headers=SAME_ORIGIN, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/ui/jobs/{job}"
    detail = tc.get(f"/ui/api/jobs/{job}").json()
    assert detail["status"] == "cancelled" and detail["failure"] == "Cancelled by the operator."
    assert 'id="cancel-form" hidden' in tc.get(f"/ui/jobs/{job}").text
    assert tc.post(f"/ui/jobs/{job}/cancel", headers=SAME_ORIGIN, follow_redirects=False).status_code == 409
