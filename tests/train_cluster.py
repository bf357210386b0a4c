"""The training end-to-end tests' cluster (tests/service/test_training_e2e*.py): a coordinator and three
agent processes, each site's digits with their truth column, and FedCT's public set U when asked."""

from pathlib import Path

import numpy as np
from svc import ProcessCluster

from xclp.data import load_arrays
from xclp.splits import simulate_sites
from xclp.training.fedavg import Site


class TrainCluster(ProcessCluster):
    def __init__(self, tmp: Path, db_url: str, n_sites: int = 3, n_points: int = 600, public: int = 0):
        X, y = load_arrays("digits", limit=n_points + public, seed=3)
        X = (X / 16.0).astype(np.float32)
        self.public_X = X[:public] if public else None
        self.ds = simulate_sites(X[public:], y[public:], n_sites, "iid", 0.1, seed=3)
        if public:
            np.savez(tmp / "public.npz", X=self.public_X)
        sites = {s: {"X": self.ds.X[self.ds.site == s], "y": self.ds.y[self.ds.site == s],
                     "y_true": self.ds.y_true[self.ds.site == s]} for s in self.ds.sites}
        super().__init__(tmp, db_url, sites, public=tmp / "public.npz" if public else None)

    def sites(self) -> list[Site]:
        return [Site(s, self.ds.X[self.ds.site == s].astype(np.float32), self.ds.y[self.ds.site == s],
                     self.ds.y_true[self.ds.site == s]) for s in self.ds.sites]

    def start_agents(self):
        for s in self.ds.sites:
            self.start_agent(s)
