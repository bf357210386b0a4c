"""The blocked graph through the coordinator and its agents vs in process (issue 23).

    nice -n 10 .venv/bin/python -m bench.scale_service [--n 10000] [--crypto plaintext|masked|lattice]
        [--json bench/results/scale_service.json]

Fashion-MNIST (a seeded subset of n training images), 10 sites, Dirichlet 0.5, 10 % labelled,
L = 1024, plaintext (or --crypto: the agents accept it — masked trusts the coordinator, so they are
started with --allow-trusted-coordinator), graph="blocked". First the job through a coordinator and 10 agent processes
(real HTTP on 127.0.0.1, SQLite): wall time from submission (once every agent has started and asked for
work) to the last site's labels, and the peak
resident memory (VmHWM) of every process. Then the same job in process (`run_xclp`, in a child process
of its own for its peak memory) with the agents' seed contributions, so the labels must be identical.
Reported: both times, their ratio, every peak, and the fraction of labels identical.
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


def dataset(n: int, seed: int):
    from bench.scale import dataset as scale_dataset

    return scale_dataset(n, seed)


def params(job_id: str, crypto: str = "plaintext"):
    from xclp.job_params import JobParams

    return JobParams(job_id=job_id, n_classes=10, bits=1024, graph="blocked", crypto=crypto)


AGENT_OPTIONS = {"plaintext": ["--allow-plaintext"], "masked": ["--allow-trusted-coordinator"], "lattice": []}


def vm_hwm(pid: int) -> int:
    """Peak resident bytes of a live process (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def through_service(n: int, seed: int, work: Path, crypto: str = "plaintext") -> dict:
    from cli.demo import LocalCluster

    ds = dataset(n, seed)
    sites = {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s]} for s in ds.sites}
    cluster = LocalCluster(work, sites, agent_options=AGENT_OPTIONS[crypto], deadlines={"hamming": 3600})
    try:
        # the clock starts once every agent has started and asked for work (process start-up is not the job's)
        t_start = time.perf_counter()
        while set(cluster.admin.sites()["last_seen"]) < set(ds.sites):
            time.sleep(0.2)
        startup = time.perf_counter() - t_start
        t0 = time.perf_counter()
        job = cluster.admin.submit_job(kind="predict", sites=list(ds.sites), crypto=crypto, bits=1024, k=10,
                                       classes=10, graph="blocked")
        while True:
            st = cluster.admin.job(job)
            if st["status"] != "running":
                break
            time.sleep(0.1)
        if st["status"] != "done":
            raise SystemExit(f"the job failed: {st['failure']}")
        paths = {s: cluster.result(job, s, timeout=600) for s in ds.sites}
        seconds = time.perf_counter() - t0
        peaks = {"coordinator": vm_hwm(cluster.coordinator.pid), **{s: vm_hwm(p.pid) for s, p in cluster.agents.items()}}
        labels = np.empty(ds.n, dtype=np.int64)
        for s, path in paths.items():
            labels[ds.site == s] = np.load(path)["labels"]
        contributions = {s: json.loads((cluster.out(s) / ".agent-state" / f"{job}.json").read_text())["contribution"]
                         for s in ds.sites}
        return {"seconds": seconds, "startup_seconds": startup, "peak_bytes": peaks, "labels": labels.tolist(), "job": job,
                "contributions": contributions, "timings": st["timings"]}
    finally:
        cluster.close()


def in_process(n: int, seed: int, job: str, contributions: dict, crypto: str = "plaintext") -> dict:
    import resource

    from xclp.simulation import run_xclp

    ds = dataset(n, seed)
    t0 = time.perf_counter()
    res = run_xclp(ds, params(job, crypto), contributions={s: bytes.fromhex(c) for s, c in contributions.items()})
    return {"seconds": time.perf_counter() - t0, "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "labels": res.labels.tolist(), "timings": res.timings}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--crypto", choices=sorted(AGENT_OPTIONS), default="plaintext")
    ap.add_argument("--json", default="bench/results/scale_service.json")
    ap.add_argument("--in-process", metavar="JOB_JSON", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.in_process:  # the child: one in-process run, its result as one JSON line
        spec = json.loads(Path(a.in_process).read_text())
        print(json.dumps(in_process(a.n, a.seed, spec["job"], spec["contributions"], a.crypto)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        svc = through_service(a.n, a.seed, Path(tmp), a.crypto)
        spec = Path(tmp) / "job.json"
        spec.write_text(json.dumps({"job": svc["job"], "contributions": svc["contributions"]}))
        out = subprocess.run([sys.executable, "-m", "bench.scale_service", "--n", str(a.n), "--seed", str(a.seed),
                              "--crypto", a.crypto, "--in-process", str(spec)], capture_output=True, text=True, check=True)
        local = json.loads(out.stdout.strip().splitlines()[-1])
    same = float(np.mean(np.array(svc["labels"]) == np.array(local["labels"])))
    result = {"n": a.n, "sites": 10, "crypto": a.crypto, "graph": "blocked", "bits": 1024,
              "in_process_seconds": round(local["seconds"], 2), "service_seconds": round(svc["seconds"], 2),
              "ratio": round(svc["seconds"] / local["seconds"], 3), "labels_identical": same,
              "agents_startup_seconds": round(svc["startup_seconds"], 2),
              "in_process_peak_bytes": local["peak_bytes"], "service_peak_bytes": svc["peak_bytes"],
              "in_process_phases": {k: round(v, 2) for k, v in local["timings"].items()},
              "service_phases": svc["timings"]}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
