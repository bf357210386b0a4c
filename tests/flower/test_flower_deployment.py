"""XCLP in a real Flower deployment: a `flower-superlink` and `flower-supernode` processes on loopback,
`flwr run` of the example app (examples/flower-xclp): prediction jobs with Paillier (2048-bit keys: each site restores its saved session, Paillier key included, at every message,
in a fresh ClientApp process) and with oblivious transfer; FedCT and secure FedAvg rounds; a run that
fails. Each site's labels, written at the site, equal the in-process simulation's with the same inputs
and the same seed contributions (which each site writes beside its labels); each model equals the
simulation's.

Each run costs ~100 CPU-seconds whatever the data: Flower 1.41 starts a ClientApp process per message
(~2.5 CPU-s each, mostly Flower's own imports), and a round waits on the SuperNodes' and the grid's 3-second
polls. Runs at once on separate SuperLinks saved only ~10 % (the runs are CPU-bound on 2 cores) and came
near the runs' timeout under load, so they run one after another."""

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from xclp.data import load_arrays  # noqa: E402
from xclp.protocol import JobParams  # noqa: E402
from xclp.simulation import run_xclp  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402
from xclp_flower.deployment import APP, LocalFlower  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# Paillier and OT: the protocols whose sites hold key material and OT state across messages, which each
# fresh ClientApp process must restore. The lattice job runs the same ClientApp code path; it is checked
# in process (tests/flower/test_flower_inprocess.py) and through the coordinator, not here, to keep this
# file's CPU (~100 CPU-s per prediction run, mostly Flower's per-message process start) in bounds.
PREDICTIONS = ("paillier", "ot")


def _digits(work: Path, limit: int, seed: int):
    work.mkdir(parents=True, exist_ok=True)
    return load_arrays("digits", limit=limit, seed=seed)


def _files(work: Path, ds, truth: bool = False) -> dict[str, Path]:
    files = {}
    for s in ds.sites:
        m = ds.site == s
        files[s] = work / f"{s}.npz"
        extra = {"y_true": ds.y_true[m]} if truth else {}
        np.savez(files[s], X=ds.X[m], y=ds.y[m], **extra)
    return files


def _run(work: Path, files: dict, run_config: str, **kw) -> dict:
    flower = LocalFlower(work, files, **kw)
    t = time.monotonic()
    try:
        summary = flower.run(run_config)
    finally:
        flower.close()
    summary["_seconds"] = round(time.monotonic() - t, 1)
    summary["_all_ended"] = all(p.poll() is not None for p in flower.procs.values())
    return summary


def _predict(work: Path, crypto: str) -> tuple:
    X, y = _digits(work, 150, 5)  # (small: a deployment's fixed costs dominate anyway)
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=5)
    return ds, _run(work, _files(work, ds), f"bits=128 k=6 crypto='{crypto}'")


def _fedct(work: Path) -> tuple:
    from xclp.training.fedct import public_digest

    X, y = _digits(work, 600, 3)
    X = (X / 16.0).astype(np.float32)
    U = X[:100]
    ds = simulate_sites(X[100:], y[100:], 3, "iid", 0.1, seed=3)
    np.savez(work / "public.npz", X=U)
    summary = _run(work, _files(work, ds, truth=True), f"algorithm='fedct' rounds=2 model='tree' seed=4 "
                   f"public-sha256='{public_digest(U)}' public-size={len(U)}", public=work / "public.npz")
    return ds, U, summary


def _fedavg(work: Path) -> tuple:
    X, y = _digits(work, 600, 3)
    ds = simulate_sites((X / 16.0).astype(np.float32), y, 3, "iid", 0.1, seed=3)
    # the pairwise-masked sum: the ServerApp decodes only the average
    return ds, _run(work, _files(work, ds, truth=True), "algorithm='fedavg' model='mlp' rounds=2 sites-per-round=3 "
                    "local-epochs=1 seed=5 secure-aggregation=true")


def _failed_run(work: Path) -> tuple:
    """`xclp flower run` of a run the ServerApp fails, then `xclp flower wait` of it once finished."""
    X, y = _digits(work, 120, 5)
    ds = simulate_sites(X, y, 2, "iid", 0.2, seed=5)
    flower = LocalFlower(work, _files(work, ds))

    def xclp(*args):  # `xclp flower …` (cli/flower.py) against this SuperLink ($FLWR_HOME's `local`)
        return subprocess.run([sys.executable, "-m", "cli", "flower", *args, "--poll", "1", "--timeout", "300"],
                              env=flower.env, cwd=ROOT, capture_output=True, text=True, timeout=400)

    try:
        flower.wait_ready()
        ran = xclp("run", str(APP), "local", "--run-config", "bits=64 k=6 crypto='lattice' classes=1 nodes=2")
        submitted = re.search(r"xclp: run (\d+) submitted to local", ran.stderr)
        assert submitted, ran.stderr
        run_id = int(submitted.group(1))
        run = flower.finished(run_id)
        waited = xclp("wait", str(run_id), "local")  # the run above, already finished
        logs = flower.logs()
    finally:
        flower.close()
    return ran, run_id, run, waited, logs


