"""XCLP without all pairs (issue 23): the blocked graph against exact XCLP, time and memory vs n.

    nice -n 10 .venv/bin/python -m bench.scale [--sizes 10000 20000 40000 60000] [--exact-max-n 20000]
        [--executor serial|process] [--crypto plaintext|lattice|masked] [--json bench/results/scale.json]

Fashion-MNIST training images (a seeded subset of size n; 60,000 is all of them), 10 sites,
Dirichlet 0.5, 10 % labelled, L = 1024, plaintext (--crypto lattice or masked: the secure job, in process). For
each n, each measurement in a fresh process
(so each has its own peak memory, ru_maxrss):

- blocked: `run_xclp` with graph="blocked" — seconds per phase, peak memory, candidate pairs;
- exact XCLP timing: `run_xclp` with graph="exact", only up to --exact-max-n (it is quadratic:
  ~8 min and 12 GB at 60,000 on an idle machine);
- the exact reference labels for every n: the all-pairs kNN graph of the same codes and Z = S Y by
  CG with C right-hand sides (the single-party shortcut: the same labels as exact XCLP — the sum of
  the sites' contributions is S Y — at a fraction of the cost). Cached under /tmp
  (xclp-scale-ref-<n>-<seed>.npz): computed once.

Reported: labels identical to the reference, accuracy of both on the unlabelled points, recall@10
of the blocked kNN lists against the all-pairs ones, and the fitted log-log slope of blocked time
vs n (1: linear, 2: all pairs). A blocked run keeps its labels under /tmp
(xclp-scale-labels-<n>-<seed>-<crypto>.npy); a secure run whose plaintext run is there reports the share of
labels equal to it (`labels_equal_plaintext`: the same seed, so 1.0 unless the protocol errs). Each run
records the machine's load average before and after (`load`: it shares its cores).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CACHE = Path("/tmp")


def dataset(n: int, seed: int):
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites

    X, y = load_arrays("fashion-mnist", limit=n, seed=seed)
    return simulate_sites(X.astype(np.float64), y, 10, "dirichlet:0.5", 0.1, seed=seed)


def params(graph: str, crypto: str = "plaintext"):
    from xclp.job_params import JobParams

    return JobParams(job_id="scale-bench", n_classes=10, bits=1024, graph=graph, crypto=crypto)


def reference(n: int, seed: int) -> dict:
    """The exact graph's kNN lists and labels (cached): all pairs, then S Y."""
    path = CACHE / f"xclp-scale-ref-std-{n}-{seed}.npz"  # ("-std": hashed after standardisation, as the jobs)
    if path.exists():
        z = np.load(path)
        return {k: z[k] for k in z.files}
    from crypto.seed import derive_seed
    from xclp import graph as graphs
    from xclp import lsh
    from xclp.influence import propagate
    from xclp.propagation import label_matrix, predict_from_scores
    from xclp.protocol import simulation_contribution

    ds, p = dataset(n, seed), params("exact")
    sites = ds.sites
    rows = [np.flatnonzero(ds.site == s) for s in sites]
    key = derive_seed({s: simulation_contribution(seed, s) for s in sites}, sites, p.job_id)
    X = ds.X
    if p.standardize:  # the jobs hash each site's points after federated standardisation (JobParams.standardize):
        # every feature to the mean and variance of all sites' points; the same moments, summed in
        # floating point here instead of at the secure sum's 2^-32 grain
        from xclp.standardisation import standardisation_stats, standardise

        X = standardise(ds.X, sum(standardisation_stats(ds.X[r]) for r in rows))[0]
    codes = np.concatenate([lsh.hash_vectors(X[r], key, p.bits, p.normalise) for r in rows])
    order = np.concatenate(rows)
    acc = graphs.KnnAccumulator(n, p.k)
    every = np.arange(n)
    for s in range(0, n, 2048):
        r = every[s : s + 2048]
        acc.add_block(r, every, lsh.hamming_matrix(codes[r], codes, p.bits), symmetric=False)
    W = graphs.graph_from_hamming_blocks(acc, p.bits, p.graph_params())
    y = ds.y[order]
    lab = y >= 0
    Y = np.zeros((n, p.n_classes))
    Y[lab] = label_matrix(y[lab], np.bincount(y[lab], minlength=p.n_classes), p.balanced)
    Z, _ = propagate(W, Y, p.alpha, tol=p.tol)
    labels = np.empty(n, dtype=np.int64)
    at = 0
    for r in rows:  # per site, as each site predicts its own points
        labels[r] = predict_from_scores(Z[at : at + r.size], ds.y[r]).labels
        at += r.size
    out = {"labels": labels, "knn_idx": acc.idx, "order": order}
    np.savez(path, **out)
    return out


