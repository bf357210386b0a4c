"""Secure-protocol benchmark (issue: crypto): SecureHamming variants and the secure pipeline.

    .venv/bin/python -m bench.crypto [--quick] [--json bench/results/crypto.json] [--sim-n N]

One run measures, on the same machine and in the same process:

a. L = 256, 24 × 24 random vectors, all four Hamming protocols (plaintext, paillier-naive, paillier,
   ot; 2048-bit Paillier keys): pairs/s, bytes each way, exactness against the plaintext matrix;
   ratios paillier / naive (target ≥ 30×) and ot / naive (target ≥ 100×) in pairs/s. The naive
   protocol takes minutes: it runs once.
b. L = 1024, 500 × 500: plaintext, paillier and ot; the factor to the plaintext matrix timed in the
   same call (xclp.bench_hamming); targets: ot within 1,000×, paillier within 10,000×.
c. End-to-end secure `run_xclp` (the in-process job: every phase, real serialised messages) on
   Fashion-MNIST points over 5 sites (Dirichlet 0.5 label skew, 10 % labelled), L = 1024, for
   crypto = plaintext, ot, paillier with the same data and seed: time, bytes (total, hamming phase),
   ratio to the plaintext run, and whether the labels are identical to the plaintext run.

Every protocol call includes its own setup in the timing (Paillier: key generation and the DJN
tables; OT: the 128 Chou–Orlandi base OTs). Timings are wall clock on a shared 2-core machine: the
ratios are measured within one run; the absolute numbers move with the load (logged at start/end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

FULL = dict(a_bits=256, a_sizes=(24, 24), b_bits=1024, b_sizes=(500, 500),
            sim_n=2000, sim_sites=5, sim_split="dirichlet:0.5", sim_labelled=0.1, sim_bits=1024, key_bits=2048)
QUICK = dict(a_bits=256, a_sizes=(4, 4), b_bits=1024, b_sizes=(60, 60),
             sim_n=300, sim_sites=3, sim_split="dirichlet:0.5", sim_labelled=0.1, sim_bits=1024, key_bits=2048)

TARGETS = {"paillier_over_naive": 30.0, "ot_over_naive": 100.0, "ot_to_plaintext": 1_000.0,
           "paillier_to_plaintext": 10_000.0}


def log(msg: str) -> None:
    print(f"  · [{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


# --- a. and b.: pair protocols -------------------------------------------------------------------

def pair_part(protocols: list[str], bits: int, sizes: tuple[int, int], key_bits: int) -> dict:
    from xclp.bench_hamming import bench_hamming

    out = {}
    for p in protocols:
        log(f"hamming {p}: L = {bits}, {sizes[0]} × {sizes[1]}")
        r = bench_hamming(p, sizes[0], sizes[1], bits, seed=0, key_bits=key_bits)
        r["loadavg"] = os.getloadavg()[0]
        out[p] = r
        log(f"  {r['seconds']:.2f} s, {r['pairs_per_second']:.1f} pairs/s, exact = {r['exact']}")
    return out


# --- c. end-to-end secure simulation -------------------------------------------------------------

def sim_part(cfg: dict, seed: int = 0) -> dict:
    from xclp.data import load_arrays
    from xclp.job_params import JobParams
    from xclp.simulation import run_xclp, unlabelled_accuracy
    from xclp.splits import simulate_sites

    X, y = load_arrays("fashion-mnist", cfg["sim_n"], seed)
    ds = simulate_sites(X, y, cfg["sim_sites"], cfg["sim_split"], cfg["sim_labelled"], seed, n_classes=10)
    sizes = {s: int((ds.site == s).sum()) for s in ds.sites}
    out = {"n": ds.n, "sites": sizes, "labelled": int((ds.y >= 0).sum()), "runs": {}}
    ref = None
    for crypto in ("plaintext", "ot", "paillier"):
        log(f"run_xclp crypto = {crypto}: n = {ds.n}, {len(sizes)} sites, L = {cfg['sim_bits']}")
        # One job id for all three: it enters the LSH seed derivation, so the hashes (and the graph) match.
        params = JobParams(job_id="bench-crypto", n_classes=10, bits=cfg["sim_bits"], crypto=crypto,
                           key_bits=cfg["key_bits"]).validate()
        t = time.perf_counter()
        res = run_xclp(ds, params, seed=seed)
        sec = time.perf_counter() - t
        if ref is None:
            ref = res
        run = {"seconds": sec, "timings": {k: round(v, 4) for k, v in res.timings.items()},
               "bytes_total": res.bytes["total"], "bytes_hamming": res.bytes["by_phase"].get("hamming", 0),
               "bytes_by_phase": res.bytes["by_phase"], "accuracy": unlabelled_accuracy(ds, res.labels),
               "labels_identical_to_plaintext": bool(np.array_equal(res.labels, ref.labels)),
               "max_confidence_difference": float(np.abs(res.confidence - ref.confidence).max()),
               "loadavg": os.getloadavg()[0]}
        out["runs"][crypto] = run
        log(f"  {sec:.1f} s (hamming {res.timings.get('hamming', 0):.1f} s), {run['bytes_total'] / 1e6:.1f} MB, "
            f"identical = {run['labels_identical_to_plaintext']}")
    base = out["runs"]["plaintext"]
    for run in out["runs"].values():
        run["ratio_time_to_plaintext"] = run["seconds"] / base["seconds"]
        run["ratio_hamming_time_to_plaintext"] = (run["timings"].get("hamming", 0) / base["timings"]["hamming"]
                                                  if base["timings"].get("hamming") else None)
        run["ratio_bytes_to_plaintext"] = run["bytes_total"] / base["bytes_total"]
    return out


# --- report --------------------------------------------------------------------------------------

def mb(n: int) -> str:
    return f"{n / 1e6:.3f}" if n < 1e7 else f"{n / 1e6:.1f}"


def pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def pair_table(rows: dict) -> list[str]:
    lines = ["| protocol | time (s) | pairs/s | A→B MB | B→A MB | A→server MB | B→server MB | total MB | exact | × plaintext (same call) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p, r in rows.items():
        b = r["bytes"]
        lines.append(f"| {p} | {r['seconds']:.3f} | {r['pairs_per_second']:,.1f} | {mb(b['a_to_b'])} | {mb(b['b_to_a'])} | "
                     f"{mb(b['a_to_server'])} | {mb(b['b_to_server'])} | {mb(b['total'])} | {r['exact']} | "
                     f"{r['ratio_to_plaintext']:,.0f}× |")
    return lines


def markdown(out: dict) -> str:
    cfg, a, b, c, v = out["config"], out["a"], out["b"], out["c"], out["verdicts"]
    lines = [f"### a. L = {cfg['a_bits']}, {cfg['a_sizes'][0]} × {cfg['a_sizes'][1]}, "
             f"{cfg['key_bits']}-bit Paillier keys", ""]
    lines += pair_table(a)
    lines += ["", "| ratio (pairs/s) | measured | target | verdict |", "|---|---|---|---|",
              f"| paillier / paillier-naive | {out['ratios']['paillier_over_naive']:,.0f}× | ≥ 30× | **{pf(v['paillier_over_naive'])}** |",
              f"| ot / paillier-naive | {out['ratios']['ot_over_naive']:,.0f}× | ≥ 100× | **{pf(v['ot_over_naive'])}** |"]
    lines += ["", f"### b. L = {cfg['b_bits']}, {cfg['b_sizes'][0]} × {cfg['b_sizes'][1]}", ""]
    lines += pair_table(b)
    lines += ["", "| factor to plaintext (same call) | measured | target | verdict |", "|---|---|---|---|",
              f"| ot | {b['ot']['ratio_to_plaintext']:,.0f}× | ≤ 1,000× | **{pf(v['ot_to_plaintext'])}** |",
              f"| paillier | {b['paillier']['ratio_to_plaintext']:,.0f}× | ≤ 10,000× | **{pf(v['paillier_to_plaintext'])}** |"]
    sizes = ", ".join(str(m) for m in c["sites"].values())
    lines += ["", f"### c. End-to-end secure run_xclp: Fashion-MNIST, n = {c['n']} over {len(c['sites'])} sites "
              f"({cfg['sim_split']}, sizes {sizes}), {c['labelled']} labelled, L = {cfg['sim_bits']}", "",
              "| crypto | total time (s) | hamming phase (s) | × plaintext (total) | × plaintext (hamming) | bytes total MB | "
              "bytes hamming MB | × plaintext bytes | accuracy % | labels identical to plaintext |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for crypto, r in c["runs"].items():
        hr = r["ratio_hamming_time_to_plaintext"]
        lines.append(f"| {crypto} | {r['seconds']:.1f} | {r['timings'].get('hamming', 0):.2f} | {r['ratio_time_to_plaintext']:.1f}× | "
                     f"{'' if hr is None else f'{hr:,.0f}×'} | {mb(r['bytes_total'])} | {mb(r['bytes_hamming'])} | "
                     f"{r['ratio_bytes_to_plaintext']:.1f}× | {100 * r['accuracy']:.2f} | {r['labels_identical_to_plaintext']} |")
    lines += ["", f"- secure runs give labels identical to the plaintext run: **{pf(v['labels_identical'])}**",
              f"- every secure Hamming matrix exact: **{pf(v['all_exact'])}**"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, about a minute)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--sim-n", type=int, help="points in part c (default 2000; 300 with --quick)")
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.sim_n:
        cfg["sim_n"] = args.sim_n
    t0 = time.perf_counter()
    out = {"command": "python -m bench.crypto" + (" --quick" if args.quick else "")
           + (f" --sim-n {args.sim_n}" if args.sim_n else ""),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "numpy": np.__version__, "loadavg_start": list(os.getloadavg())},
           "config": {**cfg, "a_sizes": list(cfg["a_sizes"]), "b_sizes": list(cfg["b_sizes"])}, "targets": TARGETS}
    out["a"] = pair_part(["plaintext", "paillier-naive", "paillier", "ot"], cfg["a_bits"], cfg["a_sizes"], cfg["key_bits"])
    out["b"] = pair_part(["plaintext", "paillier", "ot"], cfg["b_bits"], cfg["b_sizes"], cfg["key_bits"])
    out["c"] = sim_part(cfg)
    a, b = out["a"], out["b"]
    naive = a["paillier-naive"]["pairs_per_second"]
    out["ratios"] = {"paillier_over_naive": a["paillier"]["pairs_per_second"] / naive,
                     "ot_over_naive": a["ot"]["pairs_per_second"] / naive,
                     "ot_to_plaintext": b["ot"]["ratio_to_plaintext"],
                     "paillier_to_plaintext": b["paillier"]["ratio_to_plaintext"]}
    r = out["ratios"]
    out["verdicts"] = {
        "paillier_over_naive": r["paillier_over_naive"] >= TARGETS["paillier_over_naive"],
        "ot_over_naive": r["ot_over_naive"] >= TARGETS["ot_over_naive"],
        "ot_to_plaintext": r["ot_to_plaintext"] <= TARGETS["ot_to_plaintext"],
        "paillier_to_plaintext": r["paillier_to_plaintext"] <= TARGETS["paillier_to_plaintext"],
        "labels_identical": all(x["labels_identical_to_plaintext"] for x in out["c"]["runs"].values()),
        "all_exact": all(x["exact"] for part in (a, b) for x in part.values()),
    }
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    out["total_seconds"] = time.perf_counter() - t0
    md = markdown(out)
    out["markdown"] = md
    print(md)
    print(f"\n(total {out['total_seconds']:.0f} s; load average at start {out['machine']['loadavg_start'][0]:.1f}, "
          f"at end {out['machine']['loadavg_end'][0]:.1f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
