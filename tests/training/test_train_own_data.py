"""`xclp simulate train --data SITES --test TEST [--public U]`: a training run on the user's own files
(CSV, Parquet or .npz, as the agents read them). The sites are the file's, their points and labels
as given: the run equals the same algorithm on those sites built by hand. Bad files are clear errors."""

import csv
import subprocess
import sys

import numpy as np
import pytest

from xclp.data import DataError, load_arrays
from xclp.training.fedavg import FedAvgConfig, Site
from xclp.training.holdout import DEFAULT_HOLDOUT, training_labels
from xclp.training.runner import run_training
from xclp.training.simulation import run_fedavg


def _write_csv(path, X, labels, sites=None):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"f{j}" for j in range(X.shape[1])] + ["label"] + (["site"] if sites is not None else []))
        for i in range(len(X)):
            w.writerow([repr(float(v)) for v in X[i]] + ["" if labels[i] < 0 else int(labels[i])]
                       + ([sites[i]] if sites is not None else []))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own")
    X, y = load_arrays("digits", limit=900, seed=2)
    X = (X / 16.0).astype(np.float32)
    rng = np.random.default_rng(2)
    site = np.array(["clinic-b", "clinic-a", "clinic-c"])[rng.integers(0, 3, 700)]  # not in sorted order
    labels = np.where(rng.random(700) < 0.3, y[:700], -1)
    _write_csv(tmp / "sites.csv", X[:700], labels, site)
    _write_csv(tmp / "test.csv", X[700:], y[700:])
    np.savez(tmp / "U.npz", X=X[700:800])
    return tmp, X, y, site, labels


def test_a_run_on_the_users_own_files_equals_the_same_run_on_those_sites(files):
    tmp, X, y, site, labels = files
    opts = {"algorithm": "fedavg", "rounds": 2, "local_epochs": 4, "sites_per_round": 3, "seed": 3,
            "secure_aggregation": True}
    out = run_training({**opts, "data": str(tmp / "sites.csv"), "test": str(tmp / "test.csv"), "quiet": True})
    names = list(dict.fromkeys(site))  # the file's order of first appearance
    from xclp.data import make_dataset

    ds = make_dataset(X[:700], labels, site)
    # each site holds out labelled points as its agent would (the file has no truth column)
    held = {s: training_labels(labels[site == s], None, DEFAULT_HOLDOUT, seed=3, site=s) for s in ds.sites}
    sites = [Site(s, X[:700][site == s], held[s].y, held[s].truth, held[s].n_held_out) for s in ds.sites]
    assert sorted(ds.sites) == sorted(names)
    cfg = FedAvgConfig(algorithm="fedavg", rounds=2, local_epochs=4, sites_per_round=3, seed=3, secure_aggregation=True)
    want = run_fedavg(sites, (X[700:], y[700:]), 10, cfg)
    # the same sampled sites and the same accuracy after every round: the same data reached the run
    assert [r["sites"] for r in out["history"]] == [r["sites"] for r in want["history"]]
    assert [r["accuracy"] for r in out["history"]] == pytest.approx([r["accuracy"] for r in want["history"]])
    assert out["final_accuracy"] > 0.5
    assert out["config"]["dataset"] == "sites.csv" and out["config"]["labels"] == int((labels >= 0).sum())


def test_public_set_algorithms_take_u_from_the_users_file(files):
    tmp, *_ = files
    out = run_training({"algorithm": "fedct", "rounds": 2, "data": str(tmp / "sites.csv"), "test": str(tmp / "test.csv"),
                        "public": str(tmp / "U.npz"), "quiet": True})
    assert out["communication_bytes"]["public_size"] == 100 and out["final_accuracy"] > 0.3
    np.save(tmp / "U.npy", np.load(tmp / "U.npz")["X"])  # U as a bare .npy, as the agents' --public takes it
    again = run_training({"algorithm": "fedct", "rounds": 2, "data": str(tmp / "sites.csv"),
                          "test": str(tmp / "test.csv"), "public": str(tmp / "U.npy"), "quiet": True})
    assert again["final_accuracy"] == out["final_accuracy"]


def test_bad_own_data_gives_clear_errors(files):
    tmp, X, y, site, labels = files
    base = {"algorithm": "fedavg", "rounds": 1, "quiet": True, "data": str(tmp / "sites.csv")}
    with pytest.raises(DataError, match="--data needs --test"):
        run_training(base)
    with pytest.raises(DataError, match="give it with --public"):
        run_training({**base, "algorithm": "fedct", "test": str(tmp / "test.csv")})
    with pytest.raises(DataError, match="--test-size draw from a named --dataset"):
        run_training({**base, "test": str(tmp / "test.csv"), "test_size": 10})
    with pytest.raises(DataError, match="go with --data"):
        run_training({"algorithm": "fedavg", "test": str(tmp / "test.csv")})
    _write_csv(tmp / "narrow.csv", X[700:, :10], y[700:])
    with pytest.raises(DataError, match="10 features|the sites' have 64"):
        run_training({**base, "test": str(tmp / "narrow.csv")})
    unl = y[700:].copy()
    unl[3] = -1
    _write_csv(tmp / "unlabelled-test.csv", X[700:], unl)
    with pytest.raises(DataError, match="every test point needs its label"):
        run_training({**base, "test": str(tmp / "unlabelled-test.csv")})
    _write_csv(tmp / "one-site.csv", X[:100], labels[:100], ["only"] * 100)
    with pytest.raises(DataError, match="at least 2"):
        run_training({**base, "data": str(tmp / "one-site.csv"), "test": str(tmp / "test.csv")})
    # through the command line: a usage error, exit 2, no traceback
    r = subprocess.run([sys.executable, "-m", "cli", "simulate", "train", "--algorithm", "fedavg", "--data",
                        str(tmp / "sites.csv"), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 2 and "--data needs --test" in r.stderr and "Traceback" not in r.stderr
