"""The same XCLP job through Flower and through the coordinator: time and bytes, as ratios (issue 12).

    .venv/bin/python -m bench.flower [--quick] [--bits 256] [--json bench/results/flower.json]

Digits (1,797 points; --quick: 600), 3 sites, Dirichlet β = 0.5, 10 % labelled, the lattice protocol,
L = --bits, k = 10, α = 0.99. Each side runs as real processes on loopback, started before the clock:
- coordinator: `bench.service`'s run (a coordinator on SQLite and three agents polling every 0.05 s);
  seconds from the submit to the last site's result file; bytes = every site upload the coordinator
  accepted (relayed site-to-site messages once) + what the coordinator itself wrote;
- Flower: a flower-superlink and three flower-supernodes (xclp_flower/deployment.py), `flwr run` of
  examples/flower-xclp. Seconds: the ServerApp's own time from its first message to the last reply
  (the job), and the wall time of `flwr run` (the job plus building and starting the app); bytes:
  the payloads of every message both ways (a relayed message counts on both of its legs).
Both sides' labels are checked equal to the in-process simulation with that side's seed contributions.
Flower 1.41 starts a process for every message a SuperNode takes and its nodes poll for work, so each
message round costs seconds whatever the payload: the ratio says what a deployment pays for that.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.service import in_process_run, make_ds, service_run

RESULTS = Path(__file__).resolve().parent / "results" / "flower.json"


def log(msg: str) -> None:
    print(f"  · {msg}", file=sys.stderr, flush=True)


def flower_run(ds, cfg: dict) -> dict:
    from xclp_flower.deployment import LocalFlower

    work = Path(tempfile.mkdtemp(prefix="xclp-bench-flower-"))
    files = {}
    for s in ds.sites:
        idx = np.flatnonzero(ds.site == s)
        files[s] = work / f"{s}.npz"
        np.savez(files[s], X=ds.X[idx], y=ds.y[idx])
    flower = LocalFlower(work, files)
    try:
        flower.wait_ready()
        t0 = time.perf_counter()
        summary = flower.run(f"crypto='{cfg['crypto']}' bits={cfg['bits']} k={cfg['k']} alpha={cfg['alpha']} "
                             f"classes={ds.n_classes}")
        wall = time.perf_counter() - t0
        results = {s: dict(np.load(summary["written"][s])) for s in ds.sites}
    finally:
        flower.close()
        shutil.rmtree(work, ignore_errors=True)
    job_seconds = sum(v for k, v in summary["seconds"].items())
    return {"job": summary["job"], "seconds": job_seconds, "flwr_run_wall_seconds": wall,
            "phase_seconds": summary["seconds"], "bytes": summary["bytes"], "bytes_total": summary["bytes_total"],
            "contributions": {s: results[s]["seed_contribution"].tobytes() for s in ds.sites}, "results": results,
            "rounds": None}


def check(ds, cfg: dict, run: dict) -> bool:
    ref = in_process_run(ds, cfg, run["job"], run["contributions"])
    return all(np.array_equal(run["results"][s]["labels"], ref["predictions"][s].labels) for s in ds.sites)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bits", type=int, default=256)
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    try:
        import flwr  # noqa: F401
    except ImportError:
        print("bench.flower: Flower is the optional extra: pip install -e '.[flower]'", file=sys.stderr)
        return 2
    cfg = dict(n=600 if args.quick else None, sites=3, split="dirichlet:0.5", labelled=0.1, bits=args.bits, k=10,
               alpha=0.99, seed=0, crypto="lattice")
    ds = make_ds(cfg)
    log(f"{ds.n} points, 3 sites, lattice, L = {cfg['bits']}")
    log("through the coordinator")
    svc = service_run(ds, cfg)
    log(f"  {svc['seconds']:.2f} s, {svc['bytes']['total']:,} bytes")
    log("through Flower")
    fl = flower_run(ds, cfg)
    log(f"  job {fl['seconds']:.2f} s (flwr run {fl['flwr_run_wall_seconds']:.2f} s), {fl['bytes_total']:,} bytes")
    same = {"coordinator": check(ds, cfg, svc), "flower": check(ds, cfg, fl)}
    out = {"command": "python -m bench.flower" + (" --quick" if args.quick else ""), "n": ds.n, "sites": 3,
           "crypto": "lattice", "bits": cfg["bits"],
           "coordinator": {"seconds": round(svc["seconds"], 3), "bytes": svc["bytes"]["total"]},
           "flower": {"seconds": round(fl["seconds"], 3), "flwr_run_wall_seconds": round(fl["flwr_run_wall_seconds"], 3),
                      "bytes": fl["bytes_total"], "bytes_by_phase": fl["bytes"],
                      "seconds_by_phase": fl["phase_seconds"]},
           "ratio_seconds": round(fl["seconds"] / svc["seconds"], 2),
           "ratio_bytes": round(fl["bytes_total"] / svc["bytes"]["total"], 2),
           "labels_equal_simulation": same}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(f"| through | seconds | bytes | labels = simulation |\n|---|---:|---:|---|\n"
          f"| coordinator + agents | {svc['seconds']:.2f} | {svc['bytes']['total']:,} | {same['coordinator']} |\n"
          f"| Flower (ServerApp's job; `flwr run` wall {fl['flwr_run_wall_seconds']:.1f} s) | {fl['seconds']:.2f} | "
          f"{fl['bytes_total']:,} | {same['flower']} |\n| Flower / coordinator | {out['ratio_seconds']}× | "
          f"{out['ratio_bytes']}× | |")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
