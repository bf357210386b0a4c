"""Choosing k, L and α: XCLP's accuracy on the unlabelled points as each moves from the default.

    .venv/bin/python -m bench.xclp_params [--data breast-cancer|fashion-mnist|both] [--json OUT]

One parameter at a time around the defaults (k = 10, L = 1024, α = 0.99; federated standardisation
on), plaintext sums (the secure protocols give the same labels), the mean over repeats (a new deal,
labelled points and LSH seed each):

  breast-cancer  scikit-learn's table, three sites of 320 / 170 / 79 rows, 10 % labelled
                 (bench/breast_cancer.py's deal), 10 repeats
  fashion-mnist  a seeded 6,000 training images, 5 sites, Dirichlet β = 0.5, 10 % labelled, 2 repeats

The seconds are the XCLP run's own (mean per run), to show what L and k cost. Results:
bench/results/xclp_params.json; the table is in docs/operating.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.breast_cancer import deal, load
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.simulation import run_xclp, unlabelled_accuracy
from xclp.splits import simulate_sites

RESULTS = Path(__file__).resolve().parent / "results" / "xclp_params.json"
DEFAULTS = {"k": 10, "bits": 1024, "alpha": 0.99}
SWEEP = {"k": [3, 5, 10, 20, 40], "bits": [64, 256, 1024, 4096], "alpha": [0.5, 0.9, 0.99, 0.999]}


def datasets(name: str, repeats: int | None):
    if name == "breast-cancer":
        X, y = load()
        return [deal(X, y, seed, 0.1) for seed in range(repeats or 10)]
    X, y = load_arrays("fashion-mnist", limit=6000, seed=0)
    return [simulate_sites(X, y, 5, "dirichlet:0.5", 0.1, seed=seed) for seed in range(repeats or 2)]


def sweep(name: str, repeats: int | None, only: list[str] | None = None) -> list[dict]:
    data = datasets(name, repeats)
    rows = []
    for param, values in SWEEP.items():
        if only and param not in only:
            continue
        for v in values:
            kw = {**DEFAULTS, param: v}
            acc, secs = [], []
            for seed, ds in enumerate(data):
                p = JobParams(job_id=f"sweep-{seed}", n_classes=ds.n_classes, crypto="plaintext", **kw).validate()
                t0 = time.perf_counter()
                res = run_xclp(ds, p, seed=seed)
                secs.append(time.perf_counter() - t0)
                acc.append(unlabelled_accuracy(ds, res.labels))
            rows.append({"data": name, "param": param, "value": v, **kw, "accuracy": round(float(np.mean(acc)), 4),
                         "accuracy_std": round(float(np.std(acc)), 4), "seconds": round(float(np.mean(secs)), 3),
                         "repeats": len(data)})
            print(f"  {name}: {param}={v}: {100 * rows[-1]['accuracy']:.1f} % ({rows[-1]['seconds']:.2f} s)",
                  file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    names = list(dict.fromkeys(r["data"] for r in rows))
    head = "| parameter | value | " + " | ".join(f"{n}: accuracy | {n}: seconds" for n in names) + " |"
    lines = [head, "|---|---:|" + "---:|---:|" * len(names)]
    for param, values in SWEEP.items():
        if not any(r["param"] == param for r in rows):
            continue
        for v in values:
            cells = []
            for n in names:
                r = next((r for r in rows if r["data"] == n and r["param"] == param and r["value"] == v), None)
                if r is None:  # not swept in this run (--only)
                    cells += ["–", "–"]
                    continue
                spread = f" ± {100 * r['accuracy_std']:.1f}" if r["repeats"] > 1 else ""  # one repeat: no spread
                cells += [f"{100 * r['accuracy']:.1f}{spread} %", f"{r['seconds']:.2f}"]
            mark = " (default)" if DEFAULTS[param] == v else ""
            lines.append(f"| {'L' if param == 'bits' else param} | {v}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", choices=["breast-cancer", "fashion-mnist", "both"], default="both")
    p.add_argument("--repeats", type=int, default=None, help="repeats per setting (default 10 / 2)")
    p.add_argument("--only", action="append", choices=list(SWEEP), help="sweep only this parameter (repeatable)")
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for name in (["breast-cancer", "fashion-mnist"] if args.data == "both" else [args.data]):
        rows += sweep(name, args.repeats, args.only)
    out = {"command": "python -m bench.xclp_params " + " ".join(argv or sys.argv[1:]), "defaults": DEFAULTS,
           "sweep": SWEEP, "seconds": round(time.perf_counter() - t0, 1), "rows": rows, "markdown": markdown(rows)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(out["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
