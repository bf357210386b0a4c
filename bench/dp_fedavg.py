"""DP-FedAvg inside secure aggregation: accuracy against the site-level budget (issue 11).

    .venv/bin/python -m bench.dp_fedavg [--quick] [--json bench/results/dp_fedavg.json]

Fashion-MNIST, a seeded pool of 20,000 training points dealt iid to 50 sites (every point labelled),
test on a seeded 5,000 of t10k; FedAvg (MLP) with every site in every round, 20 rounds, 1 local
epoch, secure aggregation (the fixed-point sum the noise shares live in), each update clipped to
L2 norm C = 1; the noise multiplier z calibrated by the ledger to spend ε at δ = 1e-5 over the 20
rounds (site level: replacing one site's whole data). The same run without noise and without
clipping, and clipped without noise, are the references.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from xclp.data import DataError
from xclp.training.runner import run_training

RESULTS = Path(__file__).resolve().parent / "results" / "dp_fedavg.json"
BASE = {"algorithm": "fedavg", "dataset": "fashion-mnist", "sites": 50, "split": "iid", "train_size": 20_000,
        "labels": 20_000, "test_size": 5000, "rounds": 20, "sites_per_round": 50, "local_epochs": 1,
        "secure_aggregation": True, "quiet": True}
EPSILONS = [1, 4, 16, 64, 256]


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    base = BASE | ({"train_size": 4000, "labels": 4000, "sites": 20, "sites_per_round": 20, "rounds": 5}
                   if args.quick else {})
    rows = []
    for label, extra in [("no clipping, no noise", {}), ("clipped (C = 1), no noise", {"clip": 1.0, "noise_multiplier": None})] + \
            [(f"ε = {e}", {"clip": 1.0, "dp_epsilon": float(e)}) for e in (EPSILONS[::2] if args.quick else EPSILONS)]:
        t0 = time.perf_counter()
        try:
            r = run_training(base | extra)
        except DataError as exc:  # so much noise that local training diverges: recorded, not hidden
            from xclp.privacy.gaussian_shares import multiplier_for_budget

            z = multiplier_for_budget(extra["dp_epsilon"], 1e-5, base["rounds"]) if "dp_epsilon" in extra else None
            rows.append({"run": label, "accuracy": None, "epsilon": extra.get("dp_epsilon"), "noise_multiplier": z,
                         "error": str(exc), "seconds": round(time.perf_counter() - t0, 1)})
            say(str(rows[-1]))
            continue
        row = {"run": label, "accuracy": r["final_accuracy"], "epsilon": r["privacy"]["epsilon"],
               "noise_multiplier": r.get("noise_multiplier"), "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        say(str(row))
    out = {"command": "python -m bench.dp_fedavg" + (" --quick" if args.quick else ""), "config": base, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print("| run | z | ε spent (δ = 1e-5) | test accuracy |\n|---|---:|---:|---:|")
    for r in rows:
        z = "–" if r["noise_multiplier"] is None else f"{r['noise_multiplier']:.3g}"
        eps = "–" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        acc = "diverged (the noise swamps the model)" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f} %"
        print(f"| {r['run']} | {z} | {eps} | {acc} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
