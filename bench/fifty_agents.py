"""Fifty agents on one coordinator (issue 36, point 3): a coordinator process on PostgreSQL and one
agent process per site on 127.0.0.1, a prediction job over all of them, then a training job over all
of them, with the coordinator's answers to the operator timed while they run.

    .venv/bin/python -m bench.fifty_agents [--agents 50] [--points 30] [--database URL]
        [--json bench/results/fifty_agents.json]

Each site holds --points digits (iid, 20 % labelled). The prediction job is plaintext (the load is the
coordinator's: messages, long polls, the engine's steps over 50 sites, not the sites' cryptography);
the training job is FedAvg with secure aggregation (the pairwise masks: every site's update is
masked against the 49 others), 2 rounds, every site in every round. Measured per job: wall time, the
coordinator's CPU seconds (its process tree) and its peak resident memory, its established
connections (from agents, to the database; sampled), the requests it answered per second (its own
`xclp_requests_total` counter over the job, less the samples below), and the answer time of what an
operator looks at during the job — `GET /jobs/{id}` (what `xclp job status` asks) and the dashboard's
pages (/ui and /ui/jobs/{id}, logged in) — sampled every --sample-every seconds: target ≤ 1 s each.

The database: --database, else $XCLP_BENCH_POSTGRES_URL or $XCLP_TEST_POSTGRES_URL; the bench makes a
schema of its own in it (search_path) and drops it at the end. The agents' and the coordinator's CPU
share the machine: on a machine shared with other work the times are upper bounds; the load average
is recorded at each sample.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def log(msg: str) -> None:
    print(f"  · [{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


def _schema_url(url: str, schema: str) -> str:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    eng = create_engine(url)
    with eng.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    eng.dispose()
    return make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


def _drop_schema(url: str, schema: str) -> None:
    from sqlalchemy import create_engine

    eng = create_engine(url)
    with eng.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    eng.dispose()


def _requests_total(client, headers: dict) -> float:
    """The coordinator's own count of the requests it answered (Prometheus text, every method and status)."""
    r = client.get("/metrics", headers=headers)
    r.raise_for_status()
    text = r.text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("xclp_requests_total{"))


class Sampler:
    """A thread that, every `every` seconds while a job runs, times the operator's three looks and reads
    the coordinator's process tree (memory, connections)."""

    def __init__(self, url: str, admin_token: str, pid: int, port: int, db_port: int | None, every: float):
        import httpx

        self.pid, self.port, self.db_port, self.every = pid, port, db_port, every
        self.http = httpx.Client(base_url=url, timeout=30)
        self.admin = {"Authorization": f"Bearer {admin_token}"}
        r = self.http.post("/ui/login", data={"token": admin_token}, follow_redirects=False,
                           headers={"Origin": url, "Sec-Fetch-Site": "same-origin"})
        if r.status_code != 303 or "location" not in r.headers:
            raise SystemExit(f"the dashboard's login failed: {r.status_code} {r.text[:200]}")
        self.job: str | None = None
        self.samples: list[dict] = []
        self.requests_made = 0
        self.last = None  # the last look's answer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _timed(self, path: str, **kw) -> float:
        t = time.perf_counter()
        r = self.http.get(path, **kw)
        self.requests_made += 1
        if r.status_code != 200:
            raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:200]}")
        self.last = r
        return time.perf_counter() - t

    def sample(self) -> None:
        from bench.proc_stats import rss_kib, tcp_connections

        s = {"t": time.monotonic(), "load": os.getloadavg()[0],
             "job_status_s": self._timed(f"/jobs/{self.job}", headers=self.admin),
             "phase": self.last.json().get("phase"),  # (which step the slow looks came in)
             "dashboard_s": self._timed("/ui"),
             "job_page_s": self._timed(f"/ui/jobs/{self.job}"),
             "rss_kib": rss_kib(self.pid), **tcp_connections(self.pid, self.port, self.db_port)}
        self.samples.append(s)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.sample()
            except Exception as e:  # a look that fails is a finding, not the end of the bench
                self.samples.append({"t": time.monotonic(), "error": repr(e)})

    def start(self, job: str) -> None:
        self.job, self.samples, self.requests_made = job, [], 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="sampler")
        self._thread.start()

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join()
        return self.samples


