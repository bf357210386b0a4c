"""The README's privacy figure from the benchmarks' JSON (no training here).

    .venv/bin/python -m bench.privacy_plot    # reads bench/results/{fedkt,privacy_fedct,audit}.json

Left: accuracy against the ε budget (δ = 1e-5) — FedKT with server-side (L1) and party-side (L2)
noise (bench.fedkt), FedCT with randomized response on its labels (bench.privacy_fedct); the dotted
lines are the same runs without noise. Right: the membership-inference VUL (LiRA AUC) of what each
algorithm releases (bench.audit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
OUT = Path(__file__).resolve().parents[1] / "docs" / "privacy_tradeoff.png"


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.2, 1]})
    kt = json.loads((RESULTS / "fedkt.json").read_text())["curves"]
    for level, colour, label in (("L1", "C0", "FedKT L1 (server noise; a party)"),
                                 ("L2", "C1", "FedKT L2 (party noise; an example)")):
        rows = kt[level]
        left.plot([r["epsilon_budget"] for r in rows], [r["accuracy"] for r in rows], marker="o", c=colour, label=label)
    left.axhline(kt["no_noise"], ls=":", c="C0", lw=1)
    ct = json.loads((RESULTS / "privacy_fedct.json").read_text())["rows"]
    noisy = [r for r in ct if r["epsilon_budget"] is not None]
    left.plot([r["epsilon_budget"] for r in noisy], [r["accuracy"] for r in noisy], marker="s", c="C2",
              label="FedCT, randomized response (an example; digits)")
    left.axhline([r for r in ct if r["epsilon_budget"] is None][0]["accuracy"], ls=":", c="C2", lw=1)
    left.set_xscale("log")
    left.set_xlabel("ε budget (δ = 1e-5), over everything the run releases")
    left.set_ylabel("test accuracy")
    left.set_title("accuracy under a DP budget (dotted: no noise)", fontsize=10)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    audit = json.loads((RESULTS / "audit.json").read_text())["rows"]
    names = [r["name"] for r in audit]
    right.barh(names, [r["auc"] for r in audit], color="C3", alpha=0.8, label="LiRA")
    right.scatter([r["loss_auc"] for r in audit], names, c="k", marker="|", s=200, label="loss threshold", zorder=3)
    right.axvline(0.5, ls="--", c="grey", lw=1)
    right.set_xlim(0.45, max(0.8, max(r["auc"] for r in audit) + 0.02))
    right.invert_yaxis()
    right.set_xlabel("membership-inference AUC (VUL; 0.5 = no leakage)")
    right.set_title("what the released model says about its training data", fontsize=10)
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    plt.close(fig)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
