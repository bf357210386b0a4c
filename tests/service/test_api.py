"""Every endpoint refuses bad input with a clear 4xx, stores nothing and loses nothing."""

import numpy as np
from svc import ADMIN, add, admin_headers, announce_all, message_count

from crypto.keys import SiteKeyPair
from xclp.announce import encode_announce
from xclp.wire import dump_array


def test_health_metrics_and_docs(app_client):
    assert app_client.get("/health").json() == {"status": "ok"}
    assert app_client.get("/metrics").status_code == 401  # the admin token, unless --public-metrics
    assert app_client.get("/metrics", headers=add(app_client, "s")).status_code == 403  # a site's is not enough
    m = app_client.get("/metrics", headers=admin_headers())
    assert m.status_code == 200 and "xclp_requests_total" in m.text and 'xclp_jobs{status="running"}' in m.text
    assert "/jobs/{job_id}/messages/{topic}" in app_client.get("/openapi.json").json()["paths"]
    assert app_client.get("/docs").status_code == 200


def test_tokens(app_client):
    assert app_client.post("/sites", json={"name": "a"}).status_code == 401
    assert app_client.post("/sites", json={"name": "a"}, headers={"Authorization": "Bearer wrong"}).status_code == 403
    h = add(app_client, "a")
    assert app_client.post("/sites", json={"name": "b"}, headers=h).status_code == 403  # a site is no admin
    assert app_client.get("/work", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert app_client.get("/work", headers=h).json() == {"site": "a", "jobs": [], "done": []}  # whose token it is
    assert app_client.post("/sites", json={"name": "a"}, headers=admin_headers()).status_code == 409
    for bad in ("", "coordinator", "a b", "x" * 65, "../etc"):
        r = app_client.post("/sites", json={"name": bad}, headers=admin_headers())
        assert r.status_code == 422, bad


def test_token_is_stored_hashed(app_client):
    from sqlalchemy import select

    from service.db import Site

    r = app_client.post("/sites", json={"name": "h"}, headers=admin_headers())
    token = r.json()["token"]
    with app_client.app.state.sessionmaker() as db:
        stored = db.scalar(select(Site.token_hash).where(Site.name == "h"))
    assert token not in stored and len(stored) == 64


def test_job_submission_errors(app_client):
    add(app_client, "a")
    add(app_client, "b")
    post = lambda body: app_client.post("/jobs", json={"classes": 2, **body}, headers=admin_headers())  # noqa: E731
    assert app_client.post("/jobs", json={"sites": ["a", "b"]}, headers=admin_headers()).status_code == 422  # no classes
    assert post({"sites": ["a", "zzz"]}).status_code == 404
    assert "zzz" in post({"sites": ["a", "zzz"]}).json()["detail"]
    assert post({"sites": ["a"]}).status_code == 422
    assert post({"sites": ["a", "a"]}).status_code == 422
    assert post({"sites": ["a", "b"], "crypto": "rot13"}).status_code == 422
    assert post({"sites": ["a", "b"], "alpha": 1.5}).status_code == 422
    assert post({"sites": ["a", "b"], "kind": "train"}).status_code == 422
    assert post({"sites": ["a", "b"], "deadlines": {"lunch": 5}}).status_code == 422
    assert app_client.get("/jobs", headers=admin_headers()).json() == {"jobs": []}  # nothing stored
    assert app_client.get("/jobs/nope", headers=admin_headers()).status_code == 404


def test_messages_are_checked_before_storing(app_client):
    ha, hb = add(app_client, "a"), add(app_client, "b")
    hc = add(app_client, "c")
    job = app_client.post("/jobs", json={"sites": ["a", "b"], "crypto": "plaintext", "classes": 3},
                          headers=admin_headers()).json()["job"]
    url = f"/jobs/{job}/messages"
    good = encode_announce("a", SiteKeyPair.generate().public_bytes(), 5, np.array([0, 2]), bytes(32))
    # who: a site outside the job, a missing token, an unknown job
    assert app_client.put(f"{url}/announce", content=good, headers=hc).status_code == 403
    assert app_client.put(f"{url}/announce", content=good).status_code == 401
    assert app_client.put("/jobs/nope/messages/announce", content=good, headers=ha).status_code == 404
    # what: malformed, misnamed, wrong phase, unknown topic, wrong recipient, oversized
    assert app_client.put(f"{url}/announce", content=b"garbage", headers=ha).status_code == 422
    assert app_client.put(f"{url}/announce", content=good, headers=hb).status_code == 422  # names a, sent by b
    assert app_client.put(f"{url}/counts/0", content=dump_array(np.zeros(3, np.uint64)), headers=ha).status_code == 409
    assert app_client.put(f"{url}/selfie", content=b"x", headers=ha).status_code == 422
    assert app_client.put(f"{url}/announce?to=b", content=good, headers=ha).status_code == 422
    big = app_client.put(f"{url}/announce", content=b"x" * ((1 << 20) + 1), headers=ha)
    assert big.status_code == 413 and "limit" in big.json()["detail"]
    assert message_count(app_client) == 0
    # a good upload is stored once; an identical replay stores nothing; a different one is refused
    assert app_client.put(f"{url}/announce", content=good, headers=ha).json()["stored"] is True
    assert app_client.put(f"{url}/announce", content=good, headers=ha).json()["stored"] is False
    other = encode_announce("a", SiteKeyPair.generate().public_bytes(), 5, np.array([0, 2]), bytes(32))
    assert app_client.put(f"{url}/announce", content=other, headers=ha).status_code == 409
    assert message_count(app_client) == 1
    # reading: only what is addressed to the caller
    assert app_client.get(f"{url}/roster", headers=ha).status_code == 404  # not yet
    assert app_client.get(f"{url}/roster", headers=hc).status_code == 403
    assert app_client.get(f"/jobs/{job}", headers=hc).status_code == 403
    assert app_client.get(f"/jobs/{job}", headers=ha).json()["phase"] == "setup"


def test_a_site_reads_only_its_own_messages(app_client):
    ha, hb = add(app_client, "a"), add(app_client, "b")
    hc = add(app_client, "c")
    job = app_client.post("/jobs", json={"sites": ["a", "b", "c"], "crypto": "plaintext", "classes": 2},
                          headers=admin_headers()).json()["job"]
    url = f"/jobs/{job}/messages"
    announce_all(app_client, job, {"a": ha, "b": hb, "c": hc})
    assert app_client.put(f"{url}/seed?to=b", content=b"sealed-for-b", headers=ha).status_code == 200
    assert app_client.put(f"{url}/seed?to=a", content=b"x", headers=ha).status_code == 422  # not to itself
    assert app_client.put(f"{url}/seed?to=zz", content=b"x", headers=ha).status_code == 422
    assert app_client.get(f"{url}/seed?sender=a", headers=hb).content == b"sealed-for-b"
    assert app_client.get(f"{url}/seed?sender=a", headers=hc).status_code == 404  # addressed to b only
    assert app_client.get(f"{url}/roster", headers=hc).status_code == 200


def test_who_may_send_is_settled_before_the_body_is_read_and_each_topic_has_its_limit(app_client):
    """Issue 13, fault 4: a site outside the job, or a topic of another phase, is refused before its
    body counts (not a 413 after reading it); a topic's body is bounded by what it can hold (a seed
    contribution: 4 KiB, not the service's 1 MiB); a pair protocol's messages are bounded in number."""

    from crypto.hamming_api import MAX_PAIR_MESSAGES

    ha, hb = add(app_client, "a"), add(app_client, "b")
    outsider = add(app_client, "c")
    job = app_client.post("/jobs", json={"sites": ["a", "b"], "crypto": "plaintext", "classes": 2},
                          headers=admin_headers()).json()["job"]
    url = f"/jobs/{job}/messages"
    huge = b"x" * ((1 << 20) + 1)  # over the service's limit
    assert app_client.put(f"{url}/announce", content=huge, headers=outsider).status_code == 403
    assert app_client.put("/jobs/nope/messages/announce", content=huge, headers=ha).status_code == 404
    assert app_client.put(f"{url}/seed?to=b", content=huge, headers=ha).status_code == 409  # not the phase yet
    announce_all(app_client, job, {"a": ha, "b": hb})
    before = message_count(app_client)
    r = app_client.put(f"{url}/seed?to=b", content=b"x" * 5000, headers=ha)
    assert r.status_code == 413 and "limit of 4096" in r.json()["detail"]
    assert message_count(app_client) == before
    assert app_client.put(f"{url}/seed?to=b", content=b"x" * 100, headers=ha).status_code == 200
    # pair messages: numbered below the bound, checked before the phase's other rules
    r = app_client.put(f"{url}/pair/a/b/{MAX_PAIR_MESSAGES}?to=b", content=b"x", headers=ha)
    assert r.status_code in (409, 422)
    assert app_client.put(f"{url}/pair/a/b/{MAX_PAIR_MESSAGES}?to=b", content=huge, headers=ha).status_code != 413


def test_admin_token_must_be_long_enough(tmp_path):
    import pytest

    from service.app import Settings, create_app

    for short in ("short", "x" * 31):
        with pytest.raises(ValueError, match="at least 32 characters"):
            create_app(Settings(database=f"sqlite:///{tmp_path / 'x.db'}", admin_token=short))
    assert len(ADMIN) >= 32
    create_app(Settings(database=f"sqlite:///{tmp_path / 'x.db'}", admin_token="x" * 32))


def test_metrics_open_to_anyone_only_when_asked(tmp_path):
    from fastapi.testclient import TestClient

    from service.app import Settings, create_app

    with TestClient(create_app(Settings(database=f"sqlite:///{tmp_path / 'm.db'}", admin_token=ADMIN,
                                        public_metrics=True))) as c:
        assert c.get("/metrics").status_code == 200


def test_tokens_that_start_with_a_dash_reach_the_agent_intact(monkeypatch, tmp_path):
    # secrets.token_urlsafe starts with '-' about once in 64 draws. The launchers pass tokens in the
    # environment (a token on the command line is visible in ps); --token=VALUE still parses.
    import inspect

    import cli.demo as demo
    from cli.main import _secret, build_parser

    argv = ["agent", "run", "--coordinator", "http://x", "--site", "s", "--data", "d.npz", "--out", "o"]
    assert _secret(build_parser().parse_args([*argv, "--token=-abc"]), "token", "XCLP_TOKEN") == "-abc"
    monkeypatch.setenv("XCLP_TOKEN", "-from-env")
    assert _secret(build_parser().parse_args(argv), "token", "XCLP_TOKEN") == "-from-env"
    (tmp_path / "t").write_text("-from-file\n")
    args = build_parser().parse_args([*argv, "--token-file", str(tmp_path / "t")])
    assert _secret(args, "token", "XCLP_TOKEN") == "-from-file"
    assert "--token" not in inspect.getsource(demo.start_agent)
    assert "--admin-token" not in inspect.getsource(demo.start_coordinator)


def test_bad_distances_are_refused_at_upload_not_later(app_client):
    import time

    from xclp.wire import dump_array

    ha, hb = add(app_client, "p"), add(app_client, "q")
    # raw features: the hand-made counts below are the class counts alone (no standardisation limbs)
    job = app_client.post("/jobs", json={"sites": ["p", "q"], "crypto": "plaintext", "classes": 2, "bits": 8,
                                         "standardize": False}, headers=admin_headers()).json()["job"]
    url = f"/jobs/{job}/messages"
    # drive the job to the Hamming phase by hand: announce, seed, counts
    for name, h in (("p", ha), ("q", hb)):
        body = encode_announce(name, SiteKeyPair.generate().public_bytes(), 3, np.array([0]), bytes(32))
        assert app_client.put(f"{url}/announce", content=body, headers=h).status_code == 200

    def wait(phase):
        for _ in range(200):
            if app_client.get(f"/jobs/{job}", headers=ha).json()["phase"] == phase:
                return
            time.sleep(0.02)
        raise AssertionError(phase)

    wait("seed")
    app_client.put(f"{url}/seed?to=q", content=b"x", headers=ha)
    app_client.put(f"{url}/seed?to=p", content=b"x", headers=hb)
    wait("counts")
    for h in (ha, hb):
        app_client.put(f"{url}/counts/0", content=dump_array(np.zeros(2, np.uint64)), headers=h)
    wait("hamming")
    asym = np.array([[0, 1, 2], [3, 0, 1], [2, 1, 0]], dtype=np.uint16)
    too_far = np.array([[0, 9, 2], [9, 0, 1], [2, 1, 0]], dtype=np.uint16)  # 9 > L = 8
    for bad, why in ((asym, "symmetric"), (too_far, "exceeds")):
        r = app_client.put(f"{url}/intra", content=dump_array(bad), headers=ha)
        assert r.status_code == 422 and why in r.json()["detail"]
    assert app_client.get(f"/jobs/{job}", headers=ha).json()["status"] == "running"


def test_a_low_order_public_key_is_refused_at_announce(app_client):
    ha = add(app_client, "lo")
    add(app_client, "hi")
    job = app_client.post("/jobs", json={"sites": ["lo", "hi"], "crypto": "plaintext", "classes": 2},
                          headers=admin_headers()).json()["job"]
    body = encode_announce("lo", bytes(32), 3, np.array([0]), bytes(32))  # the all-zero point has order 1
    r = app_client.put(f"/jobs/{job}/messages/announce", content=body, headers=ha)
    assert r.status_code == 422 and "low order" in r.json()["detail"]
    assert message_count(app_client) == 0


def test_long_polls_wait_off_the_worker_threads_and_are_bounded_per_site(app_client):
    """Issue 13, fault 5: 48 long polls from one site used to hold the worker threads, and /health
    waited behind them. Now a site's waiting polls are bounded (max_waits_per_site; the rest are
    answered at once), they wait on the event loop, /health answers while they wait, and they
    return the message as soon as it arrives."""
    import threading
    import time


    ha, hb = add(app_client, "a"), add(app_client, "b")
    job = app_client.post("/jobs", json={"sites": ["a", "b"], "crypto": "plaintext", "classes": 2},
                          headers=admin_headers()).json()["job"]
    url = f"/jobs/{job}/messages"
    limit = app_client.app.state.settings.max_waits_per_site
    results: list[int] = []
    lock = threading.Lock()

    def poll():
        r = app_client.get(f"{url}/roster?wait=10", headers=ha)
        with lock:
            results.append(r.status_code)

    threads = [threading.Thread(target=poll) for _ in range(48)]
    for t in threads:
        t.start()

    def waiting():
        text = app_client.get("/metrics", headers=admin_headers()).text
        return int(float(next(line.split()[-1] for line in text.splitlines()
                              if line.startswith("xclp_long_polls_waiting "))))

    end = time.monotonic() + 60
    while not (waiting() == limit and len(results) == 48 - limit):
        assert time.monotonic() < end, (waiting(), results)
        time.sleep(0.02)
    assert results == [404] * (48 - limit)  # beyond the bound: answered at once, "not yet"
    assert app_client.get("/health").status_code == 200
    assert len(results) == 48 - limit  # /health answered while the bounded polls still wait
    for name, h in (("a", ha), ("b", hb)):  # the roster appears: the waiting polls get it
        body = encode_announce(name, SiteKeyPair.generate().public_bytes(), 4, np.array([0]), bytes(32))
        assert app_client.put(f"{url}/announce", content=body, headers=h).status_code == 200
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [200] * limit + [404] * (48 - limit)
    assert waiting() == 0
