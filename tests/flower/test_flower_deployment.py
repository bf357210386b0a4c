"""XCLP in a real Flower deployment: a `flower-superlink` and `flower-supernode` processes on loopback,
`flwr run` of the example app (examples/flower-xclp): a prediction job with oblivious transfer (each
site restores its saved session, OT state included, at every message, in a fresh ClientApp process);
FedCT and secure FedAvg rounds; a run that fails. Each site's labels, written at the site, equal the in-process simulation's with the same inputs
and the same seed contributions (which each site writes beside its labels); each model equals the
simulation's.

Each run costs ~100 CPU-seconds whatever the data: Flower 1.41 starts a ClientApp process per message
(~2.5 CPU-s each, mostly Flower's own imports), and a round waits on the SuperNodes' and the grid's 3-second
polls. Runs at once on separate SuperLinks saved only ~10 % (the runs are CPU-bound on 2 cores) and came
near the runs' timeout under load, so they run one after another — on one deployment for the module
(`flower`: a SuperLink and a SuperNode per site, started once, as an operator's federation takes run
after run): starting and connecting its processes took ~10 s a test (20 s under load)."""

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from xclp.data import load_arrays  # noqa: E402
from xclp.job_params import JobParams
from xclp.simulation import run_xclp  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402
from xclp_flower.deployment import APP, LocalFlower  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# OT: a protocol whose sites hold key material and OT state across messages, which each fresh ClientApp
# process must restore. Paillier and lattice run the same ClientApp code path (restore the saved session,
# step, save): Paillier's restore at every message is covered by tests/flower/test_flower_inprocess.py
# (every Context through Flower's serialisation) and tests/xclp/test_session_state.py; the lattice job
# the same and through the coordinator — not here, to keep this file's CPU (~100 CPU-s per run, mostly
# Flower's per-message process start) in bounds.
PREDICTIONS = ("ot",)


SITES = ("site0", "site1", "site2")  # the deployment's SuperNodes (simulate_sites names its sites so)


@pytest.fixture(scope="module")
def flower(tmp_path_factory):
    """The module's deployment: each SuperNode's data file (and FedCT's U) at a fixed path, which each
    test fills with its sites' data before its run (a ClientApp loads it at every message). Every
    process is ended at the module's end (asserted)."""
    work = tmp_path_factory.mktemp("flower")
    deployment = LocalFlower(work, {s: work / f"{s}.npz" for s in SITES}, public=work / "public.npz")
    try:
        yield deployment
    finally:
        deployment.close()
    assert all(p.poll() is not None for p in deployment.procs.values()), deployment.logs()  # every process ended


def _files(flower: LocalFlower, ds, truth: bool = False) -> None:
    """Each site's data into its SuperNode's data file."""
    assert set(ds.sites) <= set(flower.sites), ds.sites
    for s in ds.sites:
        m = ds.site == s
        extra = {"y_true": ds.y_true[m]} if truth else {}
        np.savez(flower.sites[s], X=ds.X[m], y=ds.y[m], **extra)


def _run(flower: LocalFlower, ds, run_config: str, truth: bool = False) -> dict:
    _files(flower, ds, truth)
    t = time.monotonic()
    summary = flower.run(run_config)
    summary["_seconds"] = round(time.monotonic() - t, 1)
    return summary


def _predict(flower: LocalFlower, crypto: str) -> tuple:
    X, y = load_arrays("digits", limit=150, seed=5)  # (small: a deployment's fixed costs dominate anyway)
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=5)
    return ds, _run(flower, ds, f"bits=128 k=6 crypto='{crypto}'")


def _fedct(flower: LocalFlower) -> tuple:
    from xclp.training.fedct import public_digest

    X, y = load_arrays("digits", limit=600, seed=3)
    X = (X / 16.0).astype(np.float32)
    U = X[:100]
    ds = simulate_sites(X[100:], y[100:], 3, "iid", 0.1, seed=3)
    np.savez(flower.work / "public.npz", X=U)  # every SuperNode's public-path
    summary = _run(flower, ds, f"algorithm='fedct' rounds=2 model='tree' seed=4 "
                   f"public-sha256='{public_digest(U)}' public-size={len(U)}", truth=True)
    return ds, U, summary


