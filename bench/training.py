"""Benchmark of the training loops: FedAvg+XCLP against its baselines, FedCT+XCLP against FedCT.

    .venv/bin/python -m bench.training [--quick] [--part fedavg|fedct|all] [--rounds T]

Writes docs/benchmarks_training.json, docs/benchmarks_training_table.md (the measured table, pasted
into docs/benchmarks_training.md by hand with the discussion) and a PNG of the accuracy curves per
split. Every method of a comparison runs with the same data, sites, labels, rounds, local epochs and
seed, in the same process, one after another (the machine is shared: compare within a run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cli.train import plot_runs
from xclp.training.runner import TrainConfig, run_training

DOCS = Path(__file__).resolve().parents[1] / "docs"

FEDAVG_METHODS = ("fedavg", "fedavg-per-site-lp", "fedavg-xclp")
SPLITS = ("iid", "dirichlet:0.5")


def fedavg_configs(quick: bool, rounds: int | None, splits=SPLITS) -> list[TrainConfig]:
    base = dict(dataset="fashion-mnist", sites=20, labels=1000, sites_per_round=5, local_epochs=5, model="mlp",
                bits=1024, seed=0, quiet=False, eval_every=1)
    if quick:
        base.update(train_size=4000, test_size=2000, labels=200, rounds=rounds or 3, local_epochs=2)
    else:
        # 20 sites × 1,000 points (a seeded 20k subset of the 60k training images) to fit ~5 min a method
        base.update(train_size=20_000, rounds=rounds or 30)
    return [TrainConfig(algorithm=a, split=s, **base) for s in splits for a in FEDAVG_METHODS]


def fedct_configs(quick: bool, rounds: int | None) -> list[TrainConfig]:
    base = dict(dataset="fashion-mnist", sites=5, split="iid", labels=250, public_size=3000, bits=1024, seed=0,
                quiet=False)
    if quick:
        base.update(train_size=5000, test_size=2000, labels=100, public_size=1000, rounds=rounds or 2)
    else:
        base.update(train_size=10_000, rounds=rounds or 4)
    return [TrainConfig(algorithm=a, model=m, **base) for m in ("tree", "forest") for a in ("fedct", "fedct-xclp")]


def summarise(run: dict) -> dict:
    h = run["history"]
    accs = [x["accuracy"] for x in h if x.get("accuracy") is not None]
    pseudo = [x["pseudo_label_accuracy"] for x in h if x.get("pseudo_label_accuracy") is not None]
    c = run["config"]
    return {
        "algorithm": run["algorithm"], "model": c.get("model"), "split": c["split"], "rounds": len(h),
        "final_accuracy": run["final_accuracy"], "best_accuracy": max(accs),
        "accuracy_std_sites": h[-1].get("accuracy_std"),
        "pseudo_label_accuracy_mean": sum(pseudo) / len(pseudo) if pseudo else None,
        "pseudo_label_accuracy_last": pseudo[-1] if pseudo else None,
        "xclp_pseudo_label_accuracy": h[-1].get("xclp_pseudo_label_accuracy"),
        "seconds": run["seconds"], "communication_bytes": run["communication_bytes"],
    }


def pct(v) -> str:
    return "–" if v is None else f"{100 * v:.2f}"


def table(results: dict) -> str:
    lines = []
    fa = [r for r in results["runs"] if r["algorithm"].startswith("fedavg")]
    if fa:
        lines += ["| split | method | final acc % | best acc % | pseudo-label acc % (mean over rounds) | Δ final vs fedavg | seconds |",
                  "|---|---|---|---|---|---|---|"]
        for split in SPLITS:
            rows = [r for r in fa if r["split"] == split]
            base = next((r["final_accuracy"] for r in rows if r["algorithm"] == "fedavg"), None)
            for r in rows:
                d = "–" if base is None else f"{100 * (r['final_accuracy'] - base):+.2f}"
                lines.append(f"| {split} | {r['algorithm']} | {pct(r['final_accuracy'])} | {pct(r['best_accuracy'])} | "
                             f"{pct(r['pseudo_label_accuracy_mean'])} | {d} | {r['seconds']:.0f} |")
        lines.append("")
    ct = [r for r in results["runs"] if r["algorithm"].startswith("fedct")]
    if ct:
        lines += ["| learner | method | mean site acc % (± std) | consensus acc on U % | XCLP pseudo-label acc % | "
                  "label bytes / exchange | seconds |", "|---|---|---|---|---|---|---|"]
        for r in ct:
            lines.append(f"| {r['model']} | {r['algorithm']} | {pct(r['final_accuracy'])} ± {pct(r['accuracy_std_sites'])} | "
                         f"{pct(r['pseudo_label_accuracy_last'])} | {pct(r['xclp_pseudo_label_accuracy'])} | "
                         f"{r['communication_bytes']['per_round_label_bytes']:,} | {r['seconds']:.0f} |")
        lines.append("")
    if "communication" in results:
        c = results["communication"]
        lines += ["| per round, 5 sites | bytes | ratio |", "|---|---|---|",
                  f"| FedAvg, MLP ({c['mlp_parameters']:,} parameters, 4 B each way) | {c['fedavg_bytes']:,} | 1 |",
                  f"| FedCT, hard labels on U ({c['public_size']:,} points, 4 bits each way) | {c['fedct_bytes']:,} | "
                  f"1/{c['fedavg_bytes'] / c['fedct_bytes']:.0f} |", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few rounds on small subsets (a smoke run)")
    p.add_argument("--part", choices=["fedavg", "fedct", "all", "report"], default="all",
                   help="report: only rebuild the table and plots from the JSON")
    p.add_argument("--merge", type=Path, nargs="*", default=[], help="add the runs of other result JSON files")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--splits", nargs="+", default=list(SPLITS), choices=SPLITS)
    p.add_argument("--out", type=Path, default=DOCS)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "benchmarks_training" + ("_quick" if args.quick else "")
    path = args.out / f"{stem}.json"
    results = json.loads(path.read_text()) if path.exists() else {"runs": [], "raw": []}
    for other in args.merge:
        extra = json.loads(other.read_text())["raw"]
        keys = {(r["algorithm"], r["config"]["model"], r["config"]["split"]) for r in extra}
        results["raw"] = [r for r in results["raw"]
                          if (r["algorithm"], r["config"]["model"], r["config"]["split"]) not in keys] + extra
        results["runs"] = [summarise(r) for r in results["raw"]]
    todo = []
    if args.part in ("fedavg", "all"):
        todo += fedavg_configs(args.quick, args.rounds, args.splits)
    if args.part in ("fedct", "all"):
        todo += fedct_configs(args.quick, args.rounds)
    for cfg in todo:
        print(f"== {cfg.algorithm} {cfg.model} {cfg.split}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        run = run_training(cfg)
        key = (run["algorithm"], run["config"]["model"], run["config"]["split"])
        results["raw"] = [r for r in results["raw"]
                          if (r["algorithm"], r["config"]["model"], r["config"]["split"]) != key] + [run]
        results["runs"] = [summarise(r) for r in results["raw"]]
        print(f"   final {run['final_accuracy']:.4f} in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        path.write_text(json.dumps(results, indent=1))
    fa = [r for r in results["raw"] if r["algorithm"].startswith("fedavg")]
    ct = [r for r in results["raw"] if r["algorithm"].startswith("fedct")]
    if fa and ct:
        n_params = fa[0]["communication_bytes"]["n_parameters"]
        results["communication"] = {
            "mlp_parameters": n_params, "fedavg_bytes": 8 * n_params * 5,
            "fedct_bytes": ct[0]["communication_bytes"]["per_round_label_bytes"],
            "public_size": ct[0]["communication_bytes"]["public_size"],
        }
    for split in SPLITS:
        runs = [r for r in fa if r["config"]["split"] == split]
        if runs:
            plot_runs(runs, args.out / f"{stem}_{split.replace(':', '')}.png",
                      title=f"Fashion-MNIST, 20 sites, {runs[0]['config']['labels']} labels, {split}")
    if ct:
        plot_runs(ct, args.out / f"{stem}_fedct.png", title="FedCT vs FedCT+XCLP, Fashion-MNIST, 5 sites")
    path.write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}_table.md").write_text(table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
