"""A prediction job and a training job over slow links: HTTP round trips, and time at 100 ms RTT vs none.

    python -m bench.slow_link [--rtt-ms 100] [--mbit 0] [--points 450] [--crypto lattice] [--rounds 2]
        [--repeats 1] [--json bench/results/slow_link.json]

Needs root (network namespaces). The coordinator and three site agents run on hosts of their own
(netsim.hosts: a namespace each, joined by a switch); each agent reaches the coordinator through a
netsim.proxy in its own namespace, which counts its HTTP requests and, in the slow run, holds every
chunk `--rtt-ms`/2 in each direction (and caps each direction at `--mbit`, if given). The loopback run
goes through the same proxies with no delay, so both runs pay the same hops.

Jobs: a `--crypto` prediction job over `--points` digits (3 sites, Dirichlet 1.0, 15 % labelled,
L = 256, k = 8), and a FedAvg+XCLP training job (MLP, `--rounds` rounds, E = 1, its XCLP child jobs in
`--crypto`), both after a warm-up job of each kind. Time runs from the submit to `done`.

Round trips: the requests a site sent during the job (its proxy's count); a site's requests go one
after the other, the sites in parallel, so the job's critical path is at most the busiest site's
count (`round_trips`). The check: time at RTT ≤ loopback time + round_trips × RTT × 1.5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _cluster(work: Path, points: int):
    from cli.demo import LocalCluster
    from netsim.cluster import NetClusterMixin
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites

    class Cluster(NetClusterMixin, LocalCluster):
        pass

    X, y = load_arrays("digits", limit=points, seed=7)
    ds = simulate_sites(X, y, 3, "dirichlet:1.0", 0.15, seed=7)
    sites = {s: {"X": ds.X[ds.site == s] / 16.0, "y": ds.y[ds.site == s]} for s in ds.sites}
    cluster = Cluster(work, sites, start_agents=True, hosts=ds.sites, proxied=ds.sites,
                      agent_options=["--allow-plaintext", "--allow-unmasked-training"])
    return cluster, ds


def _run(cluster, ds, kind: str, crypto: str, rounds: int) -> dict:
    before = {s: cluster.proxy_stats(s) for s in ds.sites}
    t = time.perf_counter()
    if kind == "predict":
        job = cluster.admin.submit_job(kind="predict", sites=ds.sites, crypto=crypto, bits=256, k=8, classes=10)
    else:
        job = cluster.admin.submit_train(algorithm="fedavg-xclp", sites=ds.sites, classes=10, crypto=crypto,
                                         rounds=rounds, sites_per_round=3, local_epochs=1, lr=0.1, bits=256, k=8,
                                         alpha=0.99, seed=0)
    while (st := cluster.admin.job(job))["status"] == "running":
        time.sleep(0.05)
    seconds = time.perf_counter() - t
    if st["status"] != "done":
        raise SystemExit(f"{kind} job {job} failed: {st['failure']}\n{_logs(cluster)}")
    time.sleep(0.3)  # the proxies write their counters every 0.1 s
    after = {s: cluster.proxy_stats(s) for s in ds.sites}
    requests = {s: after[s]["requests"] - before[s].get("requests", 0) for s in ds.sites}
    moved = {s: (after[s]["bytes_up"] - before[s].get("bytes_up", 0)) + (after[s]["bytes_down"]
                                                                        - before[s].get("bytes_down", 0))
             for s in ds.sites}
    routes = {}
    for s in ds.sites:
        for r, n in after[s]["routes"].items():
            routes[r] = routes.get(r, 0) + n - before[s].get("routes", {}).get(r, 0)
    return {"job": job, "seconds": seconds, "requests": requests, "round_trips": max(requests.values()),
            "bytes": moved, "routes": {r: n for r, n in sorted(routes.items()) if n}}


def _logs(cluster) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}" for f in sorted(cluster.work.glob("*.log")))


def _set(cluster, ds, rtt_ms: float, mbit: float) -> None:
    cond = {"delay_ms": rtt_ms / 2, **({"up_mbit": mbit, "down_mbit": mbit} if mbit else {})}
    for s in ds.sites:
        cluster.condition(s, **cond)
    time.sleep(0.3)  # (the proxies read their control files every 50 ms)


def main(argv: list[str] | None = None) -> int:
    from netsim.hosts import unavailable

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rtt-ms", type=float, default=100.0)
    p.add_argument("--mbit", type=float, default=0.0, help="cap each direction of each site's link (0: none)")
    p.add_argument("--points", type=int, default=450)
    p.add_argument("--crypto", default="lattice")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", default=str(RESULTS / "slow_link.json"))
    a = p.parse_args(argv)
    if (why := unavailable()) is not None:
        raise SystemExit(f"bench.slow_link needs network namespaces: {why}")
    out = {"config": {"rtt_ms": a.rtt_ms, "mbit": a.mbit or None, "points": a.points, "crypto": a.crypto,
                      "rounds": a.rounds, "sites": 3, "repeats": a.repeats}, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="xclp-bench-slow-") as work:
        cluster, ds = _cluster(Path(work), a.points)
        try:
            _set(cluster, ds, 0, 0)
            for kind in ("predict", "train"):  # warm-up: imports, torch, the first keys
                _run(cluster, ds, kind, a.crypto, 1)
            for kind in ("predict", "train"):
                runs = {"loopback": [], "slow": []}
                for rep in range(a.repeats):
                    for name, rtt, mbit in (("loopback", 0, 0), ("slow", a.rtt_ms, a.mbit)):
                        _set(cluster, ds, rtt, mbit)
                        runs[name].append(_run(cluster, ds, kind, a.crypto, a.rounds))
                        r = runs[name][-1]
                        print(f"{kind} {name} {rep + 1}: {r['seconds']:.1f} s, requests per site {r['requests']}",
                              flush=True)
                fast = statistics.median(r["seconds"] for r in runs["loopback"])
                slow = statistics.median(r["seconds"] for r in runs["slow"])
                trips = max(r["round_trips"] for r in runs["slow"])
                bound = fast + trips * a.rtt_ms / 1000 * 1.5
                out["runs"][kind] = {"loopback_seconds": fast, "slow_seconds": slow, "round_trips": trips,
                                     "round_trips_loopback": max(r["round_trips"] for r in runs["loopback"]),
                                     "bound_seconds": bound, "within_bound": slow <= bound,
                                     "rtt_cost_seconds": slow - fast,
                                     "seconds_per_round_trip": (slow - fast) / trips if trips else None,
                                     "detail": runs}
        finally:
            cluster.close()
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    for kind, r in out["runs"].items():
        print(f"{kind}: loopback {r['loopback_seconds']:.1f} s, {a.rtt_ms:g} ms RTT {r['slow_seconds']:.1f} s, "
              f"{r['round_trips']} round trips (busiest site) → bound {r['bound_seconds']:.1f} s: "
              f"{'PASS' if r['within_bound'] else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
