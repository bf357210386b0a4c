"""Secure blocks, packed vs one run per block (crypto/lattice_blocks.py), on the blocks the blocked
graph makes on Fashion-MNIST.

    nice -n 10 .venv/bin/python -m bench.lattice_blocks [--n 10000] [--counts 10 100 400]
        [--jobs 10000 20000] [--jobs-only] [--exact-jobs 10000] [--json bench/results/lattice_blocks.json]

1. The blocks: Fashion-MNIST (a seeded subset of n points, 10 sites, Dirichlet 0.5, L = 1024, as
   bench/scale.py), LSH codes and keyed tags as a job makes them, the coordinator's candidate blocks
   (64 tables, buckets of ≤ 48). Reported: blocks per site pair, their rows a side, result
   ciphertexts and candidate entries.
2. One site pair (the one with the median number of blocks): for its first B blocks (B in
   --counts), the lattice protocol once per block (`run_pair` on the block's rows), once packed as
   the jobs run it (`run_blocks`: each site from its own view, B's b parts whole) and once in the
   first packed layout (private=False: B given A's candidate positions, b at the candidates only),
   in the same process, one after the other: seconds, bytes (both directions and both shares), the
   ratios. Then the packed run over ALL the pair's blocks (the per-block run over
   all of them is not run: its time is the measured per-block rate times the count, marked so), and
   the whole-site run of the pair (every n_a × n_b distance: what the exact graph runs).
   Each measurement uses a fresh protocol object, so A's key and column encryption are counted
   (in a job they are made once per site, for all its peers).
3. The secure blocked job in process (`xclp.simulation.run_xclp`, the job's machines, crypto="lattice")
   at each --jobs size, run as the machines run it (one packed run per pair and round, each site
   from its view: docs/scale.md, "Packing in jobs"; the descent rounds answered from round 1's kept
   results, crypto.lattice_kept), and again with every round a fresh packed run (keep_first_round=False,
   the baseline, in the same process): seconds per phase, bytes; labels compared with the plaintext
   blocked job of the same size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from bench.scale import dataset


def job_params(crypto: str, graph: str = "blocked", keep: bool = True):
    from xclp.job_params import JobParams

    return JobParams(job_id="scale-bench", n_classes=10, bits=1024, graph=graph, crypto=crypto,
                     keep_first_round=keep)


def pair_blocks(n: int, seed: int):
    """The coordinator's candidate blocks at n points, and each site's codes (as a job makes them)."""
    from crypto.seed import derive_seed
    from xclp import blocking, lsh
    from xclp.blocked_graph import BlockedGraph
    from xclp.protocol import simulation_contribution

    ds, p = dataset(n, seed), job_params("lattice")
    sites = list(ds.sites)
    key = derive_seed({s: simulation_contribution(seed, s) for s in sites}, sites, p.job_id)
    tag_key = blocking.tag_key(key, p.job_id)
    codes = {s: lsh.hash_vectors(ds.X[ds.site == s], key, p.bits, p.normalise) for s in sites}
    st = BlockedGraph(sites, [codes[s].shape[0] for s in sites], p.bits, p.k, p.blocking_tables, p.max_bucket,
                      p.descent_rounds)
    for s in sites:
        st.receive_tags(s, blocking.substring_tags(codes[s], p.bits, tag_key, p.blocking_tables))
    return codes, st.candidate_blocks(sites), p.bits


def stats(blocks: dict) -> dict:
    from crypto.lattice_blocks import BlockLayout

    per_pair = np.array([len(b) for b in blocks.values()])
    ra = np.concatenate([[x.rows_a.size for x in b] for b in blocks.values()])
    rb = np.concatenate([[x.rows_b.size for x in b] for b in blocks.values()])
    return {"pairs": len(blocks), "blocks_per_pair": {"min": int(per_pair.min()), "median": float(np.median(per_pair)),
                                                      "max": int(per_pair.max())},
            "rows_a": {"mean": float(ra.mean()), "median": float(np.median(ra)), "p90": float(np.percentile(ra, 90))},
            "rows_b": {"mean": float(rb.mean()), "median": float(np.median(rb)), "p90": float(np.percentile(rb, 90))},
            "unpacked_result_ciphertexts_per_pair": float(np.median([sum(x.rows_b.size for x in b)
                                                                     for b in blocks.values()])),
            "packed_result_ciphertexts_per_pair": float(np.median([
                BlockLayout([(x.rows_a, x.rows_b) for x in b], 10**6, 10**6).ciphertexts for b in blocks.values()]))}


def first_layout(A, B, n_bits, rows, t):
    """The first packed layout (private=False), for comparison: B learns A's candidate positions."""
    from crypto.hamming_api import exchange
    from crypto.lattice_blocks import PackedLatticeHamming

    proto = PackedLatticeHamming()
    sa, sb = exchange(proto.party_a_blocks(A, n_bits, rows, B.shape[0], private=False),
                      proto.party_b_blocks(B, n_bits, rows, A.shape[0], private=False), t)
    return proto.combine_blocks(sa, sb, rows, A.shape[0], B.shape[0], n_bits, private=False)


