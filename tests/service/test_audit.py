"""The audit log (service.audit): every operator's and site's action that changes the coordinator's
state, and every refused token, names who did it — each operator by their own token (`xclp operator
add`) — when and from where; it is written in the action's own transaction, holds no token, and is read
with `GET /audit` or `xclp log`."""

# SQLite only (tests/service/conftest.py): the audit rows are the same SQL on PostgreSQL; the audit
# table made by the revisions on PostgreSQL: test_migrations' previous-head test [postgres].

import hashlib
import json

import pytest
from svc import ADMIN

from service.app import Settings, create_app


def _h(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def client(db_url, tmp_path):
    from fastapi.testclient import TestClient

    with TestClient(create_app(Settings(database=db_url, admin_token=ADMIN, engine_interval=0.05,
                                       blob_dir=str(tmp_path / "blobs")))) as c:
        yield c


def _dump(client) -> str:
    """Every row of every table, as text."""
    from sqlalchemy import select

    from service.db import Base

    out = []
    with client.app.state.sessionmaker() as db:
        for table in Base.metadata.sorted_tables:
            for row in db.execute(select(table)).all():
                out.append(" ".join(r.hex() if isinstance(r, bytes) else json.dumps(r, default=str) for r in row))
    return "\n".join(out)


def test_each_action_is_recorded_with_the_operator_whose_token_did_it(client):
    r = client.post("/operators", json={"name": "alice"}, headers=_h(ADMIN))
    assert r.status_code == 201, r.text
    alice = r.json()["token"]
    bob = client.post("/operators", json={"name": "bob"}, headers=_h(alice)).json()["token"]
    assert client.post("/operators", json={"name": "bob"}, headers=_h(ADMIN)).status_code == 409
    assert client.post("/operators", json={"name": "admin"}, headers=_h(ADMIN)).status_code == 422
    for s in ("a", "b", "c"):
        assert client.post("/sites", json={"name": s}, headers=_h(alice)).status_code == 201
    predict = client.post("/jobs", json={"sites": ["a", "b", "c"], "crypto": "plaintext", "classes": 2},
                          headers=_h(alice)).json()["job"]
    r = client.post("/jobs/train", json={"algorithm": "fedavg", "sites": ["a", "b"], "classes": 2,
                                         "crypto": "plaintext", "secure_aggregation": False}, headers=_h(bob))
    assert r.status_code == 201, r.text
    train = r.json()["job"]
    # a submission refused (an unknown site) leaves no record: the record commits with the job
    assert client.post("/jobs", json={"sites": ["a", "nobody"], "classes": 2}, headers=_h(bob)).status_code == 404
    assert client.post(f"/jobs/{train}/cancel", headers=_h(bob)).status_code == 200
    assert client.post("/sites/c/revoke", headers=_h(alice)).status_code == 200
    assert client.post("/sites/b/token", headers=_h(bob)).status_code == 200
    assert client.post(f"/jobs/{predict}/cancel", headers=_h(alice)).status_code == 200
    assert client.post("/sites/c/purge", headers=_h(bob)).status_code == 200
    assert client.post("/sites/c/readmit", headers=_h(alice)).status_code == 200
    assert client.post(f"/jobs/{predict}/purge", headers=_h(bob)).status_code == 200
    assert client.post("/operators/bob/revoke", headers=_h(alice)).status_code == 200
    # bob's token stops working at once (a known token refused: no throttle, but recorded), and a guess
    assert client.get("/sites", headers=_h(bob)).status_code == 403
    assert client.post("/sites", json={"name": "d"}, headers=_h(bob)).status_code == 403  # (the guard's check)
    guess = "not-a-token-anyone-holds-0123456789"
    assert client.get("/jobs", headers=_h(guess)).status_code == 403

    r = client.get("/audit", headers=_h(alice))
    assert r.status_code == 200, r.text
    records = r.json()["records"]
    got = [(x["who"], x["action"], x["target"]) for x in records]
    assert got == [
        ("admin", "operator.add", "alice"), ("alice", "operator.add", "bob"),
        ("alice", "site.add", "a"), ("alice", "site.add", "b"), ("alice", "site.add", "c"),
        ("alice", "job.submit", predict), ("bob", "job.submit", train),
        ("bob", "job.cancel", train), ("alice", "site.revoke", "c"), ("bob", "site.token", "b"),
        ("alice", "job.cancel", predict), ("bob", "site.purge", "c"), ("alice", "site.readmit", "c"),
        ("bob", "job.purge", predict), ("alice", "operator.revoke", "bob"),
        ("bob", "auth.refused", None), ("bob", "auth.refused", None), ("-", "auth.failed", None),
    ], got
    assert all(x["client"] == "testclient" and x["at"].endswith("Z") for x in records)
    assert records[5]["detail"] == {"kind": "predict", "sites": ["a", "b", "c"], "crypto": "plaintext"}
    assert records[6]["detail"]["kind"] == "train" and records[6]["detail"]["algorithm"] == "fedavg"
    assert records[-1]["role"] == "unknown" and records[-1]["detail"]["request"] == "GET /jobs"
    assert records[-2]["role"] == "operator" and records[-2]["detail"]["request"] == "POST /sites"
    # filters
    q = lambda **p: [(x["who"], x["action"]) for x in client.get("/audit", params=p, headers=_h(ADMIN)).json()["records"]]  # noqa: E731
    assert q(who="bob", action="site.") == [("bob", "site.token"), ("bob", "site.purge")]
    assert q(target=predict) == [("alice", "job.submit"), ("alice", "job.cancel"), ("bob", "job.purge")]
    assert q(since=records[-1]["at"], action="auth.failed") == [("-", "auth.failed")]
    assert q(since="2999-01-01T00:00:00Z") == []
    assert len(q(limit=2)) == 2 and q(limit=2)[-1] == ("-", "auth.failed")
    assert client.get("/audit", headers=_h(bob)).status_code == 403
    # tokens: the operators' only as SHA-256, no token anywhere in the database (audit log included)
    everything = _dump(client)
    for token in (alice, bob, guess, ADMIN):
        assert token not in everything
    assert hashlib.sha256(alice.encode()).hexdigest() in everything
    ops = client.get("/operators", headers=_h(alice)).json()["operators"]
    assert [(o["operator"], o["created_by"], o["revoked_at"] is not None) for o in ops] == [
        ("alice", "admin", False), ("bob", "alice", True)]


def test_a_site_s_refusal_and_a_dashboard_login_are_recorded(client):
    from xclp.refusal import REFUSE, refusal

    tokens = {s: client.post("/sites", json={"name": s}, headers=_h(ADMIN)).json()["token"] for s in ("a", "b", "c")}
    job = client.post("/jobs", json={"sites": ["a", "b", "c"], "crypto": "plaintext", "classes": 2},
                      headers=_h(ADMIN)).json()["job"]
    r = client.put(f"/jobs/{job}/messages/{REFUSE}", content=refusal("not today"), headers=_h(tokens["c"]))
    assert r.status_code == 200, r.text
    op = client.post("/operators", json={"name": "carol"}, headers=_h(ADMIN)).json()["token"]
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": str(client.base_url)}
    assert client.post("/ui/login", content=f"token={op}", headers=form, follow_redirects=False).status_code == 303
    assert client.post("/ui/login", content="token=wrong", headers=form, follow_redirects=False).status_code == 401
    records = client.get("/audit", headers=_h(ADMIN)).json()["records"]
    got = [(x["who"], x["role"], x["action"], x["target"]) for x in records if x["action"] != "site.add"]
    assert got == [("admin", "operator", "job.submit", job), ("c", "site", "site.refuse", job),
                   ("admin", "operator", "operator.add", "carol"), ("carol", "operator", "ui.login", None),
                   ("-", "unknown", "auth.failed", None)], got


def test_the_cli_adds_an_operator_whose_actions_the_log_names(app_client, tmp_path, capsys, monkeypatch):
    import clients.api
    from cli.main import main

    transport = app_client._transport
    real = clients.api.CoordinatorClient.__init__
    monkeypatch.setattr(clients.api.CoordinatorClient, "__init__",
                        lambda self, url, token, **kw: real(self, url, token, **{**kw, "transport": transport}))
    url = ["--coordinator", "http://testserver"]
    path = tmp_path / "dana.token"
    assert main(["operator", "add", "dana", *url, f"--admin-token={ADMIN}", "--token-file", str(path)]) == 0
    assert "dana" in capsys.readouterr().out
    dana = ["--admin-token-file", str(path)]
    assert main(["site", "add", "hospital-a", *url, *dana, "--json"]) == 0
    capsys.readouterr()
    assert main(["operator", "list", *url, *dana]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split()[0] == "admin" and rows[2].split()[:2] == ["dana", "active"]
    assert main(["log", *url, *dana, "--json", "--since", "1h"]) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    assert [(x["who"], x["action"], x["target"]) for x in records] == [("admin", "operator.add", "dana"),
                                                                       ("dana", "site.add", "hospital-a")]
    assert main(["log", *url, *dana, "--action", "site.add"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["WHEN", "(UTC)", "WHO", "ACTION"] and "dana" in out[1] and "hospital-a" in out[1]
    assert main(["log", *url, *dana, "--since", "yesterday"]) == 2
    assert "--since" in capsys.readouterr().err


def test_site_list_marks_a_site_silent_past_the_limit_stale(app_client):
    import datetime as dt

    for s in ("a", "b", "c"):
        app_client.post("/sites", json={"name": s}, headers=_h(ADMIN))
    app_client.post("/sites/c/revoke", headers=_h(ADMIN))
    seen = app_client.app.state.last_seen
    seen.since -= dt.timedelta(hours=1)  # the coordinator has been up an hour
    seen["a"] = seen.since + dt.timedelta(minutes=30)  # a: silent 30 min; b: never heard from; c: revoked
    out = app_client.get("/sites", params={"stale_after": 600}, headers=_h(ADMIN)).json()
    assert set(out["stale"]) == {"a", "b"} and 1790 < out["stale"]["a"] < 1900 and out["stale_after_s"] == 600
    assert app_client.get("/sites", params={"stale_after": 7200}, headers=_h(ADMIN)).json()["stale"] == {}
    assert set(app_client.get("/sites", headers=_h(ADMIN)).json()["stale"]) == {"a", "b"}  # (default 600 s)
