"""Measured parts of the 10⁶-point blocked job, to extrapolate it phase by phase without running it
(a whole run takes most of an hour on the shared cores): 50 sites × 20,000 points of
`bench.synthetic.clustered`, standardised (what the federated standardisation computes) and hashed
site by site; then in CPU seconds (time.process_time): every site's tags, ONE site's within-site
lists (`local_knn`, × 50 for the phase), and the first `--groups` table groups of the coordinator's
candidates (bucket_pairs, then Hamming + merges into the kNN lists; × groups for the phase).

    nice -n 10 .venv/bin/python -m bench.scale_parts [--groups 2] [--json bench/results/scale_parts.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from bench.synthetic import clustered
from xclp import blocked_graph, blocking, lsh

SITES, PER_SITE, L, TABLES = 50, 20_000, 1024, 64


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    cpu = time.process_time
    out: dict = {}
    c = cpu()
    ds = clustered(sites=SITES, per_site=PER_SITE, seed=0)
    out["data"] = cpu() - c
    mu, sd = ds.X.mean(0, dtype=np.float64), ds.X.std(0, dtype=np.float64)
    seed = bytes(range(32))
    key = blocking.tag_key(seed, "scale-curve")
    sites = [f"s{i}" for i in range(SITES)]
    n = SITES * PER_SITE
    bits = np.empty((n, L // 8), np.uint8)
    tags = np.empty((n, TABLES), np.uint64)
    out["lsh_all_sites"] = out["tags_all_sites"] = 0.0
    for s in range(SITES):
        rows = slice(s * PER_SITE, (s + 1) * PER_SITE)
        c = cpu()
        bits[rows] = lsh.hash_vectors((ds.X[rows] - mu) / sd, seed, L)
        out["lsh_all_sites"] += cpu() - c
        c = cpu()
        tags[rows] = blocking.substring_tags(bits[rows], L, key, TABLES)
        out["tags_all_sites"] += cpu() - c
    del ds
    c = cpu()
    blocked_graph.local_knn(bits[:PER_SITE], L, tags[:PER_SITE], 10, blocking.DEFAULT_MAX_BUCKET, 2)
    out["within_site_one_site"] = cpu() - c
    print(json.dumps(out), flush=True)
    st = blocked_graph.BlockedGraph(sites, [PER_SITE] * SITES, L, 10, TABLES, blocking.DEFAULT_MAX_BUCKET, 2)
    for s in range(SITES):
        rows = slice(s * PER_SITE, (s + 1) * PER_SITE)
        st.receive_tags(sites[s], tags[rows])
        st.codes[sites[s]] = bits[rows]
    live = st._live_tags(sites)
    out["table_groups"] = len(st.table_groups())
    out["groups"] = []
    for g in st.table_groups()[: a.groups]:
        c = cpu()
        i, j = blocking.bucket_pairs(live, st.max_bucket, st.site_of, cross_only=True, tables=g)
        c1 = cpu()
        st.measure_pairs(i, j)
        st._flush()
        out["groups"].append({"tables": list(g), "pairs": int(i.size), "bucket_pairs_cpu": c1 - c,
                              "measure_merge_cpu": cpu() - c1})
        print(json.dumps(out["groups"][-1]), flush=True)
    out["peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