def _fedavg(flower: LocalFlower) -> tuple:
    X, y = load_arrays("digits", limit=600, seed=3)
    ds = simulate_sites((X / 16.0).astype(np.float32), y, 3, "iid", 0.1, seed=3)
    # the pairwise-masked sum: the ServerApp decodes only the average
    return ds, _run(flower, ds, "algorithm='fedavg' model='mlp' rounds=2 sites-per-round=3 "
                    "local-epochs=1 seed=5 secure-aggregation=true", truth=True)


def _failed_run(flower: LocalFlower) -> tuple:
    """`xclp flower run` of a run the ServerApp fails, then `xclp flower wait` of it once finished."""
    X, y = load_arrays("digits", limit=120, seed=5)
    _files(flower, simulate_sites(X, y, 2, "iid", 0.2, seed=5))

    def xclp(*args):  # `xclp flower …` (cli/flower.py) against this SuperLink ($FLWR_HOME's `local`)
        return subprocess.run([sys.executable, "-m", "cli", "flower", *args, "--poll", "1", "--timeout", "300"],
                              env=flower.env, cwd=ROOT, capture_output=True, text=True, timeout=400)

    flower.wait_ready()
    ran = xclp("run", str(APP), "local", "--run-config", "bits=64 k=6 crypto='lattice' classes=1 nodes=2")
    submitted = re.search(r"xclp: run (\d+) submitted to local", ran.stderr)
    assert submitted, ran.stderr
    run_id = int(submitted.group(1))
    run = flower.finished(run_id)
    waited = xclp("wait", str(run_id), "local")  # the run above, already finished
    return ran, run_id, run, waited, flower.logs()


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


def test_flower_deployment_runs_fedct_rounds_like_the_simulation(flower):
    from xclp.training.fedavg import Site
    from xclp.training.fedct import FedCTConfig
    from xclp.training.saved_learners import load_model_file, model_path
    from xclp.training.simulation import run_fedct

    ds, U, summary = _fedct(flower)
    assert [r["round"] for r in summary["history"]] == [1, 2]
    sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s], ds.y_true[ds.site == s])
             for s in ds.sites]
    sim = run_fedct(sites, U, (U[:5], np.zeros(5, int)), 10, FedCTConfig(learners="tree", rounds=2, seed=4))
    for i, s in enumerate(ds.sites):
        model = load_model_file(model_path(summary["written"][s]))
        assert np.array_equal(model.predict(U), sim["models"][i].predict(U)), s


def test_flower_deployment_runs_secure_fedavg_rounds_like_the_simulation(flower):
    import torch

    from xclp.training.fedavg import FedAvgConfig, Site
    from xclp.training.messages import load_state
    from xclp.training.models import build_network
    from xclp.training.simulation import run_fedavg

    ds, summary = _fedavg(flower)
    assert [r["round"] for r in summary["history"]] == [1, 2]
    sites = [Site(s, ds.X[ds.site == s], ds.y[ds.site == s], ds.y_true[ds.site == s]) for s in ds.sites]
    cfg = FedAvgConfig(algorithm="fedavg", rounds=2, sites_per_round=3, local_epochs=1, seed=5, secure_aggregation=True)
    want = run_fedavg(sites, (ds.X[:10], ds.y_true[:10]), 10, cfg)["model"].state_dict()
    for s in ds.sites:
        with open(summary["written"][s].replace(".npz", ".model.npz"), "rb") as f:
            got = load_state(f.read(), build_network("mlp", 64, 10).state_dict())[0]
        assert all(torch.equal(got[k], want[k]) for k in want), s


def test_a_failed_run_is_finished_failed_at_the_superlink_and_xclp_flower_run_exits_1(flower):
    """The ServerApp's RunFailed reaches Flower as the run's failure, with the reason. `flwr run` (1.41)
    exits 0 as soon as the run is accepted (README); `xclp flower run` submits through it and follows the
    run to its end: exit 1 with the reason, and `xclp flower wait` on the finished run says the same."""
    ran, run_id, run, waited, logs = _failed_run(flower)
    assert run["status"] == "finished:failed", (run, logs)
    assert "xclp: the run failed: n_classes must be at least 2" in run["status-details"], run
    # exit 1, the reason in the last line
    reason = "ServerApp failed with exception: xclp: the run failed: n_classes must be at least 2"
    for r in (waited, ran):
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1 and "finished:failed: " + reason in last and "Traceback" not in r.stderr, r
    assert waited.stderr.strip().splitlines()[-1].startswith(f"xclp: run {run_id} ")
    assert ": finished:failed (" in ran.stderr, ran.stderr  # progress
