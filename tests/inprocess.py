"""A coordinator app in process (TestClient) with site agents driven step by step (`Agent.run(once=True)`):
the audit, purge and readmission tests' cluster."""

import time
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from svc import ADMIN

from clients.agent import Agent
from clients.api import CoordinatorClient
from service.app import Settings, create_app
from xclp.data import load_arrays
from xclp.site_policy import SitePolicy
from xclp.splits import simulate_sites


def split(n_sites: int = 3):
    """The sites' data: 40 digits each, 30 % labelled."""
    X, y = load_arrays("digits", limit=40 * n_sites, seed=3)
    return simulate_sites(X, y, n_sites, "iid", 0.3, seed=3)


class InProcess:
    def __init__(self, tmp: Path, db_url: str, n_sites: int = 3, blob_threshold: int = 512, own_blobs: bool = True):
        """own_blobs: a blob folder in `tmp` (False: the coordinator's default, beside a SQLite file)."""
        self.tmp = tmp
        self.settings = Settings(database=db_url, admin_token=ADMIN, engine_interval=0.02,
                                 blob_dir=str(tmp / "blobs") if own_blobs else None, blob_threshold=blob_threshold)
        self.tc = TestClient(create_app(self.settings))
        self.tc.__enter__()
        self.ds = split(n_sites)
        self.admin = self.client(ADMIN)

    @property
    def app(self):
        return self.tc.app

    def client(self, token: str) -> CoordinatorClient:
        return CoordinatorClient("http://testserver", token, transport=self.tc._transport, retries=2)

    def agent(self, site: str, token: str) -> Agent:
        idx = np.flatnonzero(self.ds.site == site)
        np.savez(self.tmp / f"{site}.npz", X=self.ds.X[idx], y=self.ds.y[idx])
        return Agent(self.client(token), site, self.tmp / f"{site}.npz", self.tmp / f"out-{site}",
                     policy=SitePolicy(allow_plaintext=True), trust_on_first_use=True)

    def drive(self, agents, job: str, until, timeout: float = 180):
        end = time.monotonic() + timeout
        while not until(st := self.admin.job(job)):
            assert time.monotonic() < end, f"timed out: {st}"
            for ag in agents:
                ag.run(once=True)
            time.sleep(0.01)
        return st

    def close(self):
        self.tc.__exit__(None, None, None)
