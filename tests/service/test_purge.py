"""Retention (service.purge): `POST /jobs/{id}/purge` leaves no byte of a finished job's messages,
blob files and results in the database — its tables, and on SQLite its files — or the blob folder, and
keeps a tombstone row and an audit record; a running job is refused unless forced (then cancelled
first); `--older-than` purges finished jobs past an age; a revoked site's data is purged, and the site,
readmitted under its name and identity, takes part in a job again."""

# PostgreSQL too only for the no-bytes test (the storage flush differs by database); --older-than and
# the readmission select and delete with the same SQL on both (tests/service/conftest.py).

import datetime as dt
import secrets
from pathlib import Path

import pytest
from inprocess import InProcess
from svc import ADMIN, announce_all, both_databases

from service.db import Base, Job, Message


@pytest.fixture
def cluster(tmp_path, db_url):
    c = InProcess(tmp_path, db_url)
    yield c
    c.close()


def _h(token):
    return {"Authorization": f"Bearer {token}"}


def _bodies(c, job_ids) -> list[bytes]:
    """Every message body of the jobs: in the database or in the blob store."""
    from sqlalchemy import select

    with c.app.state.sessionmaker() as db:
        rows = db.execute(select(Message.body, Message.blob).where(Message.job_id.in_(job_ids))).all()
        store = db.info["blobs"]
        return [body if key is None else store.read(key) for body, key in rows]


