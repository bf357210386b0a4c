"""Large message bodies as files beside the database (service.blobs): the same job, the same bytes,
nothing lost across a restart, nothing left behind once the job is done — SQLite and PostgreSQL."""

# PostgreSQL too for the restart test (the store's fsync differs by database); the OT job through the
# store is the same SQL on both (tests/service/conftest.py), SQLite only.

import hashlib
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from svc import ADMIN, admin_headers, announce_all, both_databases

from clients.agent import Agent
from clients.api import CoordinatorClient
from service.app import Settings, create_app
from service.blobs import BlobStore, blob_key, default_blob_dir
from service.db import Message
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.simulation import run_xclp
from xclp.site_policy import SitePolicy
from xclp.splits import simulate_sites

REFERENCE_OK = SitePolicy(allow_plaintext=True)  # these sites opt in to the plaintext reference


def test_blob_store_put_read_delete_sweep(tmp_path):
    store = BlobStore(tmp_path / "b", threshold=10)
    body = b"x" * 100
    key = store.put(body)
    assert key == hashlib.sha256(body).hexdigest() == blob_key(body)
    assert store.read(key) == body and store.path(key).parent.name == key[:2]
    assert store.put(body) == key  # idempotent
    (store.path(key).parent / f".{key}.junk.tmp").write_bytes(b"half")
    orphan = store.put(b"y" * 50)
    assert store.sweep({key}) == 2  # the orphan and the stale temporary file
    assert store.read(key) == body and not store.path(orphan).exists()
    assert store.ready(key, len(body)) == store.path(key) and store.ready(key, len(body) + 1) is None
    with pytest.raises(FileNotFoundError):
        store.read(key, len(body) - 1)  # a file that is not whole is as good as missing
    store.delete(key)
    store.delete(key)  # twice: no error
    assert store.ready(key, len(body)) is None
    assert not store.path(key).exists()
    with pytest.raises(ValueError):
        store.path("../../etc/passwd")


def test_a_body_streamed_to_the_store_gets_its_content_name_or_leaves_nothing(tmp_path):
    store = BlobStore(tmp_path / "b", threshold=10)
    chunks = [bytes([i]) * 1000 for i in range(50)]
    with store.incoming() as spill:
        for c in chunks:
            spill.write(c)
        key, size = spill.finish()
    body = b"".join(chunks)
    assert key == blob_key(body) and size == len(body) and store.read(key, size) == body
    with pytest.raises(RuntimeError):
        with store.incoming() as spill:
            spill.write(b"half a message")
            raise RuntimeError("the sender vanished")
    assert [f.name for f in (store.root / "incoming").iterdir()] == []  # nothing half-written is left
    assert {f.name for f in store.root.glob("??/*")} == {key}


def test_default_blob_dir():
    assert default_blob_dir("sqlite:////var/x/coord.db") == "/var/x/coord.db.blobs"
    assert default_blob_dir("sqlite:///rel.db") == "rel.db.blobs"
    assert default_blob_dir("sqlite://") is None
    assert default_blob_dir("sqlite:///:memory:") is None
    assert default_blob_dir("postgresql+psycopg2://u:p@h/db") is None


def _app(db_url, blob_dir, threshold):
    return TestClient(create_app(Settings(database=db_url, admin_token=ADMIN, engine_interval=0.02,
                                          blob_dir=str(blob_dir), blob_threshold=threshold)))


def _add(client, name):
    r = client.post("/sites", json={"name": name}, headers=admin_headers())
    return {"Authorization": f"Bearer {r.json()['token']}"}


