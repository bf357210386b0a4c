"""A secure one-shot prediction job at the scale of real sites, through the coordinator and agent
processes, against the same job in process (issue 10).

    .venv/bin/python -m bench.service_scale [--n 20000] [--sites 6] [--crypto lattice] [--bits 1024]

Fashion-MNIST (the first n training images), Dirichlet β = 0.5 over the sites, 10 % labelled:
(a) through a real coordinator (SQLite) and one agent process per site on 127.0.0.1 (cli.demo's
LocalCluster); then (b) the same job in process (xclp.simulation.run_xclp, what `xclp simulate
predict` runs), replayed with the agents' own seed contributions, so that both build the same LSH
hyperplanes and the labels must be identical. (b) runs after (a) has finished: they do not share the
two cores. Reports both wall times and their ratio (target ≤ 1.5), the peak resident memory of the
coordinator and of each agent (VmHWM, read before they exit; target ≤ 4 GB each) and of the
in-process run, the relayed bytes, and whether the labels are identical. JSON goes to
bench/results/service_scale_<crypto>_<n>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def log(msg: str) -> None:
    print(f"  · [{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


def peak_rss(pid: int) -> int | None:
    """The process's peak resident set size in bytes (Linux /proc; None if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--sites", type=int, default=6)
    ap.add_argument("--crypto", default="lattice")
    ap.add_argument("--bits", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from cli.demo import LocalCluster
    from cli.progress import wait_for_job
    from xclp.data import load_arrays
    from xclp.job_params import JobParams
    from xclp.simulation import run_xclp, unlabelled_accuracy
    from xclp.splits import simulate_sites

    X, y = load_arrays("fashion-mnist", args.n, args.seed)
    ds = simulate_sites(X, y, args.sites, "dirichlet:0.5", 0.1, args.seed, n_classes=10)
    sizes = {s: int((ds.site == s).sum()) for s in ds.sites}
    log(f"fashion-mnist: {ds.n} points over {sizes}, crypto = {args.crypto}, L = {args.bits}")
    options = ["--allow-plaintext"] if args.crypto == "plaintext" else None
    hours = {p: 7200 for p in ("setup", "seed", "counts", "hamming", "row_sums")}
    out: dict = {"config": vars(args) | {"json": None}, "sites": sizes}
    with tempfile.TemporaryDirectory(prefix="xclp-scale-") as work:
        cluster = LocalCluster(Path(work), {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s]} for s in ds.sites},
                               deadlines=hours, agent_options=options)
        try:
            t0 = time.perf_counter()
            job = cluster.admin.submit_job(kind="predict", sites=ds.sites, crypto=args.crypto, bits=args.bits, k=10,
                                           alpha=0.99, classes=10)
            st = wait_for_job(cluster.admin, job, timeout=7200)
            service_seconds = time.perf_counter() - t0
            if st is None or st["status"] != "done":
                log(f"job {job} did not finish: {st and st.get('failure')}")
                return 1
            labels = np.full(ds.n, -1)
            for s in ds.sites:
                labels[np.flatnonzero(ds.site == s)] = np.load(cluster.result(job, s))["labels"]
            memory = {"coordinator": peak_rss(cluster.coordinator.pid)}
            memory |= {s: peak_rss(p.pid) for s, p in cluster.agents.items()}
            contributions = {s: bytes.fromhex(json.loads((cluster.out(s) / ".agent-state" / f"{job}.json")
                                                         .read_text())["contribution"]) for s in ds.sites}
            blobs = Path(work) / "coordinator.db.blobs"
            out["service"] = {"job": job, "seconds": round(service_seconds, 2), "phase_seconds": st["timings"],
                              "peak_memory_bytes": memory,
                              "database_bytes": (Path(work) / "coordinator.db").stat().st_size,
                              "blob_bytes_left": sum(f.stat().st_size for f in blobs.rglob("*") if f.is_file())
                              if blobs.exists() else 0}
            log(f"service: {service_seconds:.1f} s, peak memory (MB) "
                f"{ {k: round((v or 0) / 2**20) for k, v in memory.items()} }")
        finally:
            cluster.close()

    log("the same job in process")
    params = JobParams(job_id=job, n_classes=10, bits=args.bits, k=10, alpha=0.99, crypto=args.crypto).validate()
    t0 = time.perf_counter()
    ref = run_xclp(ds, params, contributions=contributions)
    process_seconds = time.perf_counter() - t0
    out["in_process"] = {"seconds": round(process_seconds, 2), "phase_seconds": {k: round(v, 2) for k, v in ref.timings.items()},
                         "bytes": ref.bytes["total"], "hamming_bytes": ref.bytes["by_phase"].get("hamming"),
                         "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    out["ratio"] = round(service_seconds / process_seconds, 3)
    out["labels_identical"] = bool(np.array_equal(labels, ref.labels))
    out["accuracy"] = {"service": unlabelled_accuracy(ds, labels), "in_process": unlabelled_accuracy(ds, ref.labels)}
    mem = out["service"]["peak_memory_bytes"]
    out["targets"] = {"ratio_at_most_1.5": out["ratio"] <= 1.5,
                      "each_process_at_most_4GB": all(v is not None and v <= 4 << 30 for v in mem.values())}
    path = args.json or Path(f"bench/results/service_scale_{args.crypto}_{args.n}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    gb = lambda b: f"{b / 2**30:.2f} GB" if b else "?"  # noqa: E731
    print(f"| n | sites | crypto | service s | in-process s | ratio | labels identical | coordinator peak | "
          f"largest agent peak | in-process peak | in-process bytes |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
          f"| {ds.n:,} | {len(ds.sites)} | {args.crypto} | {service_seconds:.1f} | {process_seconds:.1f} | "
          f"{out['ratio']:.2f}× | {'yes' if out['labels_identical'] else 'NO'} | {gb(mem['coordinator'])} | "
          f"{gb(max(v or 0 for k, v in mem.items() if k != 'coordinator'))} | "
          f"{gb(out['in_process']['peak_memory_bytes'])} | {out['in_process']['bytes'] / 1e9:.2f} GB |")
    log(f"done: {path}")
    return 0 if out["labels_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
