"""Honest view sizes of a blocked graph's rounds against the cap a site enforces (xclp.view_bounds).

A site of a secure blocked job refuses a round's view that asks it to reveal more entries per point
than the candidates (round 1) or an NN-Descent round can need (`xclp.view_bounds.entry_cap`). This
measures what honest rounds ask: the coordinator's rounds as a job plans them (candidate blocks, then
`descent_rounds` rounds of neighbours of neighbours), with the distances measured in the clear, and,
per round and pair of sites, the most entries any point of A (and any row of B in one group of A) is
asked for, beside the cap.

    python -m bench.view_bounds [--n 2000 5000 10000] [--settings tests bench]

Writes bench/results/view_bounds.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SETTINGS = {
    # tests/xclp/test_blocked_job.py's BLOCKED (with two descent rounds, as its kept-results test)
    "tests": dict(bits=64, k=5, blocking_tables=4, max_bucket=6, descent_rounds=2),
    # bench.lattice_blocks / bench.scale: the job defaults
    "bench": dict(bits=1024, k=10, blocking_tables=64, max_bucket=48, descent_rounds=2),
}


def rounds(n: int, setting: str, seed: int = 0) -> list[dict]:
    from bench.scale import dataset
    from crypto.rlwe import N_DEFAULT
    from crypto.seed import derive_seed
    from xclp import blocking, lsh
    from xclp.blocked_graph import BlockedGraph, local_knn
    from xclp.job_params import JobParams
    from xclp.protocol import simulation_contribution
    from xclp.view_bounds import round_cap

    ds = dataset(n, seed)
    p = JobParams(job_id="view-bounds", n_classes=10, graph="blocked", crypto="lattice", **SETTINGS[setting])
    sites = list(ds.sites)
    key = derive_seed({s: simulation_contribution(seed, s) for s in sites}, sites, p.job_id)
    tag_key = blocking.tag_key(key, p.job_id)
    X = (ds.X - ds.X.mean(axis=0)) / np.where(ds.X.std(axis=0) > 0, ds.X.std(axis=0), 1)  # as standardised jobs
    codes = {s: lsh.hash_vectors(X[ds.site == s], key, p.bits, p.normalise) for s in sites}
    sizes = {s: codes[s].shape[0] for s in sites}
    g = BlockedGraph(sites, [sizes[s] for s in sites], p.bits, p.k, p.blocking_tables, p.max_bucket, p.descent_rounds)
    for s in sites:
        tags = blocking.substring_tags(codes[s], p.bits, tag_key, p.blocking_tables)
        g.receive_tags(s, tags)
        knn = local_knn(codes[s], p.bits, tags, p.k, p.max_bucket, p.descent_rounds)
        g.receive_intra_knn(s, knn.idx, np.where(knn.idx >= 0, knn.dist, 0))
    out = []
    blocks = g.candidate_blocks(sites)
    for r in range(1, p.descent_rounds + 2):
        worst = {"round": r, "n": n, "setting": setting, "cap": round_cap(p, r), "pairs": 0, "entries": 0,
                 "max_per_point_a": 0, "max_per_row_b": 0, "p99_per_point_a": 0.0}
        per_point = []
        for (a, b), bl in blocks.items():
            if not bl:
                continue
            i, j = blocking.block_pairs(bl, sizes[a], sizes[b])
            g.add_pairs(a, b, i, j, blocking.pair_hamming(codes[a], i, j, codes[b]))
            counts_a = np.bincount(i, minlength=sizes[a])
            group = i // N_DEFAULT  # A's natural block (a group of a packed run)
            counts_b = np.unique(group * sizes[b] + j, return_counts=True)[1]
            worst["pairs"] += 1
            worst["entries"] += int(i.size)
            worst["max_per_point_a"] = max(worst["max_per_point_a"], int(counts_a.max()))
            worst["max_per_row_b"] = max(worst["max_per_row_b"], int(counts_b.max()))
            per_point.append(counts_a[counts_a > 0])
        if per_point:
            worst["p99_per_point_a"] = float(np.percentile(np.concatenate(per_point), 99))
        out.append(worst)
        g.rounds_done = r - 1
        blocks = g.descent_blocks(sites)
        if not blocks:
            break
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[2000, 5000, 10000])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--out", default="bench/results/view_bounds.json")
    args = ap.parse_args(argv)
    rows = [row for s in args.settings for n in args.n for row in rounds(n, s)]
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print("| setting | n | round | pairs | entries | max per point of A | p99 | max per row of B | cap | margin |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        top = max(x["max_per_point_a"], x["max_per_row_b"])
        print(f"| {x['setting']} | {x['n']} | {x['round']} | {x['pairs']} | {x['entries']} | {x['max_per_point_a']} | "
              f"{x['p99_per_point_a']:.0f} | {x['max_per_row_b']} | {x['cap']} | {x['cap'] / max(top, 1):.1f}× |")


if __name__ == "__main__":
    main()
