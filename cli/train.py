"""`xclp simulate train`, `xclp simulate audit`'s training flags and `xclp plot`: the command line of the
in-process training loops (xclp/training/runner.py runs them; this module only reads flags, prints
and draws)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from xclp.data import DataError
from xclp.training.options import ALGORITHMS, CRYPTO_CHOICES, LEARNERS, TIE_RULES  # noqa: F401 — the flags' choices
from xclp.training.runner import TrainConfig, as_run, run_label, run_training


def plot_runs(runs, out_png: str | Path, title: str | None = None) -> Path:
    """Test accuracy per round, one line per run (results or paths of their JSON files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [as_run(json.loads(Path(r).read_text()) if isinstance(r, (str, Path)) else r) for r in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in loaded:
        key = run.get("metric", "accuracy")
        pts = [(h["round"], h[key]) for h in run["history"] if h.get(key) is not None]
        of = next((h.get("local_accuracy_of") for h in run["history"] if h.get("local_accuracy_of")), None)
        label = run_label(run) + (f" — {of or 'on the sites own points'}" if key == "local_accuracy" else "")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 40 else None, label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (test set; service jobs: as each curve says)" if any(
        r.get("metric") == "local_accuracy" for r in loaded) else "test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


def cmd_plot(args: argparse.Namespace) -> int:
    try:
        out = plot_runs(args.runs, args.out, title=args.title)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def cmd_simulate_train(args: argparse.Namespace) -> int:
    names = {f.name for f in fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in names})
    try:
        out = run_training(cfg)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot_runs([out], args.plot)
    comm = out["communication_bytes"]
    print(f"{out['algorithm']}: final accuracy {out['final_accuracy']:.4f} after {len(out['history'])} rounds, "
          f"{out['seconds']:.1f}s, communication {comm['total'] / 1e6:.2f} MB"
          + ("" if out["privacy"]["epsilon"] is None else
             f", ({out['privacy']['epsilon']:.3g}, {out['privacy']['delta']:g})-DP: "
             f"{out['privacy']['neighbouring']}"))
    return 0
