"""`xclp simulate audit`: membership inference against what a training run releases
(xclp/audit.py runs it; this module reads flags, prints and draws the ROC curve)."""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np

from xclp.audit import run_audit
from xclp.data import DataError
from xclp.training.runner import TrainConfig, json_safe


def plot_roc(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    roc = result["roc"]
    ax.plot(np.maximum(roc["fpr"], 1e-5), np.maximum(roc["tpr"], 1e-5),
            label=f"{result['algorithm']} ({result['attack']}): AUC {result['auc']:.3f}")
    ax.plot([1e-5, 1], [1e-5, 1], ls="--", c="grey", lw=0.8, label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_audit(args) -> int:
    names = {f.name for f in fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in names and k not in ("json", "plot")})
    try:
        res = run_audit(cfg, args.attack, args.shadows, args.target)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot_roc(res, args.plot)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(json_safe(res), indent=1))
    print(f"{res['algorithm']} {res['target']}: membership inference ({res['attack']}) AUC {res['auc']:.3f}, TPR {res['tpr_at_1pct_fpr']:.3f} "
          f"at 1% FPR, {res['tpr_at_0.1pct_fpr']:.3f} at 0.1% FPR ({res['members']} members, {res['non_members']} "
          f"non-members; released model's test accuracy {res['model_test_accuracy']:.4f})")
    return 0