@both_databases
def test_relayed_blobs_survive_a_restart_and_replays(db_url, tmp_path):
    blob_dir = tmp_path / "blobs"
    with _app(db_url, blob_dir, 64) as c:
        ha, hb = _add(c, "a"), _add(c, "b")
        job = c.post("/jobs", json={"sites": ["a", "b"], "crypto": "plaintext", "classes": 2},
                     headers=admin_headers()).json()["job"]
        url = f"/jobs/{job}/messages"
        announce_all(c, job, {"a": ha, "b": hb})
        big, small = bytes(range(256)) * 12, b"sealed"  # (a seed message is at most 4 KiB)
        assert c.put(f"{url}/seed?to=b", content=big, headers=ha).json()["stored"] is True
        with c.app.state.sessionmaker() as db:
            row = db.execute(select(Message.body, Message.blob, Message.size).where(
                Message.job_id == job, Message.sender == "a", Message.topic == "seed")).one()
        assert row == (b"", blob_key(big), len(big))  # the row names the file, the body is not in it
        assert (blob_dir / row[1][:2] / row[1]).read_bytes() == big
        # an identical replay stores nothing; different content is refused and leaves no file
        assert c.put(f"{url}/seed?to=b", content=big, headers=ha).json()["stored"] is False
        assert c.put(f"{url}/seed?to=b", content=big[::-1], headers=ha).status_code == 409
        assert not (blob_dir / blob_key(big[::-1])[:2] / blob_key(big[::-1])).exists()
        assert c.put(f"{url}/seed?to=a", content=small, headers=hb).json()["stored"] is True  # below: in the row
        r = c.get(f"{url}/seed?sender=a", headers=hb)
        assert r.status_code == 200 and r.content == big
        assert c.get(f"{url}/seed?sender=a", headers=ha).status_code == 404  # addressed to b only
    # a coordinator killed after a file was written but before its row committed leaves an orphan
    orphan = BlobStore(blob_dir).put(b"z" * 100)
    with _app(db_url, blob_dir, 64) as c:  # restarted on the same database and folder
        assert c.get(f"{url}/seed?sender=a", headers=hb).content == big
        assert c.get(f"{url}/seed?sender=b", headers=ha).content == small
        assert not BlobStore(blob_dir).path(orphan).exists()
        # as durable as the database's commits: fsync on PostgreSQL, not on SQLite (WAL, synchronous=NORMAL)
        assert c.app.state.sessionmaker.kw["info"]["blobs"].fsync is not db_url.startswith("sqlite")
        # a file that a power loss cut short is served as missing, not as a truncated body
        path = blob_dir / blob_key(big)[:2] / blob_key(big)
        path.write_bytes(big[:100])
        assert c.get(f"{url}/seed?sender=a", headers=hb).status_code == 404


@pytest.fixture
def rig(db_url, tmp_path):
    store_puts, store_streamed = [], []
    settings = Settings(database=db_url, admin_token=ADMIN, engine_interval=0.02, blob_dir=str(tmp_path / "blobs"),
                        blob_threshold=4096)
    with TestClient(create_app(settings)) as tc:
        store = tc.app.state.sessionmaker.kw["info"]["blobs"]
        put = store.put
        store.put = lambda body, key=None: store_puts.append(len(body)) or put(body, key)
        incoming = store.incoming

        def streamed():  # a relayed body written to its file as it arrived
            spill = incoming()
            finish = spill.finish
            spill.finish = lambda: store_streamed.append(spill.size) or finish()
            return spill

        store.incoming = streamed
        X, y = load_arrays("digits", limit=240, seed=5)
        ds = simulate_sites(X, y, 3, "iid", 0.2, seed=5)
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)
        agents = {}
        for s in ds.sites:
            token = admin.add_site(s)["token"]
            idx = np.flatnonzero(ds.site == s)
            np.savez(tmp_path / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])
            client = CoordinatorClient("http://testserver", token, transport=tc._transport)
            agents[s] = Agent(client, s, tmp_path / f"{s}.npz", tmp_path / f"out-{s}", policy=REFERENCE_OK, trust_on_first_use=True)
        yield ds, admin, agents, tc, store, (store_puts, store_streamed)


def test_ot_job_through_blobs_equals_in_process_and_leaves_no_pair_files(rig):
    ds, admin, agents, tc, store, (_, store_streamed) = rig
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="ot", bits=64, k=5, classes=10)
    end = time.monotonic() + 120
    while not all(a.result_path(job).exists() for a in agents.values()):
        assert time.monotonic() < end, admin.job(job)
        for a in agents.values():
            a.step(job)
        time.sleep(0.01)
    # the pair messages and shares went to files as they arrived, never whole in the relay's memory
    assert store_streamed and min(store_streamed) >= 4096
    contributions = {s: bytes.fromhex(a.state(job)["contribution"]) for s, a in agents.items()}
    ref = run_xclp(ds, JobParams(job_id=job, n_classes=10, bits=64, k=5, crypto="ot"), contributions=contributions)
    for s, a in agents.items():
        got = np.load(a.result_path(job))
        assert np.array_equal(got["labels"], ref.predictions[s].labels)
        assert np.array_equal(got["confidence"], ref.predictions[s].confidence)
    # the engine pruned the pair messages and their files; every file left is named by a row
    time.sleep(0.2)
    with tc.app.state.sessionmaker() as db:
        assert db.scalar(select(Message.id).where(Message.topic.startswith("pair/"))) is None
        referenced = set(db.scalars(select(Message.blob).where(Message.blob.is_not(None))))
    files = {f.name for f in store.root.glob("*/*")}
    assert files == referenced
    for key in files:
        assert blob_key(store.read(key)) == key
