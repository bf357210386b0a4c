"""`xclp demo`: the real system on one machine — a coordinator and N site agents as separate
processes on 127.0.0.1, a secure one-shot prediction job over the digits data, and the accuracy of
XCLP against per-site and centralized label propagation.

The demo keeps the true labels aside (they never reach the agents or the coordinator) and scores
each site's output file against them.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def xclp_command() -> list[str]:
    return [sys.executable, "-m", "xclp.cli"]


def start_coordinator(workdir: Path, port: int, admin: str, database: str | None = None,
                      deadlines: dict | None = None, log_name: str = "coordinator.log") -> subprocess.Popen:
    db = database or f"sqlite:///{workdir / 'coordinator.db'}"
    cmd = xclp_command() + ["coordinator", "serve", "--host", "127.0.0.1", "--port", str(port), "--database", db,
                            f"--admin-token={admin}"]
    for phase, secs in (deadlines or {}).items():
        cmd += ["--deadline", f"{phase}={secs}"]
    log = open(workdir / log_name, "ab")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=_repo_root())


def start_agent(workdir: Path, url: str, site: str, token: str, data: Path, out: Path,
                public: Path | None = None) -> subprocess.Popen:
    log = open(workdir / f"agent-{site}.log", "ab")
    extra = ["--public", str(public)] if public is not None else []
    return subprocess.Popen(xclp_command() + ["agent", "run", "--coordinator", url, "--site", site, f"--token={token}",
                                              "--data", str(data), "--out", str(out), "--poll", "0.05", *extra],
                            stdout=log, stderr=subprocess.STDOUT, cwd=_repo_root())


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[1])


def wait_healthy(url: str, timeout: float = 60.0) -> None:
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"coordinator at {url} did not become healthy in {timeout} s")


def run_demo(crypto: str = "ot", json_out: Path | None = None, bits: int = 1024, sites: int = 3, seed: int = 0,
             workdir: str | None = None) -> int:
    from clients.api import CoordinatorClient
    from xclp.baselines import centralized_lp, per_site_lp
    from xclp.data import load_arrays
    from xclp.progress import wait_for_job
    from xclp.simulation import unlabelled_accuracy
    from xclp.splits import simulate_sites

    t0 = time.perf_counter()
    work = Path(workdir or tempfile.mkdtemp(prefix="xclp-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    X, y = load_arrays("digits")
    ds = simulate_sites(X, y, sites, "dirichlet:0.5", 0.1, seed=seed)
    names = ds.sites
    admin = secrets.token_urlsafe(16)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"xclp demo: {ds.n} digits over {sites} sites (Dirichlet β=0.5, 10% labelled), crypto={crypto}, "
          f"L={bits}; working in {work}", file=sys.stderr)
    procs = [start_coordinator(work, port, admin)]
    try:
        wait_healthy(url)
        admin_client = CoordinatorClient(url, admin)
        for s in names:
            idx = np.flatnonzero(ds.site == s)
            np.savez(work / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])  # the site's own file: no truth, no site column
            token = admin_client.add_site(s)["token"]
            procs.append(start_agent(work, url, s, token, work / f"{s}.npz", work / f"out-{s}"))
        job = admin_client.submit_job(kind="predict", sites=names, crypto=crypto, bits=bits, k=10, alpha=0.99,
                                      classes=ds.n_classes)
        st = wait_for_job(admin_client, job, timeout=600)
        if st is None or st["status"] != "done":
            print(f"job {job} did not finish: {st and st['failure']}", file=sys.stderr)
            return 1
        labels = np.full(ds.n, -1)
        for s in names:
            path = work / f"out-{s}" / f"{job}.npz"
            end = time.monotonic() + 60
            while not path.exists() and time.monotonic() < end:
                time.sleep(0.05)
            labels[np.flatnonzero(ds.site == s)] = np.load(path)["labels"]
        seconds = time.perf_counter() - t0
        base = {"per_site": per_site_lp(ds, k=10), "centralized": centralized_lp(ds, k=10)}
        acc = {"xclp": unlabelled_accuracy(ds, labels)} | {k: unlabelled_accuracy(ds, v) for k, v in base.items()}
        per_site = {s: {"xclp": unlabelled_accuracy(ds, labels, ds.site == s)}
                    | {k: unlabelled_accuracy(ds, v, ds.site == s) for k, v in base.items()} for s in names}
        print(f"\nsecure one-shot prediction job {job} ({crypto}), {seconds:.1f} s; phase seconds: {st['timings']}")
        print(f"{'site':<8}{'points':>8}{'labels':>8}{'xclp %':>10}{'per-site LP %':>15}{'centralized %':>15}")
        for s in names:
            m = ds.site == s
            r = per_site[s]
            print(f"{s:<8}{int(m.sum()):>8}{int((ds.y[m] >= 0).sum()):>8}{100 * r['xclp']:>10.2f}"
                  f"{100 * r['per_site']:>15.2f}{100 * r['centralized']:>15.2f}")
        print(f"{'all':<8}{ds.n:>8}{int((ds.y >= 0).sum()):>8}{100 * acc['xclp']:>10.2f}"
              f"{100 * acc['per_site']:>15.2f}{100 * acc['centralized']:>15.2f}")
        if json_out:
            Path(json_out).write_text(json.dumps({"crypto": crypto, "sites": sites, "job": job, "bits": bits,
                                                  "accuracy": acc, "per_site_accuracy": per_site,
                                                  "seconds": round(seconds, 3), "timings": st["timings"]}, indent=2))
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if os.environ.get("XCLP_DEMO_KEEP") is None and workdir is None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
