"""Membership inference against FedAvg, FedCT, FedKT and FREDY, and FedCT under DP (issue 11).

    .venv/bin/python -m bench.audit [--quick] [--shadows K] [--json bench/results/audit.json]
    .venv/bin/python -m bench.audit --target labels     # the shared labels (bench/results/audit_labels.json)

One setting for all: Fashion-MNIST, 5 sites (iid), a seeded pool of 6,000 training points, every
one labelled (the members), 2,000 test points (the non-members are drawn from them), MLP models
where the algorithm trains a network (FedAvg 20 rounds, FedCT 20 exchanges with |U| = 500, FREDY
10 FedAvg rounds then 500 queries), tree teachers / forest students for FedKT (|U| = 1,000). Each
row: `xclp audit --attack lira --shadows K` (LiRA offline, K shadow runs on pool points the target
never saw), with the loss-threshold attack on the same target beside it. VUL = the ROC AUC.
Published beside ours: FedCT paper (VUL of FedAvg 0.71–0.76, FedCT 0.51–0.53); FREDY paper (a
shadow-model attack's accuracy 0.71 without noise, 0.50 at its noisiest).

`--target labels`: the labels the run shares on public points instead of its model (FedCT's last
consensus on U, FedKT's labels of U2, FREDY's labels of the queries), attacked through the k-NN
proxy an attacker rebuilds from them (xclp/audit.py); the runs that share labels only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from xclp.audit import run_audit

RESULTS = Path(__file__).resolve().parent / "results" / "audit.json"
LABEL_RESULTS = Path(__file__).resolve().parent / "results" / "audit_labels.json"
SHARES_LABELS = ("fedct", "fedkt", "fredy")
BASE = {"dataset": "fashion-mnist", "sites": 5, "split": "iid", "train_size": 6000, "labels": 6000,
        "test_size": 2000, "quiet": True}
RUNS = [
    ("FedAvg (MLP)", {"algorithm": "fedavg", "model": "mlp", "rounds": 20, "sites_per_round": 5}),
    ("FedCT (MLP)", {"algorithm": "fedct", "model": "mlp", "rounds": 20, "public_size": 500, "labels": 5500}),
    ("FedCT (MLP), ε = 16", {"algorithm": "fedct", "model": "mlp", "rounds": 20, "public_size": 500, "labels": 5500,
                             "dp_epsilon": 16.0}),
    ("FedCT (MLP), ε = 4", {"algorithm": "fedct", "model": "mlp", "rounds": 20, "public_size": 500, "labels": 5500,
                            "dp_epsilon": 4.0}),
    ("FedCT (MLP), ε = 1", {"algorithm": "fedct", "model": "mlp", "rounds": 20, "public_size": 500, "labels": 5500,
                            "dp_epsilon": 1.0}),
    ("FedKT (trees → forest)", {"algorithm": "fedkt", "model": "tree", "public_size": 1000, "labels": 5000}),
    ("FREDY (MLP)", {"algorithm": "fredy", "model": "mlp", "rounds": 10, "public_size": 500, "labels": 5500}),
]
PAPERS = {"FedAvg (MLP)": "0.71–0.76 (FedCT paper)", "FedCT (MLP)": "0.51–0.53 (FedCT paper)",
          "FREDY (MLP)": "attack accuracy 0.71 without noise (FREDY paper)"}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(quick: bool, shadows: int, target: str = "model") -> list[dict]:
    rows = []
    base = BASE | ({"train_size": 1500, "labels": 1500, "test_size": 500} if quick else {})
    for name, cfg in RUNS:
        if target == "labels" and cfg["algorithm"] not in SHARES_LABELS:
            continue
        cfg = base | cfg
        if quick:
            cfg = cfg | {"labels": min(cfg["labels"], 1000), "rounds": min(cfg.get("rounds", 1), 3)}
        t0 = time.perf_counter()
        r = run_audit(cfg, attack="lira", shadows=shadows, target=target)
        row = {"name": name, "auc": r["auc"], "tpr_at_1pct_fpr": r["tpr_at_1pct_fpr"],
               "tpr_at_0.1pct_fpr": r["tpr_at_0.1pct_fpr"], "loss_auc": r["loss_attack"]["auc"],
               "loss_tpr_at_1pct_fpr": r["loss_attack"]["tpr_at_1pct_fpr"], "test_accuracy": r["model_test_accuracy"],
               "epsilon": (r["privacy"] or {}).get("epsilon"), "members": r["members"], "non_members": r["non_members"],
               "released_models": r["released_models"], "target": target,
               "published": PAPERS.get(name) if target == "model" else None, "config": cfg,
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        say(f"{name}: LiRA AUC {row['auc']:.3f}, loss AUC {row['loss_auc']:.3f}, test acc {row['test_accuracy']:.4f}")
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| released | test accuracy | ε (δ = 1e-5) | VUL: LiRA AUC | TPR at 1 % / 0.1 % FPR | loss-attack AUC | published |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        eps = "–" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        lines.append(f"| {r['name']} | {100 * r['test_accuracy']:.1f} % | {eps} | {r['auc']:.3f} | "
                     f"{r['tpr_at_1pct_fpr']:.3f} / {r['tpr_at_0.1pct_fpr']:.3f} | {r['loss_auc']:.3f} | {r['published'] or '–'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shadows", type=int, default=4)
    ap.add_argument("--target", choices=("model", "labels"), default="model")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    path = args.json or (LABEL_RESULTS if args.target == "labels" else RESULTS)
    rows = run(args.quick, args.shadows, args.target)
    path.parent.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.audit" + (" --quick" if args.quick else "") + \
        (" --target labels" if args.target == "labels" else "")
    path.write_text(json.dumps({"command": command, "shadows": args.shadows, "target": args.target, "rows": rows},
                               indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
