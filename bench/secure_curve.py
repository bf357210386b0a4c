"""Time against n for the secure blocked job beside the plaintext one (issue 35: "the secure slope no
steeper than the plaintext one"), on one plot.

    .venv/bin/python -m bench.secure_curve [--sizes 10000 20000 40000 60000] [--crypto masked]
        [--json bench/results/secure_curve.json] [--plot docs/secure_curve.png]

For each n (Fashion-MNIST training images, a seeded subset; 60,000 is all of them; 10 sites, Dirichlet
0.5, 10 % labelled, L = 1024, graph="blocked": bench.scale's job), the plaintext job and then the secure
one, each in a fresh process (`python -m bench.scale --one N blocked --crypto C --no-reference`), one
after the other, so the secure run compares its labels with the plaintext run's of the same seed
(`labels_equal_plaintext`). Reported per n: both jobs' seconds (the whole job, bench.scale's `total`
clock), peaks, bytes moved and the ratio; over the sizes: each curve's fitted log-log slope (1: linear in
n, 2: all pairs) — the target is secure slope ≤ plaintext slope — and the plot of both curves. The
machine's load is recorded with every run (bench.scale's `load`): on a shared machine the times are
upper bounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.scale import slope


def run_one(n: int, crypto: str, seed: int) -> dict:
    cmd = [sys.executable, "-m", "bench.scale", "--one", str(n), "blocked", "--crypto", crypto, "--seed", str(seed),
           "--no-reference"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return json.loads(out)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for crypto, marker in ((result["baseline"], "o"), (result["crypto"], "s")):
        ns = [r["n"] for r in result["rows"]]
        ts = [r[crypto]["seconds"] for r in result["rows"]]
        ax.loglog(ns, ts, marker=marker, label=f"{crypto} (slope {result['slopes'][crypto]:.2f})")
    ax.set_xlabel("points n (Fashion-MNIST, 10 sites)")
    ax.set_ylabel("seconds, whole job (in process)")
    ax.set_title("blocked XCLP, L = 1024: secure vs plaintext")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 20000, 40000, 60000])
    ap.add_argument("--crypto", default="masked", choices=("masked", "lattice"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="bench/results/secure_curve.json")
    ap.add_argument("--plot", default="docs/secure_curve.png")
    a = ap.parse_args(argv)
    if len(a.sizes) < 2:
        raise SystemExit("give at least two sizes: a slope needs two points")
    rows = []
    for n in a.sizes:
        row = {"n": n}
        for crypto in ("plaintext", a.crypto):  # plaintext first: the secure run compares its labels with it
            r = run_one(n, crypto, a.seed)
            row[crypto] = {k: r.get(k) for k in ("seconds", "peak_bytes", "bytes_total", "labels_equal_plaintext",
                                                 "candidate_pairs_cross", "phases", "load")}
            print(f"n = {n:,} {crypto}: {r['seconds']:.1f} s, peak {r['peak_bytes'] / 1e9:.2f} GB", file=sys.stderr,
                  flush=True)
        row["ratio"] = row[a.crypto]["seconds"] / row["plaintext"]["seconds"]
        rows.append(row)
    ns = [r["n"] for r in rows]
    slopes = {c: slope(ns, [r[c]["seconds"] for r in rows]) for c in ("plaintext", a.crypto)}
    result = {"command": "python -m bench.secure_curve " + " ".join(argv if argv is not None else sys.argv[1:]),
              "crypto": a.crypto, "baseline": "plaintext", "rows": rows, "slopes": slopes,
              "secure_slope_not_steeper": slopes[a.crypto] <= slopes["plaintext"],
              "labels_equal": all(r[a.crypto]["labels_equal_plaintext"] == 1.0 for r in rows)}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    plot(result, Path(a.plot))
    print(json.dumps({k: result[k] for k in ("slopes", "secure_slope_not_steeper", "labels_equal")}))
    for r in rows:
        print(f"| {r['n']:,} | {r['plaintext']['seconds']:.1f} s | {r[a.crypto]['seconds']:.1f} s | {r['ratio']:.2f}× |")


if __name__ == "__main__":
    main()
