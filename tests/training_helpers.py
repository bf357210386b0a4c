"""Helpers shared by the training tests (as tests/svc.py is for the service's): a site's plain FedAvg
work for the core's machines, a small federation of weights and keys for a masked sum, and the
noise draws a run makes. Each was written again in two test files."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from crypto.keys import SiteKeyPair
from xclp.privacy import discrete_laplace as dl
from xclp.training.fedavg import Site, labelled_only
from xclp.training.models import build_network, torch_threads
from xclp.training_job import Weights


def toy_site(name: str, i: int) -> Site:
    """A small site of the machine tests: 20 points, 4 features, half of them labelled (x₀ > 0)."""
    rng = np.random.default_rng(i)
    X = rng.normal(size=(20, 4)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    y[10:] = -1
    return Site(name, X, y)


def draws(site: str):
    """The site's injected CSPRNG for a test: SHA-256 in counter mode over a fixed seed (a site uses
    os.urandom), so that a run repeats exactly."""
    n = [0]

    def draw(k):
        n[0] += 1
        return hashlib.sha256(f"{site}/{n[0]}".encode()).digest()[:k]

    return draw


class FedAvgWork:
    """A site's FedAvg work for xclp.training_job.TrainSite, as the agent does it for plain FedAvg: the
    round's model trained on the site's labels."""

    def __init__(self, site: Site):
        self.site = site

    def hello(self, s):
        return {"n": self.site.n, "features": int(self.site.X.shape[1]), "labelled": self.site.n_labelled}

    def round(self, s, t, plan, inbox):
        net = s.network()
        net.load_state_dict(s.load_broadcast(inbox.shared(f"{s.broadcast}/{t - 1}")))
        template = {k: v.clone() for k, v in net.state_dict().items()}
        with torch_threads(s.cfg.threads):  # as the agent trains: float sums depend on the thread count
            site = s.scaled(self).site  # the site's points standardised as the run's machine says
            state, n = s.update(net, site, labelled_only(site), t, plan) or (None, 0)
        return Weights(state, template, {"n": int(n)})

    def evaluate(self, s, t, inbox):
        return {"eval_n": 0, "eval_correct": 0}

    def points(self):
        return self.site.X


def masked_federation(sites: list[str]):
    """(template, each site's weights, each site's key pair): a 12-feature, 3-class MLP's weights, each
    site's a different distance from the template, for the masked-sum tests."""
    torch.manual_seed(0)
    template = build_network("mlp", 12, 3, seed=1).state_dict()
    states = {s: {k: v + torch.randn_like(v) * (i + 1) for k, v in template.items()} for i, s in enumerate(sites)}
    return template, states, {s: SiteKeyPair.generate() for s in sites}


def count_noise_draws(monkeypatch) -> list[tuple]:
    """The shapes of the discrete-Laplace draws made from now on (the list fills as they are made)."""
    calls: list[tuple] = []
    real = dl.sample

    def counted(shape, gamma, key=None):
        calls.append(tuple(shape))
        return real(shape, gamma, key)

    monkeypatch.setattr(dl, "sample", counted)
    return calls
