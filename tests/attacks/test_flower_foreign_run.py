"""Attack: a Flower ServerApp names another run than the one its nodes are in — e.g. an earlier run that
every site admitted — so that a site's work (and its XCLP jobs, children of that run) count against the
other run's accepted specification and budget instead of being admitted afresh. Defence: a site takes the
run's id from its node's own Context (`flower-{run_id}`), never from the ServerApp's message; a start that
names any other run is refused at hello (xclp_flower/training_site.py) and the site leaves the run."""

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from xclp.data import load_arrays  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402
from xclp_flower.client_app import app as client_app  # noqa: E402
from xclp_flower.grid import InProcessGrid  # noqa: E402
from xclp_flower.server_app import SiteFailed  # noqa: E402
from xclp_flower.training import FlowerTraining  # noqa: E402

OPTIONS = {"rounds": 1, "sites_per_round": 3, "local_epochs": 1, "lr": 0.1, "seed": 4, "crypto": "plaintext"}


@pytest.fixture
def configs(tmp_path):
    X, y = load_arrays("digits", limit=240, seed=3)
    ds = simulate_sites((X / 16.0).astype(np.float32), y, 3, "iid", 0.2, seed=3)
    out = []
    for s in ds.sites:
        m = ds.site == s
        np.savez(tmp_path / f"{s}.npz", X=ds.X[m], y=ds.y[m])
        out.append({"trust-on-first-use": "true", "site": s, "data-path": str(tmp_path / f"{s}.npz"),
                    "out": str(tmp_path / f"out-{s}"), "allow-plaintext": "true",
                    "allow-unmasked-training": "true"})
    return out


def test_a_start_naming_another_run_is_refused_by_every_site(configs):
    with pytest.raises(SiteFailed, match=r"fewer than 2 sites.*naming run 'flower-5', but this node is in run flower-1"):
        FlowerTraining(InProcessGrid(client_app, configs, run_id=1), "fedavg", OPTIONS, 10, run_id=5).run()


def test_the_same_start_naming_the_nodes_own_run_is_admitted(configs):
    """The control: the refusal above is for the run's name alone (without it, the test above proves nothing)."""
    out = FlowerTraining(InProcessGrid(client_app, configs, run_id=1), "fedavg", OPTIONS, 10, run_id=1).run()
    assert out["dropped"] == {} and [r["round"] for r in out["history"]] == [1]
