"""FREDY: the released student's accuracy against ε and the number of queries (issue 11).

    .venv/bin/python -m bench.fredy [--quick] [--json bench/results/fredy.json]

Fashion-MNIST, a seeded pool of 12,000 points dealt iid to 10 sites (9,000 of them labelled), test
on a seeded 5,000 of t10k; FedAvg (MLP) 10 rounds with 5 sites a round, 2 local epochs — the
teachers' common start, the same model in every run (same seed) — then, for every (Q, ε), the voting round: every site's teacher (the global
model fine-tuned on its own labels) labels Q public queries, the server adds discrete Laplace
noise to the counts, and the student (an MLP) is trained on the labelled queries. ε at δ = 1e-5,
example level, with every teacher as the sensitivity (one example reaches all of them through
FedAvg): Q ∈ {100, 500, 2,000} × ε ∈ {16, 64, 256, 1,024, ∞}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from xclp.training.fredy import FREDYConfig
from xclp.training.runner import TrainConfig, prepare
from xclp.training.simulation import run_fredy

RESULTS = Path(__file__).resolve().parent / "results" / "fredy.json"
DATA = {"algorithm": "fredy", "dataset": "fashion-mnist", "sites": 10, "split": "iid", "train_size": 12_000,
        "labels": 9000, "public_size": 2000, "test_size": 5000, "quiet": True}
FEDAVG = {"rounds": 10, "sites_per_round": 5, "local_epochs": 2}
QUERIES = [100, 500, 2000]
EPSILONS = [16, 64, 256, 1024, None]


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    data = DATA | ({"train_size": 3000, "labels": 2000, "public_size": 500} if args.quick else {})
    fed = FEDAVG | ({"rounds": 3} if args.quick else {})
    queries = [100, 500] if args.quick else QUERIES
    sites, public, test, n_classes = prepare(TrainConfig(**data, **fed))
    base = FREDYConfig(**fed).validate()
    rows, fedavg_accuracy = [], None
    # each cell is one run through the core's machines (xclp.training.simulation.run_fredy): FedAvg's
    # rounds repeat in every run, to the same model (the same seed), then the vote
    for q in queries:
        for eps in EPSILONS:
            cfg = replace(base, queries=q, dp_epsilon=None if eps is None else float(eps)).validate()
            vote = run_fredy(sites, public[0], test, n_classes, cfg, public_y=public[1])
            fedavg_accuracy = vote["fedavg_accuracy"]
            last = vote["history"][-1]
            rows.append({"queries": q, "epsilon_budget": eps, "epsilon_spent": vote["privacy"]["epsilon"],
                         "gamma": vote["gamma"], "student_accuracy": last["accuracy"],
                         "labelled_queries": last["labelled_queries"], "label_accuracy": last["pseudo_label_accuracy"]})
            say(str(rows[-1]))
    out = {"command": "python -m bench.fredy" + (" --quick" if args.quick else ""), "data": data, "fedavg": fed,
           "fedavg_accuracy": fedavg_accuracy, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print("| queries | " + " | ".join("no noise" if e is None else f"ε = {e}" for e in EPSILONS) + " |")
    print("|---:|" + "---:|" * len(EPSILONS))
    for q in queries:
        cells = [r for r in rows if r["queries"] == q]
        print(f"| {q} | " + " | ".join(f"{100 * r['student_accuracy']:.1f} %" for r in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
