"""Helpers shared by the service tests."""

import os
import signal
import time

import pytest
from fastapi.testclient import TestClient

from cli.demo import LocalCluster
from service.app import Settings, create_app

ADMIN = "admin-token-for-tests-0123456789abcdef"
# The tests whose behaviour differs by database run on both (tests/service/conftest.py: SQLite otherwise).
both_databases = pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
postgres_only = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)



def reset_postgres(url: str) -> None:
    from sqlalchemy import create_engine

    from service.db import Base

    eng = create_engine(url)
    Base.metadata.drop_all(eng)
    with eng.begin() as conn:  # service.migrate's record of the schema's revision
        conn.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
    eng.dispose()


def _db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'coord.db'}"
    url = os.environ.get("XCLP_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("PostgreSQL not configured (XCLP_TEST_POSTGRES_URL); .ci/run sets it")
    url = worker_schema(url)
    reset_postgres(url)
    return url


def worker_schema(url: str) -> str:
    """`url` with its search path set to a schema of this pytest-xdist worker's own (created if need
    be), so that workers running PostgreSQL tests at once each reset and fill only their own tables."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    schema = "xclp_" + os.environ.get("PYTEST_XDIST_WORKER", "main")
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    eng.dispose()
    return make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}) \
        .render_as_string(hide_password=False)


def _app_client(tmp_path):
    settings = Settings(database=f"sqlite:///{tmp_path / 'api.db'}", admin_token=ADMIN, max_body_bytes=1 << 20,
                        engine_interval=0.05)
    with TestClient(create_app(settings)) as client:
        yield client


def expire_deadline(sessionmaker, job_id: str) -> None:
    """Let the job's current phase run past its deadline now, as if its silent sites had been away
    for a day: a test waits for what it needs (the other sites' messages), then expires the phase,
    instead of betting on a deadline of a second or two that a loaded machine can miss."""
    import datetime as dt

    from service.db import Job

    with sessionmaker() as db:
        job = db.get(Job, job_id)
        job.phase_started_at = job.phase_started_at - dt.timedelta(days=1)
        db.commit()


def announce_all(client, job: str, heads: dict) -> None:
    """Every site of `heads` (name -> its auth headers) announces itself (any key, 4 points, one
    labelled); returns once the job is in its seed phase."""
    import numpy as np

    from crypto.keys import SiteKeyPair
    from xclp.announce import encode_announce

    for name, h in heads.items():
        body = encode_announce(name, SiteKeyPair.generate().public_bytes(), 4, np.array([0]), bytes(32))
        assert client.put(f"/jobs/{job}/messages/announce", content=body, headers=h).status_code == 200
    end = time.monotonic() + 120
    while client.get(f"/jobs/{job}", headers=next(iter(heads.values()))).json()["phase"] != "seed":
        assert time.monotonic() < end, "the job did not reach its seed phase"
        time.sleep(0.02)


def admin_headers():
    return {"Authorization": f"Bearer {ADMIN}"}


def add(client, name):
    r = client.post("/sites", json={"name": name}, headers=admin_headers())
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def message_count(client):
    from sqlalchemy import func, select

    from service.db import Message

    with client.app.state.sessionmaker() as db:
        return db.scalar(select(func.count()).select_from(Message))


class ProcessCluster(LocalCluster):
    """The demos' LocalCluster on a chosen database, with the test admin token, agents started by the
    test, and what the end-to-end tests do to it: kill and restart the coordinator, signal agents,
    wait for a job, and fail with every process's log when something does not happen."""

    def __init__(self, tmp, db_url: str, sites: dict, deadlines: dict | None = None, public=None,
                 agent_options=("--allow-plaintext", "--allow-unmasked-training"), tls=None):
        # The tests compare with the plaintext reference: these sites opt in to it (agents refuse it by default).
        super().__init__(tmp, sites, database=db_url, admin_token=ADMIN, deadlines=deadlines, public=public,
                         start_agents=False, agent_options=list(agent_options), tls=tls)
        self.tmp = tmp

    def _sessionmaker(self):
        from service.db import make_engine, make_sessionmaker

        if getattr(self, "_sm", None) is None:
            self._sm = make_sessionmaker(make_engine(self.database))
        return self._sm

    def expire(self, job):
        """The job's current phase runs past its deadline now (see expire_deadline)."""
        expire_deadline(self._sessionmaker(), job)

    def received(self, job) -> set[tuple[str, str]]:
        """(sender, topic) of every message the coordinator holds for itself in the job."""
        from sqlalchemy import select

        from service.db import COORDINATOR, Message

        with self._sessionmaker()() as db:
            return set(db.execute(select(Message.sender, Message.topic).where(
                Message.job_id == job, Message.recipient == COORDINATOR)).all())

    def kill_coordinator(self):
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait()

    def signal(self, s, sig):
        self.agents[s].send_signal(sig)
        if sig == signal.SIGKILL:
            self.agents[s].wait()

    def kill_agent(self, s):
        self.signal(s, signal.SIGKILL)

    def wait(self, job, pred, timeout=300, what="condition"):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            st = self.admin.job(job)
            if pred(st):
                return st
            if st["status"] == "failed":
                raise AssertionError(f"job failed: {st['failure']}\n{self.logs()}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}: {self.admin.job(job)}\n{self.logs()}")

    def wait_done(self, job, timeout=300):
        return self.wait(job, lambda st: st["status"] == "done", timeout, "job done")

    def result(self, job, s, suffix=".npz", timeout=60):
        """The path of the site's output file for the job, once the agent has written it."""
        path = self.out(s) / f"{job}{suffix}"
        end = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > end:
                raise AssertionError(f"no {path.name} for {s}\n{self.logs()}")
            time.sleep(0.05)
        return path

    def logs(self):
        return "\n".join(f"--- {f.name}\n" + f.read_text(errors="replace")[-3000:] for f in sorted(self.tmp.glob("*.log")))


def cluster_fixture(cls, database: bool = True, name: str = "cluster_factory"):
    """A fixture (`name`) making clusters of `cls` and closing them after the test: on the `db_url`
    fixture's database, or (database=False: the network tests' clusters) with the tmp folder alone."""

    def made(*args):
        clusters = []

        def make(**kw):
            clusters.append(cls(*args, **kw))
            return clusters[-1]

        yield make
        for c in clusters:
            c.close()

    if database:
        @pytest.fixture(name=name)
        def with_database(tmp_path, db_url):
            yield from made(tmp_path, db_url)

        return with_database

    @pytest.fixture(name=name)
    def without_database(tmp_path):
        yield from made(tmp_path)

    return without_database


def plant_bad_shares(monkeypatch, victim: str) -> None:
    """Every pair of `victim` hands the server shares that do not combine (as a cheating site would):
    the same planted fault for every driver's test of the blame rule (xclp.prediction_job.blame)."""
    from crypto.errors import ProtocolError
    from xclp.protocol import CoordinatorSession

    real = CoordinatorSession.receive_pair

    def receive(self, a, b, share_a, share_b):
        if victim in (a, b):
            raise ProtocolError(f"pair ({a}, {b}): the shares do not combine into valid distances")
        return real(self, a, b, share_a, share_b)

    monkeypatch.setattr(CoordinatorSession, "receive_pair", receive)