def _summary(values: list[float]) -> dict:
    if not values:
        return {}
    values = sorted(values)
    return {"n": len(values), "median": statistics.median(values), "p95": values[int(0.95 * (len(values) - 1))],
            "max": values[-1]}


JOB_LIMIT_S = 1800.0  # a job not over by then is recorded as stalled (the bench ends; nothing waits for ever)


def _status(cluster, job: str) -> dict:
    """The job's status; a look the coordinator does not answer in time is a stall sign, not the end."""
    from clients.api import ApiError

    try:
        return cluster.admin.job(job)
    except ApiError as exc:
        log(f"job status not answered: {exc}")
        return {"status": "running", "unanswered": str(exc)}


def _run_job(cluster, sampler: Sampler, what: str, submit) -> dict:
    from bench.proc_stats import cpu_seconds, peak_rss_kib

    pid = cluster.coordinator.pid
    cpu0, req0, t0 = cpu_seconds(pid), _requests_total(sampler.http, sampler.admin), time.perf_counter()
    job = submit()
    sampler.start(job)
    end = time.monotonic() + JOB_LIMIT_S
    while (st := _status(cluster, job))["status"] == "running":
        if time.monotonic() > end:
            st = {**st, "status": "stalled", "failure": f"still running after {JOB_LIMIT_S:g} s"}
            break
        time.sleep(0.25)
    seconds = time.perf_counter() - t0
    samples = sampler.stop()
    cpu1 = cpu_seconds(pid)
    requests = _requests_total(sampler.http, sampler.admin) - req0 - sampler.requests_made - 2  # (the two /metrics reads)
    ok = [s for s in samples if "error" not in s]
    looks = {k: _summary([s[k] for s in ok]) for k in ("job_status_s", "dashboard_s", "job_page_s")}
    worst = max((v.get("max", 0.0) for v in looks.values()), default=None)
    out = {"job": job, "status": st["status"], "failure": st.get("failure"), "dropped": st.get("dropped"),
           "seconds": round(seconds, 2), "coordinator_cpu_seconds": round(cpu1 - cpu0, 2),
           "coordinator_cpu_share": round((cpu1 - cpu0) / seconds, 3),
           "coordinator_rss_peak_mib_sampled": round(max((s["rss_kib"] for s in ok), default=0) / 1024, 1),
           "coordinator_vmhwm_mib": round(peak_rss_kib(pid) / 1024, 1),
           "connections_from_clients_max": max((s["clients"] for s in ok), default=None),
           "connections_to_database_max": max((s["database"] for s in ok), default=None),
           "requests": int(requests), "requests_per_second": round(requests / seconds, 1),
           "looks": looks, "worst_look_seconds": worst, "looks_within_1s": worst is not None and worst <= 1.0,
           "look_errors": [s["error"] for s in samples if "error" in s],
           # each sample with a look over a second: when (s into the job), in which phase, how long each took
           "slow_looks": [{"at_s": round(s["t"] - samples[0]["t"], 1), "phase": s.get("phase"),
                           **{k: round(s[k], 2) for k in ("job_status_s", "dashboard_s", "job_page_s")}}
                          for s in ok if max(s["job_status_s"], s["dashboard_s"], s["job_page_s"]) > 1.0],
           "phases_s": {k: v for k, v in (st.get("timings") or {}).items()},
           "load_during": _summary([s["load"] for s in ok])}
    log(f"{what} {job}: {st['status']} in {seconds:.1f} s; coordinator {out['coordinator_cpu_seconds']} CPU-s, "
        f"{out['requests_per_second']} req/s, looks max {worst}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--points", type=int, default=30, help="digits per site")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--database", default=os.environ.get("XCLP_BENCH_POSTGRES_URL")
                   or os.environ.get("XCLP_TEST_POSTGRES_URL"))
    p.add_argument("--sample-every", type=float, default=1.0)
    p.add_argument("--poll-lane", type=int, default=None, help="the coordinator's --poll-lane (default: its own)")
    p.add_argument("--agent-nice", type=int, default=0, help="the agents' processes at this nice value (0: the "
                   "coordinator's). They stand for the sites' own machines: at 10 they take the CPU the coordinator "
                   "leaves, instead of 50 processes sharing this machine's cores with it at their bursts")
    p.add_argument("--json", default=str(RESULTS / "fifty_agents.json"))
    a = p.parse_args(argv)
    # SIGTERM ends the bench as Ctrl-C does: through the finally below, which stops its 51 processes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not a.database:
        raise SystemExit("give --database postgresql+psycopg2://USER:PASSWORD@HOST/DB (or set XCLP_BENCH_POSTGRES_URL)")

    import numpy as np
    from sqlalchemy.engine import make_url

    from cli.demo import LocalCluster
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites

    X, y = load_arrays("digits", limit=a.agents * a.points, seed=11)
    if len(X) < a.agents * a.points:
        raise SystemExit(f"digits has {len(X)} points: fewer than {a.agents} × {a.points}")
    ds = simulate_sites(X, y, a.agents, "iid", 0.2, seed=11)
    sites = {s: {"X": (ds.X[ds.site == s] / 16.0).astype(np.float32), "y": ds.y[ds.site == s]} for s in ds.sites}
    schema = f"xclp_bench_{os.getpid()}"
    db = _schema_url(a.database, schema)
    db_port = make_url(a.database).port or 5432
    out = {"config": {"agents": a.agents, "points_per_site": a.points, "rounds": a.rounds, "poll_lane": a.poll_lane,
                      "agent_nice": a.agent_nice,
                      "database": "postgresql", "sample_every_s": a.sample_every, "cpus": os.cpu_count()},
           "load_before": os.getloadavg()}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xclp-bench-fifty-") as work:
        cluster = None
        try:
            cluster = LocalCluster(Path(work), sites, database=db, start_agents=False,
                                   agent_options=["--allow-plaintext"],
                                   coordinator_options=[] if a.poll_lane is None else ["--poll-lane", str(a.poll_lane)])
            t = time.perf_counter()
            for s in ds.sites:
                cluster.start_agent(s)
                if a.agent_nice:  # (before the agent starts its threads and processes: they inherit it)
                    os.setpriority(os.PRIO_PROCESS, cluster.agents[s].pid, a.agent_nice)
            # Every agent has reached the coordinator (its first poll) before the job: 50 processes
            # importing at once on a small machine starve every other process for a minute (a first run
            # here saw the job's submission time out at load 50); that start is measured, not the job.
            end = time.monotonic() + 900
            while len(cluster.admin.sites().get("last_seen", {})) < a.agents:
                if time.monotonic() > end or any(p.poll() is not None for p in cluster.agents.values()):
                    raise SystemExit(f"agents did not all reach the coordinator: {cluster.admin.sites()}")
                time.sleep(1)
            out["agents_start_seconds"] = round(time.perf_counter() - t, 1)
            sampler = Sampler(cluster.url, cluster.admin_token, cluster.coordinator.pid, cluster.port, db_port,
                              a.sample_every)
            log(f"coordinator and {a.agents} agents started and polling ({out['agents_start_seconds']} s)")
            out["predict"] = _run_job(cluster, sampler, "predict", lambda: cluster.admin.submit_job(
                kind="predict", sites=ds.sites, crypto="plaintext", bits=128, k=6, classes=10))
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(out, indent=1) + "\n")  # (a run stopped in training keeps this)
            out["train"] = _run_job(cluster, sampler, "train", lambda: cluster.admin.submit_train(
                algorithm="fedavg", sites=ds.sites, classes=10, model="mlp", rounds=a.rounds,
                sites_per_round=a.agents, local_epochs=1, lr=0.1, seed=5))
            written = sum(len(list(cluster.out(s).glob(f"{out['predict']['job']}.npz"))) for s in ds.sites)
            out["predict"]["sites_with_labels"] = written
            out["agents_alive_at_end"] = sum(p.poll() is None for p in cluster.agents.values())
        finally:
            if cluster is not None:
                if any(out.get(k, {}).get("status") != "done" for k in ("predict", "train")):
                    for f in sorted(Path(work).glob("*.log"))[:5]:
                        log(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}")
                cluster.close()
            _drop_schema(a.database, schema)
    out["total_seconds"] = round(time.perf_counter() - t_start, 1)
    out["load_after"] = os.getloadavg()
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("predict", "train") if k in out}, indent=1))
    ok = all(out.get(k, {}).get("status") == "done" and out[k]["looks_within_1s"] for k in ("predict", "train"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
