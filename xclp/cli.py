"""The `xclp` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from xclp.data import DataError


def _add_predict_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dataset", choices=["digits", "fashion-mnist", "mnist5k"], default=None,
                     help="a data set that installs offline (default: digits)")
    src.add_argument("--data", type=Path, help=".npz with X (n×d), y (−1 = unlabelled), site, optional y_true")
    p.add_argument("--limit", type=int, default=None, help="use a seeded random subset of N points")
    p.add_argument("--sites", type=int, default=5, help="number of simulated sites (default 5)")
    p.add_argument("--split", default="iid", help="iid or dirichlet:BETA (default iid)")
    p.add_argument("--labeled-fraction", type=float, default=0.1, help="labelled fraction per site (default 0.1)")
    p.add_argument("--unlabelled-sites", type=int, default=0,
                   help="how many sites (the last ones) hold no labels at all (default 0)")
    p.add_argument("--bits", type=int, default=1024, help="LSH length L (default 1024)")
    p.add_argument("--k", type=int, default=10, help="neighbours per point (default 10)")
    p.add_argument("--alpha", type=float, default=0.99, help="propagation α (default 0.99)")
    p.add_argument("--power", type=float, default=3.0, help="edge weight power (default 3)")
    p.add_argument("--similarity", choices=["lsh", "exact"], default="lsh",
                   help="lsh (private) or exact cosine (plaintext reference only)")
    p.add_argument("--crypto", choices=["plaintext", "paillier", "paillier-naive", "ot"], default="plaintext",
                   help="secure protocol for Hamming distances and row sums; plaintext = no security (reference)")
    p.add_argument("--key-bits", type=int, default=2048, help="Paillier modulus size (default 2048)")
    p.add_argument("--solver", choices=["auto", "cg", "dense"], default="auto")
    p.add_argument("--no-baselines", action="store_true", help="skip per-site and centralized LP")
    p.add_argument("--seed", type=int, default=0, help="fixes the split and the LSH hyperplanes")
    p.add_argument("--json", type=Path, help="write the results as JSON")
    p.add_argument("--predictions", type=Path, help="write labels and confidence (.npz, aligned with the rows)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def load_dataset(args):
    from xclp.data import dataset_from_npz, load_arrays
    from xclp.splits import simulate_sites

    if args.data is not None:
        ds = dataset_from_npz(args.data)
        if args.limit is not None and args.limit < ds.n:
            from xclp.data import make_dataset

            idx = np.sort(np.random.default_rng(args.seed).choice(ds.n, args.limit, replace=False))
            ds = make_dataset(ds.X[idx], ds.y[idx], ds.site[idx], None if ds.y_true is None else ds.y_true[idx])
        return ds, str(args.data)
    name = args.dataset or "digits"
    X, y = load_arrays(name, args.limit, args.seed)
    unl = tuple(range(args.sites - args.unlabelled_sites, args.sites)) if args.unlabelled_sites else ()
    if args.unlabelled_sites >= args.sites:
        raise DataError("--unlabelled-sites must leave at least one site with labels")
    return simulate_sites(X, y, args.sites, args.split, args.labeled_fraction, args.seed, unl,
                          n_classes=int(y.max()) + 1), name


def cmd_simulate_predict(args) -> int:
    from xclp.baselines import centralized_lp, per_site_lp
    from xclp.protocol import JobParams
    from xclp.simulation import run_xclp, unlabelled_accuracy

    ds, source = load_dataset(args)
    params = JobParams(job_id=f"sim-{args.seed}", n_classes=ds.n_classes, bits=args.bits, k=args.k,
                       alpha=args.alpha, power=args.power, similarity=args.similarity, crypto=args.crypto,
                       solver=args.solver, key_bits=args.key_bits).validate()
    say = (lambda m: None) if args.quiet else (lambda m: print(f"  · {m}", file=sys.stderr, flush=True))
    say(f"{source}: {ds.n} points, {len(ds.sites)} sites, {ds.n_classes} classes, "
        f"{int((ds.y >= 0).sum())} labelled")
    res = run_xclp(ds, params, seed=args.seed, progress=say)
    acc = {"xclp": unlabelled_accuracy(ds, res.labels)}
    base = {}
    t0 = time.perf_counter()
    if not args.no_baselines and ds.y_true is not None:
        say("baselines: per-site LP and centralized LP")
        kw = dict(k=args.k, alpha=args.alpha, power=args.power)
        base["per_site"] = per_site_lp(ds, **kw)
        base["centralized"] = centralized_lp(ds, **kw)
        for name, lab in base.items():
            acc[name] = unlabelled_accuracy(ds, lab)
    baseline_seconds = time.perf_counter() - t0
    per_site = {}
    for s in ds.sites:
        m = ds.site == s
        row = {"xclp": unlabelled_accuracy(ds, res.labels, m)}
        for name, lab in base.items():
            row[name] = unlabelled_accuracy(ds, lab, m)
        per_site[s] = row
    out = {
        "n": ds.n, "sites": len(ds.sites), "classes": ds.n_classes, "bits": args.bits, "crypto": args.crypto,
        "k": args.k, "alpha": args.alpha, "power": args.power, "similarity": args.similarity, "seed": args.seed,
        "dataset": source, "labelled": int((ds.y >= 0).sum()),
        "accuracy": {k: _num(v) for k, v in acc.items()},
        "per_site_accuracy": {s: {k: _num(v) for k, v in r.items()} for s, r in per_site.items()},
        "site_sizes": {s: {"n": int((ds.site == s).sum()), "labelled": int(((ds.y >= 0) & (ds.site == s)).sum())}
                       for s in ds.sites},
        "timings": {k: round(v, 4) for k, v in res.timings.items()},
        "baseline_seconds": round(baseline_seconds, 4),
        "bytes": res.bytes,
        "solver": res.solver,
    }
    _print_table(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    if args.predictions:
        np.savez(args.predictions, labels=res.labels, confidence=res.confidence)
    return 0


def _num(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else round(float(v), 6)


def _pct(v) -> str:
    return "   n/a" if v is None else f"{100 * v:6.2f}"


def _print_table(out: dict) -> None:
    cols = [c for c in ("xclp", "per_site", "centralized") if c in out["accuracy"]]
    print(f"\nXCLP on {out['dataset']}: n={out['n']}, {out['sites']} sites, {out['classes']} classes, "
          f"L={out['bits']}, k={out['k']}, crypto={out['crypto']}")
    print("accuracy on unlabelled points (%)")
    head = f"{'site':<12}{'points':>8}{'labels':>8}" + "".join(f"{c:>13}" for c in cols)
    print(head)
    print("-" * len(head))
    for s, r in out["per_site_accuracy"].items():
        z = out["site_sizes"][s]
        print(f"{s:<12}{z['n']:>8}{z['labelled']:>8}" + "".join(f"{_pct(r.get(c)):>13}" for c in cols))
    print("-" * len(head))
    print(f"{'all':<12}{out['n']:>8}{out['labelled']:>8}" + "".join(f"{_pct(out['accuracy'][c]):>13}" for c in cols))
    t = out["timings"]
    print("seconds: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()) + f"  (solver: {out['solver']})")
    print(f"bytes sent: {out['bytes']['total']:,}")


def cmd_bench_hamming(args) -> int:
    from xclp.bench_hamming import bench_hamming

    out = bench_hamming(args.protocol, args.sizes[0], args.sizes[1], args.bits, seed=args.seed,
                        key_bits=args.key_bits)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0 if out["exact"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xclp", description="Privacy-preserving cross-client label propagation")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="in-process simulations of XCLP jobs").add_subparsers(dest="what", required=True)
    pred = sim.add_parser("predict", help="one-shot transductive prediction over simulated sites")
    _add_predict_args(pred)
    pred.set_defaults(func=cmd_simulate_predict)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="what", required=True)
    bh = bench.add_parser("hamming", help="secure Hamming distance between two sites")
    bh.add_argument("--protocol", choices=["plaintext", "paillier-naive", "paillier", "ot"], required=True)
    bh.add_argument("--sizes", type=int, nargs=2, metavar=("NA", "NB"), default=[100, 100])
    bh.add_argument("--bits", type=int, default=1024)
    bh.add_argument("--key-bits", type=int, default=2048)
    bh.add_argument("--seed", type=int, default=0)
    bh.add_argument("--json", type=Path)
    bh.set_defaults(func=cmd_bench_hamming)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (DataError, ValueError) as exc:
        print(f"xclp: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