def measure(fn):
    from crypto.hamming_api import PairTranscript

    t = PairTranscript()
    start = time.perf_counter()
    out = fn(t)
    return out, time.perf_counter() - start, t.a_to_b + t.b_to_a + t.a_to_server + t.b_to_server


def pair_bench(codes, blocks, n_bits, counts) -> dict:
    from crypto.hamming_api import run_blocks, run_pair
    from crypto.lattice_blocks import BlockLayout
    from crypto.lattice_blocks import PackedLatticeHamming as LatticeHamming

    (a, b), bl = sorted(blocks.items(), key=lambda kv: len(kv[1]))[len(blocks) // 2]
    A, B = codes[a], codes[b]
    rows = [(x.rows_a, x.rows_b) for x in bl]
    out = {"pair": [a, b], "n_a": int(A.shape[0]), "n_b": int(B.shape[0]), "blocks": len(rows), "runs": []}
    per_block = None
    for count in counts:
        sub = rows[:count]
        each, t_each, b_each = measure(lambda t, sub=sub: [run_pair(LatticeHamming(), A[ra], B[rb], n_bits, t)
                                                           for ra, rb in sub])
        pk, t_pk, b_pk = measure(lambda t, sub=sub: run_blocks(LatticeHamming(), A, B, n_bits, sub, t))
        old, t_old, b_old = measure(lambda t, sub=sub: first_layout(A, B, n_bits, sub, t))
        assert all(np.array_equal(x, y) and np.array_equal(x, z) for x, y, z in zip(each, pk, old)), \
            "packed and per-block runs disagree"
        lay = BlockLayout(sub, A.shape[0], B.shape[0])
        per_block = (t_each / len(sub), b_each / len(sub))
        out["runs"].append({"blocks": len(sub), "unpacked_seconds": t_each, "unpacked_bytes": b_each,
                            "packed_seconds": t_pk, "packed_bytes": b_pk, "time_ratio": t_each / t_pk,
                            "first_layout_seconds": t_old, "first_layout_bytes": b_old,
                            "bytes_ratio": b_each / b_pk, "candidate_entries": lay.candidates,
                            "unpacked_result_ciphertexts": int(sum(rb.size for _, rb in sub)),
                            "packed_result_ciphertexts": lay.ciphertexts})
        print(json.dumps(out["runs"][-1]), flush=True)
    _, t_all, b_all = measure(lambda t: run_blocks(LatticeHamming(), A, B, n_bits, rows, t))
    _, t_all_old, b_all_old = measure(lambda t: first_layout(A, B, n_bits, rows, t))
    _, t_exact, b_exact = measure(lambda t: run_pair(LatticeHamming(), A, B, n_bits, t))
    lay = BlockLayout(rows, A.shape[0], B.shape[0])
    out["all"] = {"blocks": len(rows), "packed_seconds": t_all, "packed_bytes": b_all,
                  "first_layout_seconds": t_all_old, "first_layout_bytes": b_all_old,
                  "candidate_entries": lay.candidates, "packed_result_ciphertexts": lay.ciphertexts,
                  "unpacked_result_ciphertexts": int(sum(rb.size for _, rb in rows)),
                  "unpacked_seconds_extrapolated": per_block[0] * len(rows),
                  "unpacked_bytes_extrapolated": per_block[1] * len(rows),
                  "whole_site_run_seconds": t_exact, "whole_site_run_bytes": b_exact,
                  "whole_site_result_ciphertexts": int(B.shape[0] * -(-A.shape[0] // 4096)),
                  "seconds_per_result_ciphertext": t_all / lay.ciphertexts,
                  "bytes_per_candidate_entry": b_all / lay.candidates}
    print(json.dumps(out["all"]), flush=True)
    return out


def job_bench(n: int, seed: int) -> dict:
    # Through the job's machines (xclp.simulation.run_xclp): one packed run per pair and round.
    from xclp.simulation import run_xclp

    ds = dataset(n, seed)
    row = {"n": n}
    # "lattice": the jobs' default, the descent rounds answered from round 1's kept results
    # (crypto.lattice_kept); "lattice_fresh": every round a fresh packed run (keep_first_round=False)
    for name, crypto, keep in (("plaintext", "plaintext", True), ("lattice", "lattice", True),
                               ("lattice_fresh", "lattice", False)):
        start = time.perf_counter()
        r = run_xclp(ds, job_params(crypto, keep=keep), seed=seed)
        row[name] = {"seconds": time.perf_counter() - start, "phases": r.timings,
                     "bytes_hamming": r.bytes["by_phase"].get("hamming", 0), "bytes_total": r.bytes["total"]}
        row[name]["pairs_measured"] = r.coordinator.blocked.pair_count()
        if name == "plaintext":
            labels = r.labels
        else:
            row[name]["labels_identical"] = float(np.mean(r.labels == labels))
            row.setdefault("labels_identical", row[name]["labels_identical"])
        print(json.dumps(row, default=float), flush=True)
    row["kept_over_fresh"] = row["lattice"]["seconds"] / row["lattice_fresh"]["seconds"]
    return row


def exact_job_bench(n: int, seed: int) -> dict:
    """The exact-graph secure job of the same size (every pair's whole-site run), for comparison."""
    from xclp.simulation import run_xclp

    start = time.perf_counter()
    r = run_xclp(dataset(n, seed), job_params("lattice", "exact"), seed=seed)
    row = {"n": n, "seconds": time.perf_counter() - start, "phases": r.timings,
           "bytes_hamming": r.bytes["by_phase"].get("hamming", 0), "bytes_total": r.bytes["total"]}
    print(json.dumps(row, default=float), flush=True)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10000, help="points for the block statistics and the pair (default 10000)")
    ap.add_argument("--counts", type=int, nargs="*", default=[10, 100, 400],
                    help="blocks of the pair run unpacked and packed (default 10 100 400)")
    ap.add_argument("--jobs", type=int, nargs="*", default=[10000], help="secure blocked job sizes (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="bench/results/lattice_blocks.json")
    ap.add_argument("--jobs-only", action="store_true", help="only the --jobs sizes, added to the --json file")
    ap.add_argument("--exact-jobs", type=int, nargs="*", default=[],
                    help="sizes at which to run the exact-graph lattice job too, for comparison")
    a = ap.parse_args(argv)
    command = "python -m bench.lattice_blocks " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.jobs_only:  # add job rows to an existing result file
        with open(a.json) as f:
            result = json.load(f)
        result.setdefault("jobs_commands", []).append(command)
    else:
        result = {"command": command, "cpus": os.cpu_count(), "jobs": []}
        codes, blocks, n_bits = pair_blocks(a.n, a.seed)
        result["blocks"] = {"n": a.n, **stats(blocks)}
        print(json.dumps(result["blocks"]), flush=True)
        result["pair"] = pair_bench(codes, blocks, n_bits, a.counts)
        save(result, a.json)
    for n in a.jobs:  # written after each job: a long run keeps what it measured
        result["jobs"] = [r for r in result.get("jobs", []) if r["n"] != n] + [job_bench(n, a.seed)]
        save(result, a.json)
    for n in a.exact_jobs:
        result["exact_jobs"] = [r for r in result.get("exact_jobs", []) if r["n"] != n] + [exact_job_bench(n, a.seed)]
        save(result, a.json)


def save(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=float)
    print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
