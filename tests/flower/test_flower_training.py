"""FedCT and FedCT+XCLP rounds inside Flower (xclp_flower/training.py), in one process: every site's
model equals the simulation's after the same rounds (FedCT is deterministic given its seed), the
XCLP pseudo-labels reach the sites, and a site with another public set is refused clearly."""

import pickle

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from xclp.data import load_arrays  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402
from xclp.training.fedavg import Site  # noqa: E402
from xclp.training.fedct import FedCTConfig, public_digest, run_fedct  # noqa: E402
from xclp_flower.client_app import app as client_app  # noqa: E402
from xclp_flower.grid import InProcessGrid  # noqa: E402
from xclp_flower.server_app import SiteFailed  # noqa: E402
from xclp_flower.training import FlowerFedCT  # noqa: E402

OPTIONS = {"rounds": 3, "model": "tree", "seed": 4, "crypto": "lattice", "bits": 128, "k": 6}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flower-fedct")
    X, y = load_arrays("digits", limit=700, seed=3)
    X = (X / 16.0).astype(np.float32)
    U = X[:100]
    ds = simulate_sites(X[100:], y[100:], 3, "iid", 0.1, seed=3)
    np.savez(tmp / "public.npz", X=U)
    configs = []
    for s in ds.sites:
        m = ds.site == s
        np.savez(tmp / f"{s}.npz", X=ds.X[m], y=ds.y[m], y_true=ds.y_true[m])
        configs.append({"site": s, "data-path": str(tmp / f"{s}.npz"), "out": str(tmp / f"out-{s}"),
                        "public-path": str(tmp / "public.npz")})
    return ds, U, configs, tmp


def test_flower_fedct_gives_every_site_the_simulations_model(federation):
    ds, U, configs, _ = federation
    out = FlowerFedCT(InProcessGrid(client_app, configs), "fedct", OPTIONS, 10, public_digest(U), len(U)).run()
    assert [r["round"] for r in out["history"]] == [1, 2, 3]
    sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s], ds.y_true[ds.site == s])
             for s in ds.sites]
    sim = run_fedct(sites, U, (U[:5], np.zeros(5, int)), 10, FedCTConfig(learners="tree", rounds=3, seed=4))
    for i, s in enumerate(ds.sites):
        model = pickle.loads(open(out["written"][s].replace(".npz", ".model.pkl"), "rb").read())
        assert np.array_equal(model.predict(U), sim["models"][i].predict(U)), s
        assert np.load(out["written"][s])["labels"].size == (ds.site == s).sum()
    assert [h["public_coverage"] for h in out["history"]] == pytest.approx(
        [h["public_coverage"] for h in sim["history"]])


def test_flower_fedct_xclp_labels_the_sites_first(federation):
    ds, U, configs, _ = federation
    out = FlowerFedCT(InProcessGrid(client_app, configs), "fedct-xclp", OPTIONS, 10, public_digest(U), len(U)).run()
    first = out["history"][0]
    assert first["xclp_pseudo_label_accuracy"] > 0.5 and first["local_accuracy"] > 0.3


def test_flower_fedct_refuses_a_site_with_another_public_set(federation):
    ds, U, configs, tmp = federation
    forged = U.copy()
    forged[0, 0] += 1.0
    np.savez(tmp / "forged.npz", X=forged)
    bad = [configs[0], configs[1], {**configs[2], "public-path": str(tmp / "forged.npz")}]
    with pytest.raises(SiteFailed, match="site2"):
        FlowerFedCT(InProcessGrid(client_app, bad), "fedct", OPTIONS, 10, public_digest(U), len(U)).run()
    with pytest.raises(ValueError, match="inside Flower"):
        FlowerFedCT(InProcessGrid(client_app, configs), "fedavg", OPTIONS, 10, public_digest(U), len(U))