def _windows(body: bytes) -> list[bytes]:
    """Distinctive 32-byte pieces of a body (many distinct byte values: not a header two bodies share)."""
    out = []
    for at in (len(body) // 2, len(body) - 40):
        w = body[at:at + 32]
        if at >= 64 and len(w) == 32 and len(set(w)) >= 20:
            out.append(w)
    return out


def _tables(c, skip=()) -> bytes:
    """Every row of every table (but `skip`), each value as bytes."""
    from sqlalchemy import select

    out = []
    with c.app.state.sessionmaker() as db:
        for table in Base.metadata.sorted_tables:
            if table.name in skip:
                continue
            for row in db.execute(select(table)).all():
                out += [v if isinstance(v, bytes) else str(v).encode() for v in row]
    return b"\0".join(out)


def _raw(db_url: str) -> bytes:
    """A SQLite database's files as they are on disk: the database and its write-ahead log."""
    path = Path(db_url[len("sqlite:///"):])
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def _files(folder: Path) -> bytes:
    return b"\0".join(f.read_bytes() for f in folder.rglob("*") if f.is_file())


def _run_job(c, marker: str):
    """A 3-site prediction job: a and b run it to the end, c refuses it at once with `marker` in its reason
    (an upload whose bytes the test knows)."""
    from xclp.refusal import REFUSE, refusal

    tokens = {s: c.admin.add_site(s)["token"] for s in c.ds.sites}
    a, b, gone = c.ds.sites
    job = c.admin.submit_job(kind="predict", sites=c.ds.sites, crypto="plaintext", bits=32, k=4, classes=10)
    c.client(tokens[gone]).put(job, REFUSE, refusal(marker))
    agents = [c.agent(s, tokens[s]) for s in (a, b)]
    st = c.drive(agents, job, lambda st: st["status"] != "running")
    assert st["status"] == "done" and st["dropped"] == {gone: "setup"}, st
    return job, tokens, agents


@both_databases
def test_a_purged_job_leaves_no_bytes_in_the_database_or_the_blob_store(cluster, db_url):
    c = cluster
    marker = "patient-ids-" + secrets.token_hex(16)
    job, tokens, agents = _run_job(c, marker)
    a, b, _ = c.ds.sites
    # another job, running, whose messages stay
    other = c.admin.submit_job(kind="predict", sites=[a, b], crypto="plaintext", bits=32, k=4, classes=10)
    announce_all(c.tc, other, {s: _h(tokens[s]) for s in (a, b)})
    kept = _bodies(c, [other])
    bodies = _bodies(c, [job])
    pieces = [marker.encode()] + [w for body in bodies for w in _windows(body)]
    assert len(bodies) > 5 and len(pieces) > 5
    blobs = Path(c.settings.blob_dir)
    assert any(f.is_file() for f in blobs.rglob("*")), "no body went to the blob store: the test would not test it"
    assert marker.encode() in _tables(c)
    if db_url.startswith("sqlite"):  # (the raw scan below sees an upload's bytes where they are)
        assert marker.encode() in _raw(db_url)
        from sqlalchemy import text

        with c.app.state.sessionmaker() as db:  # on whatever the SQLite build's default (Debian's is on)
            assert db.execute(text("PRAGMA secure_delete")).scalar() == 1

    r = c.tc.post(f"/jobs/{other}/purge", headers=_h(ADMIN))  # running: refused
    assert r.status_code == 409 and "running" in r.json()["detail"], r.text
    r = c.tc.post(f"/jobs/{job}/purge", headers=_h(ADMIN))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["job"] == job and out["messages"] == len(bodies) and out["blobs"] >= 1 and not out["cancelled"]

    # no byte of it in any table but its tombstone and the audit log, which name only its id
    rows = _tables(c, skip=("jobs", "audit_log"))
    assert job.encode() not in rows
    everything = _tables(c)
    assert not [p for p in pieces if p in everything]
    # nor in the blob folder, nor (SQLite) in the database's files, the write-ahead log included
    files = _files(blobs)
    assert not [p for p in pieces if p in files]
    if db_url.startswith("sqlite"):
        raw = _raw(db_url)
        assert not [p for p in pieces if p in raw]
    # the other job's messages are all there
    assert sorted(_bodies(c, [other])) == sorted(kept)
    # the tombstone: listed, its status readable, purged
    st = c.admin.job(job)
    assert st["status"] == "done" and st["purged_at"] and st["sites"] == c.ds.sites
    assert {j["job"]: j["purged_at"] is not None for j in c.admin.jobs()} == {job: True, other: False}
    assert c.tc.get("/work", headers=_h(tokens[a])).json()["done"] == []  # nothing left to fetch
    # a second purge is harmless; the audit log has both
    assert c.tc.post(f"/jobs/{job}/purge", headers=_h(ADMIN)).json()["messages"] == 0
    log = [(x["action"], x["target"]) for x in c.admin.audit(action="job.")]
    assert log[-2:] == [("job.purge", job), ("job.purge", job)]

    # --force: the running job is cancelled first, then purged
    r = c.tc.post(f"/jobs/{other}/purge", params={"force": "true"}, headers=_h(ADMIN))
    assert r.status_code == 200 and r.json()["cancelled"] is True, r.text
    st = c.admin.job(other)
    assert st["status"] == "failed" and st["failure"] == "cancelled by the operator" and st["purged_at"]
    assert _bodies(c, [other]) == []
    assert [(x["action"], x["target"]) for x in c.admin.audit(target=other)] == [
        ("job.submit", other), ("job.cancel", other), ("job.purge", other)]


def test_older_than_purges_only_finished_jobs_past_the_age(cluster):
    c = cluster
    for s in ("a", "b"):
        c.admin.add_site(s)
    old, recent, running = (c.admin.submit_job(kind="predict", sites=["a", "b"], crypto="plaintext", classes=2)
                            for _ in range(3))
    c.admin.cancel(old)
    c.admin.cancel(recent)
    with c.app.state.sessionmaker() as db:
        db.get(Job, old).finished_at -= dt.timedelta(days=40)
        db.commit()
    r = c.tc.post("/jobs/purge", params={"older_than_days": 30}, headers=_h(ADMIN))
    assert r.status_code == 200, r.text
    assert [p["job"] for p in r.json()["purged"]] == [old]
    assert [j["job"] for j in c.admin.jobs() if j["purged_at"]] == [old]
    assert c.admin.job(running)["status"] == "running"


def test_a_revoked_site_s_data_is_purged_and_readmitted_it_takes_part_again(cluster, db_url):
    from sqlalchemy import or_, select

    c = cluster
    marker = "site-data-" + secrets.token_hex(16)
    job, tokens, agents = _run_job(c, marker)
    a, b, gone = c.ds.sites
    # a revoked site's data: not while it is in service
    assert c.tc.post(f"/sites/{gone}/purge", headers=_h(ADMIN)).status_code == 409
    c.admin.revoke_site(gone)
    r = c.tc.post(f"/sites/{gone}/purge", headers=_h(ADMIN))
    assert r.status_code == 200 and r.json()["messages"] >= 1, r.text
    with c.app.state.sessionmaker() as db:
        left = db.scalar(select(Message.id).where(or_(Message.sender == gone, Message.recipient == gone)))
    assert left is None and marker.encode() not in _tables(c)
    if db_url.startswith("sqlite"):
        assert marker.encode() not in _raw(db_url)
    assert c.admin.job(job)["status"] == "done"  # the job's other data is untouched

    # readmitted: the same name, a new token (the revoked one stays refused), and it takes part again
    r = c.tc.post(f"/sites/{gone}/readmit", headers=_h(ADMIN))
    assert r.status_code == 200, r.text
    new = r.json()["token"]
    assert c.tc.get("/work", headers=_h(tokens[gone])).status_code == 401
    assert c.tc.post(f"/sites/{gone}/readmit", headers=_h(ADMIN)).status_code == 409  # in service already
    assert c.admin.sites()["revoked"] == {}
    job2 = c.admin.submit_job(kind="predict", sites=c.ds.sites, crypto="plaintext", bits=32, k=4, classes=10)
    out = c.tmp / f"out-{gone}" / f"{job2}.npz"
    # the coordinator says done when the last scores are posted; the site writes its file when it next
    # polls and reads them, so the drive waits for both
    st = c.drive([*agents, c.agent(gone, new)], job2,
                 lambda st: st["status"] != "running" and (st["status"] != "done" or out.exists()))
    assert st["status"] == "done" and st["dropped"] == {} and st["live"] == c.ds.sites, st
    assert out.exists()
    log = [(x["who"], x["action"], x["target"]) for x in c.admin.audit(action="site.")
           if gone in (x["who"], x["target"])]
    assert log == [("admin", "site.add", gone), (gone, "site.refuse", job), ("admin", "site.revoke", gone),
                   ("admin", "site.purge", gone), ("admin", "site.readmit", gone)], log
