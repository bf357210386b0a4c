"""Label-DP for XCLP itself: accuracy on the unlabelled points against ε (issue 11, item 6).

    .venv/bin/python -m bench.xclp_dp [--quick] [--json bench/results/xclp_dp.json]

Fashion-MNIST, a seeded 5,000 training points dealt iid to 5 sites, 10 % of each site's points
labelled (500 labels), L = 1024, k = 10 (the defaults of `xclp simulate predict`), plaintext sums (the
secure protocols give the same labels for the same noise: tests/xclp/test_label_dp.py). For each ε at
δ = 1e-5 (label level: replacing one label), both mechanisms of xclp/privacy/label_dp.py, calibrated
by the same code as `--dp-epsilon`:
  rr        randomized response on every site's labels before any sum (pure ε)
  gaussian  Gaussian noise shares inside the label-count sum and SecureRowSums, columns clipped to C
            (C = 1 and C = 4)
The exact run (no noise) is the reference; each cell is the mean over 3 noise draws (seeds 0–2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from xclp.data import DataError, load_arrays
from xclp.job_params import JobParams
from xclp.privacy import label_dp
from xclp.simulation import run_xclp, unlabelled_accuracy
from xclp.splits import simulate_sites

RESULTS = Path(__file__).resolve().parent / "results" / "xclp_dp.json"
EPSILONS = [0.5, 1, 2, 4, 8, 16, 64, 256]
SEEDS = (0, 1, 2)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def mean_accuracy(ds, params: JobParams) -> float:
    # Same graph (LSH seed from the data seed), a different noise draw per seed.
    accs = [unlabelled_accuracy(ds, run_xclp(ds, dataclasses.replace(params, job_id=f"dp{s}"), seed=s).labels)
            for s in SEEDS]
    return round(float(np.mean(accs)), 4)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="digits (1,797 points) instead of Fashion-MNIST")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    name, limit = ("digits", None) if args.quick else ("fashion-mnist", 5000)
    try:
        X, y = load_arrays(name, limit, 0)
    except DataError as exc:
        print(f"bench.xclp_dp: {exc}", file=sys.stderr)
        return 2
    ds = simulate_sites(X, y, 5, "iid", 0.1, 0, (), n_classes=int(y.max()) + 1)
    base = JobParams(job_id="dp", n_classes=ds.n_classes)
    exact = mean_accuracy(ds, base)
    say(f"{name}: {ds.n} points, exact XCLP {exact:.4f}")
    rows = []
    for eps in EPSILONS:
        p = label_dp.flip_for_budget(eps, 1e-5, ds.n_classes)
        z = label_dp.multiplier_for_budget(eps, 1e-5)
        row = {"epsilon": eps, "label_flip": round(p, 6), "noise_multiplier": round(z, 6),
               "rr": mean_accuracy(ds, dataclasses.replace(base, label_flip=p))}
        for clip in (1.0, 4.0):
            row[f"gaussian_C{clip:g}"] = mean_accuracy(ds, dataclasses.replace(base, dp_noise=z, dp_clip=clip))
        say(json.dumps(row))
        rows.append(row)
    out = {"dataset": name, "n": ds.n, "sites": 5, "labelled": int((ds.y >= 0).sum()), "delta": 1e-5,
           "exact": exact, "rows": rows, "seeds": list(SEEDS)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"\n| ε | rr: p | rr | gaussian z | gaussian C=1 | gaussian C=4 |  (exact {exact:.1%})")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['epsilon']:g} | {r['label_flip']:.3f} | {r['rr']:.1%} | {r['noise_multiplier']:.3f} | "
              f"{r['gaussian_C1']:.1%} | {r['gaussian_C4']:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
