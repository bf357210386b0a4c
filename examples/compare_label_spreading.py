"""Per-site, federated and centralized label spreading on scikit-learn's digits, as estimators.

    python examples/compare_label_spreading.py [--sites 4] [--crypto lattice] [--out compare.png]

Each site alone fits `XCLPLabelSpreading` on its own points; `FederatedXCLP` runs the real XCLP
protocol over all sites in process (the chosen crypto, every message serialised); the centralized
reference pools every point in one `XCLPLabelSpreading`. Sites get the digits with a Dirichlet label
skew (xclp.splits), so that a site alone lacks examples of some classes. Features are scaled as XCLP
scales them: a site alone by its own points' moments (StandardScaler in a Pipeline), the pooled
reference by all points', the federation by all sites' (its secure-sum standardisation). Prints the accuracy on the
unlabelled points of each site and saves a bar chart (matplotlib; without it the table alone).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from sklearn.datasets import load_digits
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from crypto.hamming_api import PROTOCOLS
from xclp.estimator import FederatedXCLP, XCLPLabelSpreading
from xclp.splits import simulate_sites


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=4)
    p.add_argument("--split", default="dirichlet:0.3", help="iid or dirichlet:BETA (default dirichlet:0.3)")
    p.add_argument("--labeled-fraction", type=float, default=0.05)
    p.add_argument("--crypto", choices=PROTOCOLS, default="plaintext")
    p.add_argument("--bits", type=int, default=1024)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="compare_label_spreading.png", help="the plot (default %(default)s)")
    args = p.parse_args(argv)

    X, y = load_digits(return_X_y=True)
    ds = simulate_sites(X, y, args.sites, args.split, args.labeled_fraction, seed=args.seed)
    unl = ds.y < 0
    acc: dict[str, dict[str, float]] = {"per-site": {}, "federated": {}, "centralized": {}}

    # each site alone (a site with a single labelled class propagates it everywhere)
    for s in ds.sites:
        m = ds.site == s
        ys = ds.y[m]
        if np.unique(ys[ys >= 0]).size >= 2:
            pred = make_pipeline(StandardScaler(), XCLPLabelSpreading(k=args.k)).fit(X[m], ys)[-1].transduction_
        else:
            pred = np.full(m.sum(), ys[ys >= 0][0] if (ys >= 0).any() else -1)
        acc["per-site"][s] = float(np.mean(pred[ys < 0] == y[m][ys < 0]))

    fed = FederatedXCLP(k=args.k, bits=args.bits, crypto=args.crypto, random_state=args.seed).fit(X, ds.y, groups=ds.site)
    central = make_pipeline(StandardScaler(), XCLPLabelSpreading(k=args.k)).fit(X, ds.y)[-1]
    for name, model in (("federated", fed), ("centralized", central)):
        for s in ds.sites:
            m = (ds.site == s) & unl
            acc[name][s] = float(np.mean(model.transduction_[m] == y[m]))

    print(f"digits: {ds.n} points, {args.sites} sites ({args.split}), {int((~unl).sum())} labelled; "
          f"federated crypto={args.crypto}")
    print(f"{'site':<8}{'points':>8}{'labels':>8}" + "".join(f"{k:>13}" for k in acc))
    for s in ds.sites:
        m = ds.site == s
        print(f"{s:<8}{int(m.sum()):>8}{int((ds.y[m] >= 0).sum()):>8}" + "".join(f"{100 * acc[k][s]:>12.1f}%" for k in acc))
    overall = {k: float(np.average([v[s] for s in ds.sites], weights=[(unl & (ds.site == s)).sum() for s in ds.sites]))
               for k, v in acc.items()}
    print(f"{'all':<24}" + "".join(f"{100 * v:>12.1f}%" for v in overall.values()))
    print(f"federated job: {fed.bytes_['total']:,} bytes, {fed.timings_['total']:.2f} s "
          f"({', '.join(f'{k} {v:.2f}' for k, v in fed.timings_.items() if k != 'total')})")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.27
    xs = np.arange(len(ds.sites) + 1)
    for i, (name, v) in enumerate(acc.items()):
        ax.bar(xs + (i - 1) * width, [100 * v[s] for s in ds.sites] + [100 * overall[name]], width, label=name)
    ax.set_xticks(xs, ds.sites + ["all"])
    ax.set_ylabel("accuracy on unlabelled points (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Label spreading on digits: {args.sites} sites, {args.split}, crypto={args.crypto}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
