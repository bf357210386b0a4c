"""XCLP in a real Flower deployment: a `flower-superlink` and `flower-supernode` processes on loopback,
`flwr run` of the example app (examples/flower-xclp): a prediction job with oblivious transfer (each
site restores its saved session, OT state included, at every message, in a fresh ClientApp process).
Each site's labels, written at the site, equal the in-process simulation's with the same inputs and the
same seed contributions (which each site writes beside its labels). FedCT rounds and a run that fails:
test_flower_deployment_fedct.py; secure FedAvg rounds: test_flower_deployment_fedavg.py (modules of
their own so that the suite's workers run them at once: tests/flower_cluster.py says why)."""

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from flower_cluster import flower_fixture, run  # noqa: E402

from xclp.data import load_arrays  # noqa: E402
from xclp.job_params import JobParams  # noqa: E402
from xclp.simulation import run_xclp  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402

pytestmark = pytest.mark.slow
# OT: a protocol whose sites hold key material and OT state across messages, which each fresh ClientApp
# process must restore. Paillier and lattice run the same ClientApp code path (restore the saved session,
# step, save): Paillier's restore at every message is covered by tests/flower/test_flower_inprocess.py
# (every Context through Flower's serialisation) and tests/xclp/test_session_state.py; the lattice job
# the same and through the coordinator — not here, to keep these files' CPU (~100 CPU-s per run, mostly
# Flower's per-message process start) in bounds.
PREDICTIONS = ("ot",)

flower = flower_fixture()


def _predict(flower, crypto: str) -> tuple:
    X, y = load_arrays("digits", limit=150, seed=5)  # (small: a deployment's fixed costs dominate anyway)
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=5)
    return ds, run(flower, ds, f"bits=128 k=6 crypto='{crypto}'")


@pytest.mark.parametrize("crypto", PREDICTIONS)
def test_flower_deployment_gives_each_site_the_simulations_labels(flower, crypto):
    ds, summary = _predict(flower, crypto)
    print(f"flwr run {crypto}: {summary['_seconds']} s")
    assert summary["crypto"] == crypto and summary["sites"] == ds.sites
    results = {s: np.load(summary["written"][s]) for s in ds.sites}
    contributions = {s: results[s]["seed_contribution"].tobytes() for s in ds.sites}
    params = JobParams(job_id=summary["job"], n_classes=10, bits=128, k=6, crypto=crypto)
    ref = run_xclp(ds, params, contributions=contributions)
    for s in ds.sites:
        assert np.array_equal(results[s]["labels"], ref.predictions[s].labels), (crypto, s)
        assert np.array_equal(results[s]["confidence"], ref.predictions[s].confidence), (crypto, s)
