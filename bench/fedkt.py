"""FedKT against its baselines, one round, and its accuracy–ε curves (issue 11).

    .venv/bin/python -m bench.fedkt [--quick] [--part main|curves|all] [--json bench/results/fedkt.json]

Fashion-MNIST (t10k test subset of 5,000), 10 parties, Dirichlet β = 0.5, every training point of a
party labelled (FedKT is supervised), a public set U drawn from the pool first.

- main: FedKT without noise (s = 2 partitions, t = 5 teachers) with tree teachers / forest students
  and with MLP teachers / students, |U| = 10,000 (U1 = U2 = 5,000); in the same run SOLO (each
  party alone) and centralized PATE (all parties' data, 50 teachers, the same U2), and FedAvg with
  the same single round of communication (MLP, every party; the best of lr ∈ {0.1, 0.01, 0.001} ×
  E ∈ {1, 5} local epochs). Targets: FedKT ≥ SOLO
  + 15 points, > FedAvg one round, within 5 points of centralized PATE.
- curves: tree FedKT under a DP budget, δ = 1e-5, L1 (server noise, party-level) and L2 (party
  noise, example-level), |U| = 1,000 (U1 = U2 = 500, every point of U2 queried), ε from 1 to 1,024.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from xclp.training.runner import run_training

RESULTS = Path(__file__).resolve().parent / "results" / "fedkt.json"
BASE = {"algorithm": "fedkt", "dataset": "fashion-mnist", "sites": 10, "split": "dirichlet:0.5", "labels": 50_000,
        "test_size": 5000, "quiet": True}
EPSILONS = [1, 4, 16, 64, 256, 1024]


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main_part(quick: bool) -> dict:
    size = {"public_size": 2000, "train_size": 12_000, "labels": 10_000} if quick else {"public_size": 10_000}
    out = {}
    for name, model in (("trees", {"model": "tree"}), ("mlp", {"model": "mlp"})):
        t0 = time.perf_counter()
        r = run_training({**BASE, **size, **model, "baselines": True})
        b = r["baselines"]
        out[name] = {"fedkt": r["final_accuracy"], "solo": b["solo_mean_accuracy"], "pate_central": b["pate_central_accuracy"],
                     "label_accuracy_on_U2": r["history"][0]["pseudo_label_accuracy"],
                     "consistent_vote_rate": r["history"][0]["consistent_vote_rate"],
                     "bytes": r["communication_bytes"]["total"], "seconds": round(time.perf_counter() - t0, 1)}
        say(f"{name}: {out[name]}")
    # FedAvg's one round depends on its learning rate and local epochs (averaging models trained far
    # apart on skewed data can land at chance): the best of a small grid, every point reported
    grid = []
    for lr in (0.1, 0.01, 0.001):
        for epochs in (1, 5):
            fa = run_training({**BASE, **{k: v for k, v in size.items() if k != "public_size"}, "algorithm": "fedavg",
                               "model": "mlp", "rounds": 1, "sites_per_round": 10, "local_epochs": epochs, "lr": lr})
            grid.append({"lr": lr, "local_epochs": epochs, "accuracy": fa["final_accuracy"],
                         "bytes": fa["communication_bytes"]["total"]})
            say(f"fedavg, one round, lr {lr}, E = {epochs}: {fa['final_accuracy']:.4f}")
    best = max(grid, key=lambda g: g["accuracy"])
    out["fedavg_one_round"] = {**best, "grid": grid}
    for name in ("trees", "mlp"):
        r = out[name]
        r["over_solo_points"] = round(100 * (r["fedkt"] - r["solo"]), 1)
        r["below_pate_points"] = round(100 * (r["pate_central"] - r["fedkt"]), 1)
        r["over_fedavg_one_round_points"] = round(100 * (r["fedkt"] - out["fedavg_one_round"]["accuracy"]), 1)
        r["pass"] = {"solo_plus_15": r["over_solo_points"] >= 15, "beats_fedavg_one_round": r["over_fedavg_one_round_points"] > 0,
                     "within_5_of_pate": r["below_pate_points"] <= 5}
    return out


def curves(quick: bool) -> dict:
    size = {"public_size": 1000} | ({"train_size": 12_000, "labels": 10_000} if quick else {})
    out = {"L1": [], "L2": []}
    r = run_training({**BASE, **size, "model": "tree"})
    out["no_noise"] = r["final_accuracy"]
    say(f"no noise: {r['final_accuracy']:.4f}")
    for levels in ("L1", "L2"):
        for eps in (EPSILONS[::2] if quick else EPSILONS):
            r = run_training({**BASE, **size, "model": "tree", "levels": levels, "dp_epsilon": float(eps), "dp_delta": 1e-5})
            row = {"epsilon_budget": eps, "epsilon_spent": r["privacy"]["epsilon"], "gamma": r["gamma"],
                   "accuracy": r["final_accuracy"], "labelled_queries": r["history"][0]["labelled_queries"],
                   "neighbouring": r["privacy"]["neighbouring"]}
            out[levels].append(row)
            say(f"{levels} ε = {eps}: {row}")
    return out


def table(res: dict) -> str:
    lines = []
    if "main" in res:
        m = res["main"]
        lines += ["| learners | FedKT | SOLO | centralized PATE | FedAvg, one round (MLP) | FedKT − SOLO | PATE − FedKT |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, label in (("trees", "tree teachers, forest students"), ("mlp", "MLP teachers and students")):
            r = m[name]
            lines.append(f"| {label} | {100 * r['fedkt']:.1f} % | {100 * r['solo']:.1f} % | {100 * r['pate_central']:.1f} % | "
                         f"{100 * m['fedavg_one_round']['accuracy']:.1f} % | {r['over_solo_points']:+.1f} "
                         f"(target ≥ +15: {'PASS' if r['pass']['solo_plus_15'] else 'FAIL'}) | {r['below_pate_points']:.1f} "
                         f"(target ≤ 5: {'PASS' if r['pass']['within_5_of_pate'] else 'FAIL'}) |")
    if "curves" in res:
        c = res["curves"]
        lines += ["", "| ε budget (δ = 1e-5) | L1: γ | L1: accuracy | L2: γ | L2: accuracy |", "|---:|---:|---:|---:|---:|"]
        for a, b in zip(c["L1"], c["L2"]):
            lines.append(f"| {a['epsilon_budget']:g} | {a['gamma']:.4g} | {100 * a['accuracy']:.1f} % | {b['gamma']:.4g} | "
                         f"{100 * b['accuracy']:.1f} % |")
        lines.append(f"| ∞ (no noise) | – | {100 * c['no_noise']:.1f} % | – | {100 * c['no_noise']:.1f} % |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("main", "curves", "all"), default="all")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    res = {"command": "python -m bench.fedkt" + (" --quick" if args.quick else "")
           + ("" if args.part == "all" else f" --part {args.part}")}
    if args.part in ("main", "all"):
        res["main"] = main_part(args.quick)
    if args.part in ("curves", "all"):
        res["curves"] = curves(args.quick)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1))
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