@pytest.mark.parametrize("crypto", PREDICTIONS)
def test_flower_deployment_gives_each_site_the_simulations_labels(tmp_path, crypto):
    ds, summary = _predict(tmp_path, crypto)
    print(f"flwr run {crypto}: {summary['_seconds']} s")
    assert summary["_all_ended"]  # every process ended
    assert summary["crypto"] == crypto and summary["sites"] == ds.sites
    results = {s: np.load(summary["written"][s]) for s in ds.sites}
    contributions = {s: results[s]["seed_contribution"].tobytes() for s in ds.sites}
    params = JobParams(job_id=summary["job"], n_classes=10, bits=128, k=6, crypto=crypto)
    ref = run_xclp(ds, params, contributions=contributions)
    for s in ds.sites:
        assert np.array_equal(results[s]["labels"], ref.predictions[s].labels), (crypto, s)
        assert np.array_equal(results[s]["confidence"], ref.predictions[s].confidence), (crypto, s)


def test_flower_deployment_runs_fedct_rounds_like_the_simulation(tmp_path):
    import pickle

    from xclp.training.fedavg import Site
    from xclp.training.fedct import FedCTConfig
    from xclp.training.simulation import run_fedct

    ds, U, summary = _fedct(tmp_path)
    assert [r["round"] for r in summary["history"]] == [1, 2]
    sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s], ds.y_true[ds.site == s])
             for s in ds.sites]
    sim = run_fedct(sites, U, (U[:5], np.zeros(5, int)), 10, FedCTConfig(learners="tree", rounds=2, seed=4))
    for i, s in enumerate(ds.sites):
        with open(summary["written"][s].replace(".npz", ".model.pkl"), "rb") as f:
            assert np.array_equal(pickle.load(f).predict(U), sim["models"][i].predict(U)), s


def test_flower_deployment_runs_secure_fedavg_rounds_like_the_simulation(tmp_path):
    import torch

    from xclp.training.fedavg import FedAvgConfig, Site
    from xclp.training.messages import load_state
    from xclp.training.models import build_network
    from xclp.training.simulation import run_fedavg

    ds, summary = _fedavg(tmp_path)
    assert [r["round"] for r in summary["history"]] == [1, 2]
    sites = [Site(s, ds.X[ds.site == s], ds.y[ds.site == s], ds.y_true[ds.site == s]) for s in ds.sites]
    cfg = FedAvgConfig(algorithm="fedavg", rounds=2, sites_per_round=3, local_epochs=1, seed=5, secure_aggregation=True)
    want = run_fedavg(sites, (ds.X[:10], ds.y_true[:10]), 10, cfg)["model"].state_dict()
    for s in ds.sites:
        with open(summary["written"][s].replace(".npz", ".model.npz"), "rb") as f:
            got = load_state(f.read(), build_network("mlp", 64, 10).state_dict())[0]
        assert all(torch.equal(got[k], want[k]) for k in want), s


def test_a_failed_run_is_finished_failed_at_the_superlink_and_xclp_flower_run_exits_1(tmp_path):
    """The ServerApp's RunFailed reaches Flower as the run's failure, with the reason. `flwr run` (1.41)
    exits 0 as soon as the run is accepted (README); `xclp flower run` submits through it and follows the
    run to its end: exit 1 with the reason, and `xclp flower wait` on the finished run says the same."""
    ran, run_id, run, waited, logs = _failed_run(tmp_path)
    assert run["status"] == "finished:failed", (run, logs)
    assert "xclp: the run failed: n_classes must be at least 2" in run["status-details"], run
    # exit 1, the reason in the last line
    reason = "ServerApp failed with exception: xclp: the run failed: n_classes must be at least 2"
    for r in (waited, ran):
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1 and "finished:failed: " + reason in last and "Traceback" not in r.stderr, r
    assert waited.stderr.strip().splitlines()[-1].startswith(f"xclp: run {run_id} ")
    assert ": finished:failed (" in ran.stderr, ran.stderr  # progress
