"""service/guard.py in process: each route's body limit, declared and streamed; the operator's calls
authorised before their body is parsed; the dashboard's cross-site check on every POST; the login
throttle on an injected clock (attempts are counted, no test waits on a wall clock); Secure cookies.
(The same against a real coordinator process, with its memory: test_limits.py.)"""

import pytest
from fastapi.testclient import TestClient
from svc import ADMIN, admin_headers

from service.app import Settings, create_app
from service.guard import Throttle, origin_of

SAME = {"Origin": "http://testserver"}


def make(tmp_path, **kw):
    return TestClient(create_app(Settings(database=f"sqlite:///{tmp_path / 'g.db'}", admin_token=ADMIN, **kw)))


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_operators_calls_are_authorised_before_their_body_is_parsed_and_bounded(tmp_path):
    with make(tmp_path) as c:
        junk = b"{" * 5000  # not JSON: parsed, it would be a 422
        r = c.post("/jobs", content=junk, headers={"Content-Type": "application/json"})
        assert r.status_code == 401 and r.json() == {"detail": "missing bearer token"}
        assert r.headers["WWW-Authenticate"] == "Bearer"
        r = c.post("/jobs/train", content=junk, headers={"Authorization": "Bearer a-site-or-a-guess"})
        assert r.status_code == 403 and "admin token" in r.json()["detail"]
        assert c.post("/jobs", content=junk, headers=admin_headers()).status_code == 422  # the operator's: parsed
        big = b" " * ((1 << 20) + 1)
        r = c.post("/sites", content=big, headers=admin_headers())
        assert r.status_code == 413 and "limit of 1048576" in r.json()["detail"]

        def chunks():  # no Content-Length: counted as it is read
            for _ in range(3):
                yield b" " * (1 << 20)

        r = c.post("/jobs", content=chunks(), headers=admin_headers())
        assert r.status_code == 413 and "limit of 1048576" in r.json()["detail"]
        r = c.put("/jobs/x/messages/announce", content=b"x" * 10)
        assert r.status_code == 401  # an upload needs a bearer token before anything else
        assert c.post("/sites", json={"name": "a"}, headers=admin_headers()).status_code == 201  # still works


def test_every_dashboard_post_must_come_from_the_dashboards_own_origin(tmp_path):
    with make(tmp_path) as c:
        form = {"token": ADMIN}
        for headers, says in (({}, "neither an Origin nor a Referer"),
                              ({"Origin": "https://evil.example"}, "posted from https://evil.example"),
                              ({"Origin": "null"}, "posted from null"),
                              ({"Origin": "http://testserver.evil.example"}, "cross-site"),
                              ({"Referer": "https://evil.example/x"}, "posted from https://evil.example")):
            r = c.post("/ui/login", data=form, headers=headers, follow_redirects=False)
            assert r.status_code == 403 and says in r.text and "xclp_session" not in r.headers.get("set-cookie", "")
            assert "<html" in r.text.lower()  # a page for the person at the browser, not JSON
        ok = c.post("/ui/login", data=form, headers={"Referer": "http://testserver/ui/login"}, follow_redirects=False)
        assert ok.status_code == 303  # the Referer's origin when a browser sends no Origin
        # logout too: a cross-site form cannot log the operator out
        assert c.post("/ui/logout", headers={"Origin": "https://evil.example"}).status_code == 403
        assert c.get("/ui/api/jobs").status_code == 200
        assert c.post("/ui/logout", headers=SAME, follow_redirects=False).status_code == 303
        assert c.get("/ui/api/jobs").status_code == 401


def test_behind_a_proxy_the_public_url_is_the_dashboards_origin_and_makes_cookies_secure(tmp_path):
    with make(tmp_path, public_url="https://coord.example.org") as c:
        r = c.post("/ui/login", data={"token": ADMIN}, headers={"Origin": "https://coord.example.org"},
                   follow_redirects=False)
        assert r.status_code == 303 and "secure" in r.headers["set-cookie"].lower()
        r = c.post("/ui/login", data={"token": ADMIN}, headers={"Origin": "https://other.example.org"})
        assert r.status_code == 403
    with pytest.raises(ValueError, match="public URL"):
        create_app(Settings(database="sqlite://", admin_token=ADMIN, public_url="coord.example.org"))


def test_cookies_are_secure_over_https_and_not_over_plain_http(tmp_path):
    with make(tmp_path) as c:
        r = c.post("/ui/login", data={"token": ADMIN}, headers=SAME, follow_redirects=False)
        assert r.status_code == 303 and "secure" not in r.headers["set-cookie"].lower()
    with TestClient(create_app(Settings(database=f"sqlite:///{tmp_path / 's.db'}", admin_token=ADMIN)),
                    base_url="https://testserver") as c:
        r = c.post("/ui/login", data={"token": ADMIN}, headers={"Origin": "https://testserver"},
                   follow_redirects=False)
        assert r.status_code == 303 and "secure" in r.headers["set-cookie"].lower()


def test_failed_logins_are_throttled_per_client_with_a_clear_sentence(tmp_path):
    with make(tmp_path) as c:
        clock = Clock()
        c.app.state.login_throttle.clock = clock
        wrong = {"token": "a-guess"}
        for _ in range(5):
            assert c.post("/ui/login", data=wrong, headers=SAME).status_code == 401
            clock.now += 5  # five failures within 25 s
        r = c.post("/ui/login", data={"token": ADMIN}, headers=SAME, follow_redirects=False)
        assert r.status_code == 429 and "xclp_session" not in r.headers.get("set-cookie", "")  # even the right one
        assert "too many failed logins from testclient; try again in 35 s" in r.text
        assert r.headers["Retry-After"] == "35"
        clock.now += 35  # the first failure is a minute old: one more attempt
        assert c.post("/ui/login", data=wrong, headers=SAME).status_code == 401
        assert c.post("/ui/login", data=wrong, headers=SAME).status_code == 429
        clock.now += 60
        assert c.post("/ui/login", data={"token": ADMIN}, headers=SAME, follow_redirects=False).status_code == 303


def test_the_throttle_counts_each_client_apart_and_forgets(tmp_path):
    clock = Clock()
    t = Throttle(limit=2, window=10, clock=clock, max_clients=3)
    t.fail("a")
    t.fail("a")
    assert t.wait("a") == 10 and t.wait("b") == 0
    clock.now += 4
    assert t.wait("a") == 6
    for k in ("b", "c", "d"):  # more clients than it keeps: the oldest goes, memory stays bounded
        t.fail(k)
    assert len(t.failures) <= 3
    clock.now += 10
    assert all(t.wait(k) == 0 for k in "abcd") and not t.failures  # aged-out failures are dropped


def test_origins_are_compared_by_scheme_host_and_port():
    assert origin_of("HTTPS://Coord.Example.org:443/ui") == "https://coord.example.org"
    assert origin_of("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert origin_of("http://[::1]:80/") == "http://[::1]"
    assert origin_of("null") is None and origin_of("ftp://x") is None and origin_of("http://x:99999") is None
