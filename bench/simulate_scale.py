"""`xclp simulate predict` at the scale of real sites, secure against the plaintext reference (issue 10).

    .venv/bin/python -m bench.simulate_scale [--limit 20000] [--crypto lattice] [--json OUT]

Runs, one after the other in one invocation, the issue's command with `--crypto plaintext` and then
with `--crypto lattice` (each a fresh `xclp` process, so each reports its own peak memory):

    xclp simulate predict --dataset fashion-mnist --limit 20000 --sites 6 --split dirichlet:0.5
        --labeled-fraction 0.1 --bits 1024 --crypto C --seed 0 --json … --predictions …

Same seed, so the same split and LSH hyperplanes: the labels must be identical. Reports both wall
times (of the whole command: loading, hashing, the protocol, the graph and the solve), their ratio
(target ≤ 10×), the XCLP run's own seconds (without loading and the per-site and centralized
baselines the command also computes), bytes and peak memory. JSON: bench/results/simulate_scale_<crypto>_<limit>.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def run(limit: int, crypto: str, seed: int, work: Path) -> dict:
    js, pred = work / f"{crypto}.json", work / f"{crypto}.npz"
    cmd = [str(Path(sys.executable).parent / "xclp"), "simulate", "predict", "--dataset", "fashion-mnist", "--limit", str(limit),
           "--sites", "6", "--split", "dirichlet:0.5", "--labeled-fraction", "0.1", "--bits", "1024",
           "--crypto", crypto, "--seed", str(seed), "--json", str(js), "--predictions", str(pred)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    res = json.loads(js.read_text())
    print(f"  {crypto}: {wall:.1f} s, peak {res['peak_memory_bytes'] / 2**30:.2f} GB, "
          f"{res['bytes']['total']:,} B", file=sys.stderr, flush=True)
    return {"command": " ".join(["xclp"] + cmd[1:-4]), "seconds": round(wall, 2), "timings": res["timings"],
            "xclp_seconds": res["timings"]["total"], "baseline_seconds": res["baseline_seconds"],
            "bytes": res["bytes"]["total"], "peak_memory_bytes": res["peak_memory_bytes"],
            "accuracy": res["accuracy"], "labels": np.load(pred)["labels"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20000)
    ap.add_argument("--crypto", default="lattice")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xclp-simscale-") as work:
        runs = {c: run(args.limit, c, args.seed, Path(work)) for c in ("plaintext", args.crypto)}
    ref, sec = runs["plaintext"], runs[args.crypto]
    out = {"limit": args.limit, "crypto": args.crypto, "seed": args.seed,
           "labels_identical": bool(np.array_equal(ref.pop("labels"), sec.pop("labels"))),
           "ratio": round(sec["seconds"] / ref["seconds"], 3), "runs": runs}
    out["targets"] = {"labels_identical": out["labels_identical"], "ratio_at_most_10": out["ratio"] <= 10}
    path = args.json or Path(f"bench/results/simulate_scale_{args.crypto}_{args.limit}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    gb = lambda b: f"{b / 2**30:.2f} GB"  # noqa: E731
    print("| crypto | command seconds | × plaintext | XCLP run seconds | × plaintext | bytes | peak memory | "
          "xclp accuracy | labels identical |\n|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for c, r in runs.items():
        print(f"| {c} | {r['seconds']:.1f} | {r['seconds'] / ref['seconds']:.2f}× | {r['xclp_seconds']:.1f} | "
              f"{r['xclp_seconds'] / ref['xclp_seconds']:.2f}× | {r['bytes']:,} | "
              f"{gb(r['peak_memory_bytes'])} | {r['accuracy']['xclp']:.4f} | "
              f"{'–' if c == 'plaintext' else ('yes' if out['labels_identical'] else 'NO')} |")
    print(f"wrote {path}")
    return 0 if all(out["targets"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
