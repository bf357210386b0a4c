"""Secure FedAvg in a real Flower deployment (tests/flower_cluster.py): the ServerApp decodes only the
pairwise-masked sum's average, and each site's model equals the in-process simulation's.

One round: each message is a fresh ClientApp process, so the round's upload, its unmasking and the final
model already cross processes through Context.state alone, and the round's masked sum is the federation's
whole effect (the model is the decoded average). Rounds that carry one round's model into the next are
tests/flower/test_flower_training.py's (three, bit for bit with the simulation, masked and not, through
the InProcessGrid, which passes every Context through Flower's serialisation and builds a fresh site at
every message): each round here costs 6 ClientApp processes of ~4 CPU-s (27 -> 21 measured for 2 -> 1)."""

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from flower_cluster import flower_fixture, run  # noqa: E402

from xclp.data import load_arrays  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402

pytestmark = pytest.mark.slow

flower = flower_fixture()


def _fedavg(flower) -> tuple:
    X, y = load_arrays("digits", limit=600, seed=3)
    ds = simulate_sites((X / 16.0).astype(np.float32), y, 3, "iid", 0.1, seed=3)
    # the pairwise-masked sum: the ServerApp decodes only the average
    return ds, run(flower, ds, "algorithm='fedavg' model='mlp' rounds=1 sites-per-round=3 "
                   "local-epochs=1 seed=5 secure-aggregation=true", truth=True)


def test_flower_deployment_runs_secure_fedavg_rounds_like_the_simulation(flower):
    import torch

    from xclp.training.fedavg import FedAvgConfig, Site
    from xclp.training.messages import load_state
    from xclp.training.models import build_network
    from xclp.training.simulation import run_fedavg

    ds, summary = _fedavg(flower)
    assert [r["round"] for r in summary["history"]] == [1]
    sites = [Site(s, ds.X[ds.site == s], ds.y[ds.site == s], ds.y_true[ds.site == s]) for s in ds.sites]
    cfg = FedAvgConfig(algorithm="fedavg", rounds=1, sites_per_round=3, local_epochs=1, seed=5, secure_aggregation=True)
    want = run_fedavg(sites, (ds.X[:10], ds.y_true[:10]), 10, cfg)["model"].state_dict()
    for s in ds.sites:
        with open(summary["written"][s].replace(".npz", ".model.npz"), "rb") as f:
            got = load_state(f.read(), build_network("mlp", 64, 10).state_dict())[0]
        assert all(torch.equal(got[k], want[k]) for k in want), s
