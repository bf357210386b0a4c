"""Feature scaling on a real table: XCLP on scikit-learn's breast-cancer data over three sites.

    .venv/bin/python -m bench.breast_cancer [--repeats 20] [--crypto plaintext|lattice] [--json OUT]

sklearn.datasets.load_breast_cancer (569 rows, 30 features on scales from 1e-3 to 4e3, two classes;
in the wheel, offline) dealt at random to three sites of 320 / 170 / 79 rows, 10 % of each site's
rows labelled (32 / 17 / 8), L = 1024, k = 10, α = 0.99. In one run, for each repeat (a new deal,
labelled rows and LSH seed; seeds 0..R−1), the accuracy on the unlabelled rows of:

  raw           XCLP on the raw features (`--no-standardize`)
  federated     XCLP with federated standardisation (the default: the moments from the secure sum)
  pooled        XCLP on features standardised beforehand with all 569 rows' moments, as if pooled
  alone         each site's label propagation on its own rows only (exact cosine: a site's best
                without XCLP), raw and scaled by its own rows' moments

`federated` and `pooled` see the same hyperplanes over features equal to 1e-9, so their labels
agree (the JSON counts any row where they differ). Results: bench/results/breast_cancer.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from xclp.baselines import label_spreading, standardised
from xclp.data import make_dataset
from xclp.job_params import JobParams
from xclp.simulation import run_xclp, unlabelled_accuracy
from xclp.splits import hide_labels

RESULTS = Path(__file__).resolve().parent / "results" / "breast_cancer.json"
SITE_ROWS = (320, 170, 79)
SITES = ("site0", "site1", "site2")


def load() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    return data.data.astype(np.float64), data.target.astype(np.int64)


def deal(X: np.ndarray, y: np.ndarray, seed: int, labelled: float):
    """Three sites of SITE_ROWS rows at random, `labelled` of each site's rows keeping their label."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    site_idx = np.empty(len(y), dtype=np.int64)
    for s, part in enumerate(np.split(order, np.cumsum(SITE_ROWS)[:-1])):
        site_idx[part] = s
    y_train = hide_labels(y, site_idx, labelled, rng)
    return make_dataset(X, y_train, np.array(SITES)[site_idx], y_true=y, n_classes=2)


def one_repeat(X, y, seed: int, args) -> dict:
    ds = deal(X, y, seed, args.labelled)
    common = dict(job_id=f"bc-{seed}", n_classes=2, bits=args.bits, k=args.k, alpha=args.alpha, crypto=args.crypto)
    runs = {
        "raw": run_xclp(ds, JobParams(**common, standardize=False).validate(), seed=seed),
        "federated": run_xclp(ds, JobParams(**common, standardize=True).validate(), seed=seed),
        "pooled": run_xclp(make_dataset(standardised(X), ds.y, ds.site, ds.y_true, 2),
                           JobParams(**common, standardize=False).validate(), seed=seed),
    }
    out = {"seed": seed, "labelled": {s: int(((ds.site == s) & (ds.y >= 0)).sum()) for s in SITES}}
    for name, res in runs.items():
        out[name] = {"all": unlabelled_accuracy(ds, res.labels),
                     **{s: unlabelled_accuracy(ds, res.labels, ds.site == s) for s in SITES}}
    out["federated_vs_pooled_rows_differing"] = int((runs["federated"].labels != runs["pooled"].labels).sum())
    for name, scale in (("alone_raw", False), ("alone_scaled", True)):
        labels = np.empty(ds.n, dtype=np.int64)
        for s in SITES:
            idx = np.flatnonzero(ds.site == s)
            Xs = standardised(ds.X[idx]) if scale else ds.X[idx]
            labels[idx] = label_spreading(Xs, ds.y[idx], 2, k=args.k, alpha=args.alpha).labels
        out[name] = {"all": unlabelled_accuracy(ds, labels),
                     **{s: unlabelled_accuracy(ds, labels, ds.site == s) for s in SITES}}
    return out


ROWS = (("raw", "XCLP, raw features (`--no-standardize`)"),
        ("federated", "XCLP, federated standardisation (default)"),
        ("pooled", "XCLP on pooled-standardised features (reference)"),
        ("alone_raw", "each site alone, raw features"),
        ("alone_scaled", "each site alone, its own rows' moments"))


def summary(reps: list[dict]) -> dict:
    out = {}
    for key, _ in ROWS:
        out[key] = {}
        for part in ("all", *SITES):
            vals = np.array([r[key][part] for r in reps])
            out[key][part] = {"mean": round(float(vals.mean()), 4), "std": round(float(vals.std()), 4)}
    out["federated_vs_pooled_rows_differing"] = int(sum(r["federated_vs_pooled_rows_differing"] for r in reps))
    return out


def markdown(s: dict, n: int) -> str:
    head = ("| run | all unlabelled rows | site0 (320 rows) | site1 (170) | site2 (79) |\n"
            "|---|---:|---:|---:|---:|")
    lines = [head]
    for key, label in ROWS:
        cells = [f"{100 * s[key][p]['mean']:.1f} ± {100 * s[key][p]['std']:.1f} %" for p in ("all", *SITES)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(f"\nMean ± standard deviation over {n} repeats; rows where federated and pooled standardisation "
                 f"label differently, over all repeats: {s['federated_vs_pooled_rows_differing']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--crypto", default="plaintext", help="plaintext (default; the secure protocols give the same "
                                                         "labels, tests/xclp/test_secure_pipeline.py) or lattice")
    p.add_argument("--bits", type=int, default=1024)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.99)
    p.add_argument("--labelled", type=float, default=0.1)
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    X, y = load()
    t0 = time.perf_counter()
    reps = []
    for seed in range(args.repeats):
        reps.append(one_repeat(X, y, seed, args))
        print(f"  repeat {seed}: raw {reps[-1]['raw']['all']:.3f} federated {reps[-1]['federated']['all']:.3f} "
              f"pooled {reps[-1]['pooled']['all']:.3f}", file=sys.stderr, flush=True)
    s = summary(reps)
    result = {"command": "python -m bench.breast_cancer " + " ".join(argv or sys.argv[1:]),
              "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "data": {"rows": int(len(y)), "features": int(X.shape[1]), "site_rows": list(SITE_ROWS),
                       "feature_scale": {"min_std": float(X.std(axis=0).min()), "max_std": float(X.std(axis=0).max())}},
              "seconds": round(time.perf_counter() - t0, 2), "summary": s, "repeats": reps,
              "markdown": markdown(s, args.repeats)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
