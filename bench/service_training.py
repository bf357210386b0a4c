"""Training through the service vs the same loop in process: time ratio, and equality of the models.

    .venv/bin/python -m bench.service_training [--data digits,fashion-mnist] [--rounds 10] [--repeats 2]
        [--json bench/results/service_training.json]

Data, scaled to [0, 1] and dealt iid to 3 sites (10 % of their points labelled): `digits` (1,437
points: 80 % of the set; a round's compute is a fraction of a second, so the service's fixed
latencies dominate) and `fashion-mnist` (a seeded 6,000-image subset, 2,000 a site: compute
dominates). Config: MLP, 3 sites a round, E = 2 local epochs, lr 0.1, `--rounds` rounds, seed 0.
For each data set and algorithm:

1. service: a coordinator (SQLite) and 3 agents as separate processes on 127.0.0.1 (`LocalCluster`
   of `xclp demo`), started, polling and warmed up by a one-round job (an agent imports torch at its
   first training job) before the jobs that are timed; the clock runs from the submit to the job's
   `done` (the evaluate phase included: every site scores the final model on its points);
2. in process: `xclp.training.fedavg.run_fedavg` with the same config (it scores the global model
   on a 10-point test set every round).

The service job uses secure aggregation (its default: masked updates; the simulation averages in the
same fixed-point arithmetic). `fedavg` must give the same final model bit for bit (checked); `fedavg-xclp` (plaintext XCLP, L = 256)
builds its graphs from LSH seeds the sites agree on at random, so only its time is compared. The
ratio is median(service) / median(in process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"
KNOBS = dict(sites_per_round=3, local_epochs=2, lr=0.1, bits=256, k=10, alpha=0.99, seed=0)


def _data(name: str) -> tuple[np.ndarray, np.ndarray]:
    from xclp.data import load_arrays, load_fashion_mnist_arrays

    if name == "digits":
        from sklearn.model_selection import train_test_split

        X, y = load_arrays("digits")
        X, _, y, _ = train_test_split(X / 16.0, y, test_size=0.2, stratify=y, random_state=0)
        return X.astype(np.float32), y
    X, y = load_fashion_mnist_arrays("train")
    idx = np.sort(np.random.default_rng(0).choice(len(y), 6000, replace=False))
    return X[idx].astype(np.float32), y[idx]  # already in [0, 1]


def _run(cluster, ds, knobs: dict, algorithm: str) -> tuple[float, bytes]:
    """(seconds from submit to done, the final model) of one training job on the cluster."""
    t = time.perf_counter()
    job = cluster.admin.submit_train(algorithm=algorithm, sites=ds.sites, classes=ds.n_classes, crypto="plaintext",
                                     **knobs)
    while (st := cluster.admin.job(job))["status"] == "running":
        time.sleep(0.05)
    seconds = time.perf_counter() - t
    if st["status"] != "done":
        raise SystemExit(f"{algorithm}: job failed: {st['failure']}")
    return seconds, cluster.admin.model(job)


def main(argv: list[str] | None = None) -> int:
    from cli.demo import LocalCluster
    from xclp.splits import simulate_sites
    from xclp.training.fedavg import FedAvgConfig, Site
    from xclp.training.messages import load_state
    from xclp.training.models import build_network
    from xclp.training.simulation import run_fedavg

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="digits,fashion-mnist")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=str(RESULTS / "service_training.json"))
    a = p.parse_args(argv)
    out = {"config": {**KNOBS, "rounds": a.rounds, "sites": 3, "repeats": a.repeats}, "runs": {}}
    for data in a.data.split(","):
        X, y = _data(data)
        ds = simulate_sites(X, y, 3, "iid", 0.1, seed=0)
        sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s]) for s in ds.sites]
        knobs = {**KNOBS, "rounds": a.rounds}
        with tempfile.TemporaryDirectory(prefix="xclp-bench-") as work:
            cluster = LocalCluster(Path(work), {s.name: {"X": s.X, "y": s.y} for s in sites},
                                   agent_options=["--allow-plaintext"])  # XCLP children in plaintext, opted in
            try:
                _run(cluster, ds, {**knobs, "rounds": 1}, "fedavg")  # warm-up: the agents import torch once
                for algorithm in ("fedavg", "fedavg-xclp"):
                    svc, local, equal = [], [], []
                    for rep in range(a.repeats):
                        t = time.perf_counter()
                        sim = run_fedavg(sites, (ds.X[:10], ds.y_true[:10]), ds.n_classes,
                                         FedAvgConfig(algorithm=algorithm, crypto="plaintext",
                                                      secure_aggregation=True, **knobs))
                        local.append(time.perf_counter() - t)
                        seconds, body = _run(cluster, ds, knobs, algorithm)
                        svc.append(seconds)
                        got, _ = load_state(body, build_network("mlp", X.shape[1], ds.n_classes, seed=0).state_dict())
                        want = sim["model"].state_dict()
                        equal.append(all(torch.equal(got[k], want[k]) for k in want))
                        print(f"{data} {algorithm} repeat {rep + 1}: service {svc[-1]:.1f} s, in process "
                              f"{local[-1]:.1f} s, same model: {equal[-1]}", flush=True)
                    out["runs"][f"{data}/{algorithm}"] = {
                        "data": data, "algorithm": algorithm, "points": ds.n,
                        "service_seconds": svc, "in_process_seconds": local,
                        "ratio": statistics.median(svc) / statistics.median(local),
                        "models_identical": all(equal) if algorithm == "fedavg" else None}
            finally:
                cluster.close()
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    for alg, r in out["runs"].items():
        print(f"{alg}: ratio {r['ratio']:.2f}× (service {statistics.median(r['service_seconds']):.1f} s, in process "
              f"{statistics.median(r['in_process_seconds']):.1f} s); identical models: {r['models_identical']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