def one(n: int, mode: str, seed: int, executor: str, crypto: str = "plaintext", with_reference: bool = True) -> dict:
    """One measurement in this process (the parent reads its JSON line)."""
    from xclp.blocking import recall_at_k
    from xclp.executor import make_executor
    from xclp.simulation import run_xclp, unlabelled_accuracy

    ds = dataset(n, seed)
    if mode == "reference":
        t0 = time.perf_counter()
        reference(n, seed)
        return {"n": n, "mode": mode, "seconds": time.perf_counter() - t0, "peak_bytes": peak()}
    import os

    load_before = os.getloadavg()
    with make_executor(executor) as ex:
        t0 = time.perf_counter()
        res = run_xclp(ds, params(mode, crypto), seed=seed, executor=ex)
        seconds = time.perf_counter() - t0
    out = {"n": n, "mode": mode, "crypto": crypto, "bytes_hamming": res.bytes["by_phase"].get("hamming", 0),
           "seconds": seconds, "phases": res.timings, "solver": res.solver,
           "peak_bytes": peak(), "accuracy": unlabelled_accuracy(ds, res.labels),
           "bytes_influence": res.bytes["by_phase"].get("influence", 0), "bytes_total": res.bytes.get("total"),
           "load": {"before": load_before, "after": os.getloadavg(), "cpus": os.cpu_count()}}
    if mode == "blocked":
        mine = Path(f"/tmp/xclp-scale-labels-{n}-{seed}-{crypto}.npy")
        np.save(mine, res.labels)
        plain = Path(f"/tmp/xclp-scale-labels-{n}-{seed}-plaintext.npy")
        if crypto != "plaintext" and plain.exists():
            out["labels_equal_plaintext"] = float(np.mean(np.load(plain) == res.labels))
    if mode == "blocked":
        out["candidate_pairs_cross"] = res.coordinator.blocked.pair_count()
    if not with_reference:  # (--no-reference: the all-pairs reference is not computed; labels vs plaintext only)
        return out
    ref = reference(n, seed)
    out["labels_identical"] = float(np.mean(res.labels == ref["labels"]))
    out["reference_accuracy"] = unlabelled_accuracy(ds, ref["labels"])
    if mode == "blocked":
        st = res.coordinator.blocked
        out["all_pairs"] = n * (n - 1) // 2
        out["recall_at_10"] = recall_at_k(st.knn(st.sites).idx, ref["knn_idx"])
    return out


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def slope(ns, ts) -> float:
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0]) if len(ns) >= 2 else float("nan")


def _ref_time(row: dict) -> str:
    # a cached reference loads in milliseconds: its cost was paid by an earlier run
    return "cached" if row["seconds"] < 1 else f"{row['seconds']:.1f} s, {row['peak_bytes'] / 2**30:.2f} GB"


def table(result: dict) -> str:
    """The Markdown table of docs/benchmarks.md from a result JSON."""
    ref = {r["n"]: r for r in result["rows"] if r["mode"] == "reference"}
    exact = {r["n"]: r for r in result["rows"] if r["mode"] == "exact"}
    lines = ["| n | blocked: total | hamming+graph | influence | peak | pairs measured / all pairs | recall@10 | "
             "labels = exact | accuracy blocked / exact | exact XCLP: total, peak | reference (all pairs + S·Y) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in result["rows"] if r["mode"] == "blocked"):
        ph, n = r["phases"], r["n"]
        e = exact.get(n)
        lines.append(
            f"| {n:,} | {r['seconds']:.1f} s | {ph.get('hamming', 0) + ph.get('graph', 0):.1f} s | "
            f"{ph.get('influence', 0):.1f} s | {r['peak_bytes'] / 2**30:.2f} GB | "
            f"{r['candidate_pairs_cross']:,} / {r['all_pairs']:,} ({r['candidate_pairs_cross'] / r['all_pairs']:.1%}) | "
            f"{r['recall_at_10']:.3f} | {r['labels_identical']:.2%} | "
            f"{r['accuracy']:.2%} / {r['reference_accuracy']:.2%} | "
            + (f"{e['seconds']:.1f} s, {e['peak_bytes'] / 2**30:.2f} GB" if e else "—")
            + (f" | {_ref_time(ref[n])} |" if n in ref else " | — |"))
    lines.append(f"\nFitted log-log slope of the blocked time vs n: {result['slope_blocked']:.2f}.")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 20000, 40000, 60000])
    ap.add_argument("--exact-max-n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--executor", default="serial", choices=("serial", "process", "dask"))
    ap.add_argument("--json", default="bench/results/scale.json")
    ap.add_argument("--crypto", default="plaintext", choices=("plaintext", "lattice", "masked"),
                    help="the blocked and exact jobs' SecureHamming (lattice, masked: the secure job, in process)")
    ap.add_argument("--one", nargs=2, metavar=("N", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--no-reference", action="store_true",
                    help="with --one: skip the all-pairs reference (labels_identical, recall); a secure run still "
                         "compares its labels with the plaintext run's, where that ran first")
    ap.add_argument("--table", metavar="JSON", help="print the Markdown table of a result and stop")
    a = ap.parse_args(argv)
    if a.table:
        print(table(json.loads(Path(a.table).read_text())))
        return
    if a.one:
        print(json.dumps(one(int(a.one[0]), a.one[1], a.seed, a.executor, a.crypto, not a.no_reference)))
        return
    rows = []
    for n in a.sizes:
        modes = ["reference", "blocked"] + (["exact"] if n <= a.exact_max_n else [])
        for mode in modes:
            cmd = [sys.executable, "-m", "bench.scale", "--one", str(n), mode, "--seed", str(a.seed),
                   "--executor", a.executor, "--crypto", a.crypto]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            row = json.loads(out)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    blocked = [r for r in rows if r["mode"] == "blocked"]
    exact = [r for r in rows if r["mode"] == "exact"]
    result = {"command": "python -m bench.scale " + " ".join(argv if argv is not None else sys.argv[1:]),
              "rows": rows,
              "slope_blocked": slope([r["n"] for r in blocked], [r["seconds"] for r in blocked]),
              "slope_exact": slope([r["n"] for r in exact], [r["seconds"] for r in exact])}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("slope_blocked", "slope_exact")}))
    print(table(result))


if __name__ == "__main__":
    main()
