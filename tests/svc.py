"""Helpers shared by the service tests."""

import os
import signal
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import Settings, create_app

ADMIN = "admin-token-for-tests"



def reset_postgres(url: str) -> None:
    from sqlalchemy import create_engine

    from service.db import Base

    eng = create_engine(url)
    Base.metadata.drop_all(eng)
    eng.dispose()


def _db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'coord.db'}"
    url = os.environ.get("XCLP_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("PostgreSQL not configured (XCLP_TEST_POSTGRES_URL); .ci/run sets it")
    reset_postgres(url)
    return url


def _app_client(tmp_path):
    settings = Settings(database=f"sqlite:///{tmp_path / 'api.db'}", admin_token=ADMIN, max_body_bytes=1 << 20,
                        engine_interval=0.05)
    with TestClient(create_app(settings)) as client:
        yield client


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


class ProcessCluster:
    """A coordinator process and one agent process per site on 127.0.0.1, talking real HTTP, for the
    end-to-end tests. `sites` maps each name to the arrays of its data file (X, y, optionally y_true);
    `public`: the file of FedCT's public set U that every agent is started with."""

    def __init__(self, tmp, db_url: str, sites: dict, deadlines: dict | None = None, public=None):
        from clients.api import CoordinatorClient
        from clients.demo import free_port

        self.tmp, self.db_url, self.deadlines, self.public = tmp, db_url, deadlines or {}, public
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.coordinator = None
        self.agents, self.tokens = {}, {}
        self.start_coordinator()
        self.admin = CoordinatorClient(self.url, ADMIN, retries=20)
        for s, arrays in sites.items():
            np.savez(tmp / f"{s}.npz", **arrays)
            self.tokens[s] = self.admin.add_site(s)["token"]

    def start_coordinator(self):
        from clients.demo import start_coordinator, wait_healthy

        self.coordinator = start_coordinator(self.tmp, self.port, ADMIN, self.db_url, self.deadlines)
        wait_healthy(self.url, 120)

    def kill_coordinator(self):
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait()

    def start_agent(self, s):
        from clients.demo import start_agent

        self.agents[s] = start_agent(self.tmp, self.url, s, self.tokens[s], self.tmp / f"{s}.npz", self.out(s),
                                     self.public)

    def signal(self, s, sig):
        self.agents[s].send_signal(sig)
        if sig == signal.SIGKILL:
            self.agents[s].wait()

    def kill_agent(self, s):
        self.signal(s, signal.SIGKILL)

    def out(self, s):
        return self.tmp / f"out-{s}"

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

    def close(self):
        for p in [*self.agents.values(), self.coordinator]:
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)  # a stopped process must run to die
                p.kill()
                p.wait()


def cluster_fixture(cls):
    """A `cluster_factory` fixture making clusters of `cls` (on the `db_url` fixture's database) and
    closing them after the test."""

    @pytest.fixture
    def cluster_factory(tmp_path, db_url):
        made = []

        def make(**kw):
            made.append(cls(tmp_path, db_url, **kw))
            return made[-1]

        yield make
        for c in made:
            c.close()

    return cluster_factory
