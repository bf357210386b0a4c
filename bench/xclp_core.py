"""XCLP core benchmark: accuracy, the influence solve vs the authors' dense inverse, and the pipeline.

    .venv/bin/python -m bench.xclp_core [--quick] [--no-standardize] [--parts accuracy,influence]
                                        [--json bench/results/xclp_core.json]

One run measures, on the same data and the same machine:

1. accuracy on Fashion-MNIST (train split, seeded subset), Dirichlet(β) label skew over sites, a
   fraction of each site labelled: XCLP (plaintext crypto, `run_xclp`) at several LSH lengths L vs
   per-site LP and centralized exact-cosine LP; targets: XCLP(L=4096) − per-site ≥ 3 points and
   centralized − XCLP(L=4096) ≤ 1.5 points. Every method sees the same features: XCLP standardises by
   default (federated standardisation), so per-site LP scales each site by its own moments, the
   centralized LP and scikit-learn by the pooled ones (xclp.baselines' `standardize`);
   `--no-standardize` compares all of them on raw features (the tables before standardisation became
   XCLP's default);
2. the influence step: `influence_columns` (auto, cg) vs `dense_inverse_columns` (the authors'
   route) on one exact-cosine kNN graph, 10% labelled columns (target ≥ 5× faster, same argmax of
   S_L·Y); then a larger graph, where only the sparse solve runs, in a child process whose peak RSS
   (ru_maxrss) is read before and after the solve;
3. the whole plaintext pipeline vs scikit-learn's LabelSpreading(knn) on the pooled data, for context.

Timings are wall clock on a shared machine: compare the ratios measured within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FULL = dict(n=10_000, sites=10, beta=0.5, labelled=0.1, k=10, alpha=0.99, power=3.0, bits=(256, 1024, 4096),
            pipeline_bits=1024, target_bits=4096, infl_n=6_000, big_n=20_000, big_frac=0.1)
QUICK = dict(n=2_000, sites=5, beta=0.5, labelled=0.1, k=10, alpha=0.99, power=3.0, bits=(256, 1024),
             pipeline_bits=1024, target_bits=1024, infl_n=2_000, big_n=4_000, big_frac=0.1)


def now() -> float:
    return time.perf_counter()


def log(msg: str) -> None:
    print(f"  · {msg}", file=sys.stderr, flush=True)


def mean_spread(values: list[float]) -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "min": float(a.min()), "max": float(a.max()),
            "std": float(a.std(ddof=1)) if a.size > 1 else 0.0, "values": [float(v) for v in a], "n": int(a.size)}


# --- 1. accuracy ---------------------------------------------------------------------------------

def make_ds(cfg: dict, seed: int):
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites

    X, y = load_arrays("fashion-mnist", cfg["n"], seed)
    return simulate_sites(X, y, cfg["sites"], f"dirichlet:{cfg['beta']}", cfg["labelled"], seed, n_classes=10)


def accuracy_part(cfg: dict, seeds: list[int], extra_seeds: list[int]) -> dict:
    from xclp.baselines import centralized_lp, per_site_lp, standardised
    from xclp.job_params import JobParams
    from xclp.simulation import run_xclp, unlabelled_accuracy

    kw = dict(k=cfg["k"], alpha=cfg["alpha"], power=cfg["power"])
    scale = bool(cfg["standardize"])  # XCLP's and every baseline's features alike
    runs = []
    for seed in seeds + extra_seeds:
        ds = make_ds(cfg, seed)
        run = {"seed": seed, "labelled": int((ds.y >= 0).sum()), "xclp": {}, "xclp_seconds": {}, "xclp_timings": {}}
        bits_list = cfg["bits"] if seed in seeds else (cfg["target_bits"],)
        for L in bits_list:
            log(f"seed {seed}: XCLP L={L}")
            params = JobParams(job_id=f"bench-{seed}-{L}", n_classes=ds.n_classes, bits=L, standardize=scale,
                               **kw).validate()
            t = now()
            res = run_xclp(ds, params, seed=seed)
            run["xclp_seconds"][str(L)] = now() - t
            run["xclp"][str(L)] = unlabelled_accuracy(ds, res.labels)
            run["xclp_timings"][str(L)] = {k: round(v, 4) for k, v in res.timings.items()}
            run.setdefault("solver", res.solver)
        log(f"seed {seed}: per-site LP")
        t = now()
        run["per_site"] = unlabelled_accuracy(ds, per_site_lp(ds, standardize=scale, **kw))
        run["per_site_seconds"] = now() - t
        log(f"seed {seed}: centralized exact LP")
        t = now()
        run["centralized"] = unlabelled_accuracy(ds, centralized_lp(ds, standardize=scale, **kw))
        run["centralized_seconds"] = now() - t
        if seed == seeds[0]:
            log(f"seed {seed}: scikit-learn LabelSpreading(knn)")
            from sklearn.semi_supervised import LabelSpreading

            t = now()
            sk = LabelSpreading(kernel="knn", n_neighbors=cfg["k"], alpha=cfg["alpha"]).fit(
                standardised(ds.X) if scale else ds.X, ds.y)
            run["sklearn_seconds"] = now() - t
            run["sklearn"] = unlabelled_accuracy(ds, sk.transduction_)
            run["sklearn_iterations"] = int(sk.n_iter_)
        runs.append(run)
        log(f"seed {seed}: " + json.dumps({k: run[k] for k in ("xclp", "per_site", "centralized")}))
    T = str(cfg["target_bits"])
    gain = [r["xclp"][T] - r["per_site"] for r in runs]
    gap = [r["centralized"] - r["xclp"][T] for r in runs]
    summary = {
        "xclp": {L: mean_spread([r["xclp"][L] for r in runs if L in r["xclp"]]) for L in map(str, cfg["bits"])},
        "per_site": mean_spread([r["per_site"] for r in runs]),
        "centralized": mean_spread([r["centralized"] for r in runs]),
        "gain_over_per_site": mean_spread(gain),
        "gap_to_centralized": mean_spread(gap),
    }
    targets = {
        f"xclp_L{T}_beats_per_site_by_3_points": bool(np.mean(gain) >= 0.03),
        f"xclp_L{T}_within_1.5_points_of_centralized": bool(np.mean(gap) <= 0.015),
        "all_seeds_beat_per_site_by_3_points": bool(min(gain) >= 0.03),
        "all_seeds_within_1.5_points_of_centralized": bool(max(gap) <= 0.015),
    }
    return {"runs": runs, "summary": summary, "targets": targets, "target_bits": cfg["target_bits"]}


# --- 2. influence step ---------------------------------------------------------------------------

def labelled_columns(n: int, frac: float, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(n, size=int(round(frac * n)), replace=False))


def influence_part(cfg: dict, seed: int) -> dict:
    from xclp.baselines import build_graph
    from xclp.data import load_arrays
    from xclp.influence import dense_inverse_columns, influence_columns
    from xclp.propagation import class_counts, label_matrix

    n = cfg["infl_n"]
    X, y = load_arrays("fashion-mnist", n, seed + 1)
    log(f"influence: exact-cosine kNN graph, n={n}")
    t = now()
    W = build_graph(X, cfg["k"], cfg["power"], "exact")
    graph_s = now() - t
    cols = labelled_columns(n, cfg["labelled"], seed)
    Y = label_matrix(y[cols], class_counts(y[cols], 10), True)
    out = {"n": n, "columns": int(cols.size), "nnz": int(W.nnz), "graph_seconds": graph_s, "methods": {}}
    log("influence: dense inverse (authors' route)")
    t = now()
    S_ref = dense_inverse_columns(W, cols, cfg["alpha"])
    out["methods"]["dense_inverse"] = {"seconds": now() - t}
    ref_arg = (S_ref @ Y).argmax(axis=1)
    for method in ("auto", "cg"):
        log(f"influence: influence_columns(method={method!r})")
        t = now()
        S, info = influence_columns(W, cols, cfg["alpha"], method=method)
        sec = now() - t
        arg = (S @ Y).argmax(axis=1)
        out["methods"][method] = {
            "seconds": sec, "solver": info.method, "iterations": info.iterations,
            "max_relative_residual": info.max_relative_residual,
            "speedup_vs_dense_inverse": out["methods"]["dense_inverse"]["seconds"] / sec,
            "argmax_agreement": float(np.mean(arg == ref_arg)),
            "max_abs_diff": float(np.max(np.abs(S - S_ref))),
            "max_abs_entry": float(np.max(np.abs(S_ref))),
        }
        del S
    out["target_5x_auto"] = bool(out["methods"]["auto"]["speedup_vs_dense_inverse"] >= 5.0)
    out["target_5x_cg"] = bool(out["methods"]["cg"]["speedup_vs_dense_inverse"] >= 5.0)
    del S_ref
    return out


def current_rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child_solve(path: str, alpha: float, method: str) -> None:
    """Child process: load W and the columns, read the RSS high-water mark, solve, read it again."""
    import scipy.sparse as sp

    from xclp.influence import influence_columns

    W = sp.load_npz(path + ".W.npz").tocsr()
    cols = np.load(path + ".cols.npy")
    base = current_rss_kib()  # the RSS now (ru_maxrss may already be higher, from imports and loading)
    t = now()
    S, info = influence_columns(W, cols, alpha, method=method)
    sec = now() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": sec, "solver": info.method, "iterations": info.iterations,
                      "max_relative_residual": info.max_relative_residual, "baseline_rss_mb": base / 1024,
                      "peak_maxrss_mb": peak / 1024, "solve_peak_increase_mb": max(peak - base, 0) / 1024,
                      "output_mb": S.nbytes / 2**20}))


def big_influence_part(cfg: dict, seed: int, small: dict) -> dict:
    import scipy.sparse as sp

    from xclp.baselines import build_graph
    from xclp.data import load_arrays

    n = cfg["big_n"]
    X, _ = load_arrays("fashion-mnist", n, seed + 2)
    log(f"influence: exact-cosine kNN graph, n={n}")
    t = now()
    W = build_graph(X, cfg["k"], cfg["power"], "exact")
    graph_s = now() - t
    cols = labelled_columns(n, cfg["big_frac"], seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g")
        sp.save_npz(path + ".W.npz", W)
        np.save(path + ".cols.npy", cols)
        log(f"influence: influence_columns(auto) on n={n}, {cols.size} columns, in a child process")
        proc = subprocess.run([sys.executable, "-m", "bench.xclp_core", "--child-solve", path,
                               "--alpha", str(cfg["alpha"])], capture_output=True, text=True,
                              cwd=str(Path(__file__).resolve().parents[1]))
    if proc.returncode != 0:
        return {"n": n, "columns": int(cols.size), "error": proc.stderr[-2000:]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    n0, d0 = small["n"], small["methods"]["dense_inverse"]["seconds"]
    res.update({
        "n": n, "columns": int(cols.size), "nnz": int(W.nnz), "graph_seconds": graph_s,
        "dense_inverse": "skipped (not run)",
        "dense_inverse_extrapolated_seconds": d0 * (n / n0) ** 3,
        "dense_inverse_matrix_gb": n * n * 8 / 1e9,
        "target_memory_within_4gb": bool(res["peak_maxrss_mb"] < 4096),
    })
    return res


# --- report ----------------------------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{100 * x:.2f}"


def ms(d: dict) -> str:
    if d["n"] == 1:
        return pct(d["mean"])
    return f"{pct(d['mean'])} ± {100 * d['std']:.2f} (min {pct(d['min'])}, max {pct(d['max'])}, {d['n']} seeds)"


def markdown(out: dict) -> str:
    cfg, acc = out["config"], out["accuracy"]
    lines = [f"### 1. Accuracy on unlabelled points (Fashion-MNIST train, n = {cfg['n']}, {cfg['sites']} sites, "
             f"Dirichlet β = {cfg['beta']}, {int(100 * cfg['labelled'])}% labelled per site, k = {cfg['k']}, "
             f"α = {cfg['alpha']}, power {cfg['power']:g}; features "
             + ("standardised for every method: XCLP federated, per-site LP by each site's moments, centralized "
                "and scikit-learn by the pooled ones)" if cfg.get("standardize", False) else "raw for every method)"),
             "",
             "| method | accuracy % | time (s, first seed) |", "|---|---|---|"]
    r0 = acc["runs"][0]
    lines.append(f"| per-site LP | {ms(acc['summary']['per_site'])} | {r0['per_site_seconds']:.1f} |")
    for L, d in acc["summary"]["xclp"].items():
        sec = r0["xclp_seconds"].get(L)
        inf = r0["xclp_timings"].get(L, {}).get("influence")
        lines.append(f"| XCLP plaintext, L = {L} | {ms(d)} | {sec:.1f} (influence {inf:.1f}) |")
    lines.append(f"| centralized exact LP | {ms(acc['summary']['centralized'])} | {r0['centralized_seconds']:.1f} |")
    s = acc["summary"]
    T = acc["target_bits"]
    lines += ["", f"XCLP(L={T}) − per-site: {100 * s['gain_over_per_site']['mean']:+.2f} points "
              f"(per seed {[round(100 * v, 2) for v in s['gain_over_per_site']['values']]}); "
              f"centralized − XCLP(L={T}): {100 * s['gap_to_centralized']['mean']:+.2f} points "
              f"(per seed {[round(100 * v, 2) for v in s['gap_to_centralized']['values']]})", ""]
    for name, ok in acc["targets"].items():
        lines.append(f"- {name}: **{'PASS' if ok else 'FAIL'}**")
    if "influence" not in out:
        return "\n".join(lines + _pipeline(out))
    inf = out["influence"]
    lines += ["", f"### 2. Influence columns vs the authors' dense inverse (exact-cosine kNN graph, n = {inf['n']}, "
              f"{inf['columns']} labelled columns, nnz = {inf['nnz']})", "",
              "| route | time (s) | speed-up vs dense inverse | argmax(S_L·Y) identical | max abs diff | solver / iterations |",
              "|---|---|---|---|---|---|",
              f"| dense inverse (np.linalg.inv, authors) | {inf['methods']['dense_inverse']['seconds']:.2f} | 1.00× | — | — | — |"]
    for m in ("auto", "cg"):
        d = inf["methods"][m]
        lines.append(f"| influence_columns({m}) | {d['seconds']:.2f} | {d['speedup_vs_dense_inverse']:.2f}× | "
                     f"{100 * d['argmax_agreement']:.3f}% | {d['max_abs_diff']:.2e} (max entry {d['max_abs_entry']:.2f}) | "
                     f"{d['solver']} / {d['iterations']} |")
    lines += ["", f"- ≥ 5× faster (auto): **{'PASS' if inf['target_5x_auto'] else 'FAIL'}**; "
              f"(cg): **{'PASS' if inf['target_5x_cg'] else 'FAIL'}**"]
    big = out["influence_large"]
    if "error" in big:
        lines += ["", f"Large graph (n = {big['n']}): the child process failed: `{big['error'][-300:]}`"]
    else:
        lines += ["", f"Large graph: n = {big['n']}, {big['columns']} labelled columns (nnz = {big['nnz']}), "
                  "influence_columns(auto) in a child process:", "",
                  "| quantity | value |", "|---|---|",
                  f"| solve time | {big['seconds']:.1f} s ({big['solver']}, {big['iterations']} iterations, "
                  f"residual {big['max_relative_residual']:.1e}) |",
                  f"| peak RSS of the child | {big['peak_maxrss_mb']:.0f} MB |",
                  f"| peak RSS minus the RSS just before the solve | {big['solve_peak_increase_mb']:.0f} MB "
                  f"(output alone {big['output_mb']:.0f} MB) |",
                  f"| dense inverse | not run; extrapolated (n³ from n = {inf['n']}): "
                  f"{big['dense_inverse_extrapolated_seconds']:.0f} s, {big['dense_inverse_matrix_gb']:.1f} GB per n × n matrix |",
                  "", f"- peak memory within a few GB (< 4 GB): **{'PASS' if big['target_memory_within_4gb'] else 'FAIL'}**"]
    return "\n".join(lines + _pipeline(out))


def _pipeline(out: dict) -> list[str]:
    cfg, p = out["config"], out["pipeline"]
    return ["", f"### 3. Whole plaintext pipeline vs scikit-learn (same {cfg['n']} pooled points)", "",
              "| method | time (s) | accuracy % |", "|---|---|---|",
              f"| XCLP plaintext run_xclp, L = {p['bits']} | {p['xclp_seconds']:.1f} | {pct(p['xclp_accuracy'])} |",
              f"| sklearn LabelSpreading(knn, k = {cfg['k']}, α = {cfg['alpha']}) | {p['sklearn_seconds']:.1f} "
              f"({p['sklearn_iterations']} iterations) | {pct(p['sklearn_accuracy'])} |",
              f"| ratio XCLP / sklearn time | {p['xclp_seconds'] / p['sklearn_seconds']:.1f}× | |"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke test, about a minute)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--seeds", type=int, default=1, help="seeds for the full accuracy table (default 1)")
    ap.add_argument("--extra-seeds", type=int, default=0,
                    help="additional seeds for the L=target row and the baselines only (default 0)")
    ap.add_argument("--no-standardize", action="store_true",
                    help="every method on raw features (default: every method standardised, as XCLP is by default)")
    ap.add_argument("--parts", default="accuracy,influence",
                    help="accuracy (part 1 and 3), influence (part 2, the solver: features do not matter); default both")
    ap.add_argument("--child-solve", help=argparse.SUPPRESS)
    ap.add_argument("--alpha", type=float, default=0.99, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_solve:
        child_solve(args.child_solve, args.alpha, "auto")
        return 0
    cfg = dict(QUICK if args.quick else FULL, standardize=not args.no_standardize)
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    if not parts or parts - {"accuracy", "influence"}:
        ap.error(f"--parts: accuracy and/or influence, got {args.parts!r}")
    seeds = list(range(args.seeds))
    extra = list(range(args.seeds, args.seeds + args.extra_seeds))
    t0 = now()
    import torch

    out = {"command": "python -m bench.xclp_core" + (" --quick" if args.quick else "")
           + (f" --seeds {args.seeds}" if args.seeds != 1 else "") + (f" --extra-seeds {args.extra_seeds}" if args.extra_seeds else "")
           + (" --no-standardize" if args.no_standardize else "")
           + (f" --parts {','.join(sorted(parts))}" if parts != {"accuracy", "influence"} else ""),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "numpy": np.__version__, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                       "loadavg_start": list(os.getloadavg())},
           "config": {**cfg, "bits": list(cfg["bits"])}}
    if "influence" in parts:
        out["influence"] = influence_part(cfg, 0)
        out["influence_large"] = big_influence_part(cfg, 0, out["influence"])
    if "accuracy" not in parts:
        out["machine"]["loadavg_end"] = list(os.getloadavg())
        out["total_seconds"] = now() - t0
        print(json.dumps(out, indent=1))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1))
        return 0
    out["accuracy"] = accuracy_part(cfg, seeds, extra)
    r0 = out["accuracy"]["runs"][0]
    pb = str(cfg["pipeline_bits"])
    out["pipeline"] = {"bits": cfg["pipeline_bits"], "xclp_seconds": r0["xclp_seconds"][pb],
                       "xclp_accuracy": r0["xclp"][pb], "xclp_timings": r0["xclp_timings"][pb],
                       "sklearn_seconds": r0["sklearn_seconds"], "sklearn_accuracy": r0["sklearn"],
                       "sklearn_iterations": r0["sklearn_iterations"]}
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    out["total_seconds"] = now() - t0
    md = markdown(out)
    out["markdown"] = md
    print(md)
    print(f"\n(total {out['total_seconds']:.0f} s; load average at start {out['machine']['loadavg_start'][0]:.1f}, "
          f"at end {out['machine']['loadavg_end'][0]:.1f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
