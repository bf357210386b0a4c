"""FedCT rounds in a real Flower deployment (tests/flower_cluster.py): each site's model equals the
in-process simulation's; and a run the ServerApp fails (a prediction run, short: here so that this
module and test_flower_deployment.py take about as long)."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from flower_cluster import flower_fixture, run, site_files  # noqa: E402

from xclp.data import load_arrays  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402
from xclp_flower.deployment import APP  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

flower = flower_fixture()


def _fedct(flower) -> tuple:
    from xclp.training.fedct import public_digest

    X, y = load_arrays("digits", limit=600, seed=3)
    X = (X / 16.0).astype(np.float32)
    U = X[:100]
    ds = simulate_sites(X[100:], y[100:], 3, "iid", 0.1, seed=3)
    np.savez(flower.work / "public.npz", X=U)  # every SuperNode's public-path
    summary = run(flower, ds, f"algorithm='fedct' rounds=2 model='tree' seed=4 "
                  f"public-sha256='{public_digest(U)}' public-size={len(U)}", truth=True)
    return ds, U, summary


def _failed_run(flower) -> tuple:
    """`xclp flower run` of a run the ServerApp fails, then `xclp flower wait` of it once finished."""
    X, y = load_arrays("digits", limit=120, seed=5)
    site_files(flower, simulate_sites(X, y, 2, "iid", 0.2, seed=5))

    # `xclp flower …` (cli/flower.py) against this SuperLink ($FLWR_HOME's `local`), polling at its default
    # 5 s: each poll is a `flwr ls` process (~2 CPU-s, Flower's imports), and at --poll 1 one a second
    # while the run starts and fails
    def xclp(*args):
        return subprocess.run([sys.executable, "-m", "cli", "flower", *args, "--timeout", "300"],
                              env=flower.env, cwd=ROOT, capture_output=True, text=True, timeout=400)

    flower.wait_ready()
    ran = xclp("run", str(APP), "local", "--run-config", "bits=64 k=6 crypto='lattice' classes=1 nodes=2")
    submitted = re.search(r"xclp: run (\d+) submitted to local", ran.stderr)
    assert submitted, ran.stderr
    run_id = int(submitted.group(1))
    finished = flower.finished(run_id)
    waited = xclp("wait", str(run_id), "local")  # the run above, already finished
    return ran, run_id, finished, waited, flower.logs()


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


def test_a_failed_run_is_finished_failed_at_the_superlink_and_xclp_flower_run_exits_1(flower):
    """The ServerApp's RunFailed reaches Flower as the run's failure, with the reason. `flwr run` (1.41)
    exits 0 as soon as the run is accepted (README); `xclp flower run` submits through it and follows the
    run to its end: exit 1 with the reason, and `xclp flower wait` on the finished run says the same."""
    ran, run_id, row, waited, logs = _failed_run(flower)
    assert row["status"] == "finished:failed", (row, logs)
    assert "xclp: the run failed: n_classes must be at least 2" in row["status-details"], row
    # exit 1, the reason in the last line
    reason = "ServerApp failed with exception: xclp: the run failed: n_classes must be at least 2"
    for r in (waited, ran):
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1 and "finished:failed: " + reason in last and "Traceback" not in r.stderr, r
    assert waited.stderr.strip().splitlines()[-1].startswith(f"xclp: run {run_id} ")
    assert ": finished:failed (" in ran.stderr, ran.stderr  # progress
