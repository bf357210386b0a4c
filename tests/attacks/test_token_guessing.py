"""Guessing bearer tokens: a client that presents wrong tokens over and over. After
`auth_failures` wrong tokens within `auth_window` seconds from one address, every token-bearing
request from that address is answered 429 with Retry-After (service.guard) until the oldest
failure ages out; other addresses, and right tokens, are not slowed. The throttle's clock is
injected, so the test counts attempts instead of racing the machine's speed."""

import pytest
from fastapi.testclient import TestClient
from svc import ADMIN

from service.app import Settings, create_app

LIMIT = 5


@pytest.fixture
def app(tmp_path):
    app = create_app(Settings(database=f"sqlite:///{tmp_path / 'c.db'}", admin_token=ADMIN,
                              auth_failures=LIMIT, auth_window=60.0))
    now = [1000.0]
    app.state.auth_throttle.clock = lambda: now[0]
    app.state.now = now
    return app


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def test_wrong_tokens_are_throttled_per_address(app):
    with TestClient(app, client=("10.0.0.1", 4000)) as attacker, \
            TestClient(app, client=("10.0.0.2", 4000)) as operator:
        site = operator.post("/sites", json={"name": "site-a"}, headers=bearer(ADMIN)).json()["token"]
        answers = [attacker.get("/work", headers=bearer(f"guess-{i:040d}")).status_code for i in range(300)]
        assert answers[:LIMIT] == [401] * LIMIT
        assert set(answers[LIMIT:]) == {429}  # 295 of the 300 guesses were never checked
        r = attacker.get("/work", headers=bearer(site))
        assert r.status_code == 429 and 0 < int(r.headers["Retry-After"]) <= 60  # no 429/200 oracle
        # admin routes too, and guesses at the admin token through the guard's own check
        assert attacker.post("/jobs", json={}, headers=bearer("x" * 48)).status_code == 429
        # another address is not slowed, right tokens work there
        assert operator.get("/jobs", headers=bearer(ADMIN)).status_code == 200
        assert operator.get("/work", headers=bearer(site)).status_code == 200
        # once the window has passed, the attacker's address may try again
        app.state.now[0] += 61
        assert attacker.get("/work", headers=bearer(site)).status_code == 200


def test_right_tokens_and_issued_tokens_never_count(app):
    with TestClient(app, client=("10.0.0.3", 4000)) as c:
        site = c.post("/sites", json={"name": "site-b"}, headers=bearer(ADMIN)).json()["token"]
        for _ in range(3 * LIMIT):
            assert c.get("/work", headers=bearer(site)).status_code == 200
            # a site's token on an admin route is refused, but it is no guess
            assert c.get("/jobs", headers=bearer(site)).status_code == 403
            assert c.post("/jobs/train", json={}, headers=bearer(site)).status_code == 403
        assert c.get("/jobs", headers=bearer(ADMIN)).status_code == 200


def test_the_admin_body_routes_count_wrong_tokens_before_reading_the_body(app):
    with TestClient(app, client=("10.0.0.4", 4000)) as c:
        for _ in range(LIMIT):
            assert c.post("/sites", json={"name": "x"}, headers=bearer("w" * 48)).status_code == 403
        r = c.post("/sites", json={"name": "x"}, headers=bearer(ADMIN))
        assert r.status_code == 429 and "Retry-After" in r.headers
