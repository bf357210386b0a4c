"""The operator's looks under many polling sites, without the sites' work (issue 36, point 3): a
coordinator process on PostgreSQL, one prediction job over --sites sites, and one thread per site that
polls as an agent in a running job does — `GET /work`, `GET /jobs/{id}` (the site's status), a long
poll for a message from the coordinator (`?wait=2`, which does not come), then --poll seconds' rest —
while the operator's three looks (`GET /jobs/{id}`, what `xclp job status` asks; the dashboard's /ui
and /ui/jobs/{id}) are timed every --sample-every seconds for --seconds (bench.fifty_agents' sampler).

    .venv/bin/python -m bench.poll_load [--sites 30] [--seconds 40] [--phase setup|seed|hamming]
        [--database URL] [--json bench/results/poll_load.json]

--phase seed: every site announces first (a real announce), so the job waits in its seed phase, where
who it awaits is read from the sites' relayed seed messages. --phase hamming (the default): the job's
row is written as its machine leaves it in the hamming phase — every announce and intra in, both shares
of two thirds of the pairs — where who it awaits is read from every pair's shares: the phase that most of
bench.fifty_agents' prediction job is. A medium-scale, cheap reproduction of
bench.fifty_agents' load on the coordinator (its requests, not its agents' 50 processes): the numbers
are the coordinator's answer times on this machine, upper bounds on a shared one.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from bench.fifty_agents import RESULTS, Sampler, _drop_schema, _requests_total, _schema_url, _summary, log


def _agent_loop(url: str, token: str, job: str, poll: float, stop: threading.Event, counts: dict,
                wait: float = 2.0) -> None:
    import httpx

    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=60, headers=h) as c:
        while not stop.is_set():
            try:
                c.get("/work").raise_for_status()
                c.get(f"/jobs/{job}").raise_for_status()
                r = c.get(f"/jobs/{job}/messages/poll-load-never", params={"wait": wait})
                if r.status_code not in (200, 404):
                    r.raise_for_status()
                counts["loops"] += 1
            except httpx.HTTPError as exc:
                counts["errors"] += 1
                counts["last_error"] = repr(exc)
            stop.wait(poll)


def _announce(url: str, job: str, tokens: dict[str, str]) -> None:
    import httpx
    import numpy as np

    from crypto.keys import SiteKeyPair
    from xclp.announce import encode_announce

    for name, token in tokens.items():
        body = encode_announce(name, SiteKeyPair.generate().public_bytes(), 4, np.array([0]), bytes(32))
        httpx.put(f"{url}/jobs/{job}/messages/announce", content=body, timeout=60,
                  headers={"Authorization": f"Bearer {token}"}).raise_for_status()


def _into_hamming(db_url: str, job: str, sites: list[str]) -> None:
    """The job in its hamming phase, written into its row as its machine would have left it after the
    earlier phases (every site announced, 4 points each), with every site's intra and both shares of
    two thirds of the pairs in (a phase two thirds through: who it awaits is read from every pair)."""
    import numpy as np
    from sqlalchemy import create_engine

    from service.db import COORDINATOR, Job, make_sessionmaker
    from service.lifecycle import put_message
    from xclp.announce import encode_announce
    from xclp.prediction_job import PredictState
    from xclp.prediction_topics import Topic

    engine = create_engine(db_url)
    try:
        # The row first, then (a second later) the messages: the coordinator's engine, which read the row in
        # setup just before, would otherwise take its setup step on the announces written here and keep that
        # state over this one (a run here found its job in seed).
        with make_sessionmaker(engine)() as db:
            state = PredictState(sites=sites, live=sites, phase="hamming", seed_sites=sites, graph_sites=sites,
                                 attempts={"setup": 0, "seed": 0, "counts": 0})
            row = db.get(Job, job, with_for_update=True)
            row.machine, row.phase, row.seed_sites, row.graph_sites = state.to_bytes(), "hamming", sites, sites
            db.commit()
        time.sleep(1.0)  # (any step the engine took on the row as it was is over)
        with make_sessionmaker(engine)() as db:
            for s in sites:
                put_message(db, job, s, COORDINATOR, "announce", encode_announce(s, b"k" * 32, 4, np.array([0]), bytes(32)))
                put_message(db, job, s, COORDINATOR, "intra", b"x" * 64)
            pairs = [(a, b) for i, a in enumerate(sites) for b in sites[i + 1:]]
            for a, b in pairs[: 2 * len(pairs) // 3]:
                for s in (a, b):
                    put_message(db, job, s, COORDINATOR, Topic.share(a, b), b"x" * 256)
            db.commit()
    finally:
        engine.dispose()


def _churn(db_url: str, job: str, sites: list[str], rate: float, stop: threading.Event, counts: dict) -> None:
    """Relayed pair messages written at `rate` a second (site to site, as SecureHamming's are), as many
    agents' uploads would: each moves the job's message state, so every look's facts (service.looks) are
    those of a new state — the load of a phase that is moving, not of one that waits."""
    from sqlalchemy import create_engine

    from service.db import make_sessionmaker
    from service.lifecycle import put_message
    from xclp.prediction_topics import Topic

    engine = create_engine(db_url)
    pairs = [(a, b) for i, a in enumerate(sites) for b in sites[i + 1:]]
    n, next_at = 0, time.monotonic()
    try:
        with make_sessionmaker(engine)() as db:
            while not stop.is_set():
                a, b = pairs[n % len(pairs)]
                put_message(db, job, a, b, Topic.pair(a, b, 1000 + n // len(pairs)), b"x" * 64)
                db.commit()
                n += 1
                counts["churned"] = n
                next_at += 1.0 / rate
                stop.wait(max(0.0, next_at - time.monotonic()))
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sites", type=int, default=30)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--phase", choices=("setup", "seed", "hamming"), default="hamming")
    p.add_argument("--poll", type=float, default=0.05, help="a site's rest between its polls (the agents' --poll "
                                                             "in bench.fifty_agents)")
    p.add_argument("--database", default=os.environ.get("XCLP_BENCH_POSTGRES_URL")
                   or os.environ.get("XCLP_TEST_POSTGRES_URL"))
    p.add_argument("--wait", type=float, default=2.0, help="seconds each site's poll for a message is held (its "
                   "long poll; 0: answered at once, as when messages keep coming)")
    p.add_argument("--poll-lane", type=int, default=None, help="the coordinator's --poll-lane (default: its own)")
    p.add_argument("--churn", type=float, default=0.0, help="relayed messages written a second while the sites "
                   "poll (0: none): the job's state moves, as in a running phase")
    p.add_argument("--sample-every", type=float, default=1.0)
    p.add_argument("--json", default=str(RESULTS / "poll_load.json"))
    a = p.parse_args(argv)
    if not a.database:
        raise SystemExit("give --database postgresql+psycopg2://USER:PASSWORD@HOST/DB (or set XCLP_BENCH_POSTGRES_URL)")

    from sqlalchemy.engine import make_url

    from bench.proc_stats import cpu_seconds
    from cli.demo import _new_token, free_port, start_coordinator, stop_processes, wait_healthy
    from clients.api import CoordinatorClient

    schema = f"xclp_poll_{os.getpid()}"
    db = _schema_url(a.database, schema)
    db_port = make_url(a.database).port or 5432
    admin_token, port = _new_token(), free_port()
    url = f"http://127.0.0.1:{port}"
    out: dict = {"config": {"sites": a.sites, "seconds": a.seconds, "phase": a.phase, "poll_s": a.poll, "wait_s": a.wait, "churn": a.churn, "poll_lane": a.poll_lane,
                            "database": "postgresql", "sample_every_s": a.sample_every, "cpus": os.cpu_count()},
                 "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="xclp-bench-poll-") as work:
        coord = None
        stop = threading.Event()
        threads: list[threading.Thread] = []
        try:
            extra = () if a.poll_lane is None else ("--poll-lane", str(a.poll_lane))
            coord = start_coordinator(Path(work), port, admin_token, db, extra=extra)
            wait_healthy(url, 120)
            admin = CoordinatorClient(url, admin_token, retries=5, timeout=120)
            names = [f"site{i:03d}" for i in range(a.sites)]
            tokens = {n: admin.add_site(n)["token"] for n in names}
            job = admin.submit_job(kind="predict", sites=names, crypto="plaintext", bits=128, k=6, classes=10)
            if a.phase == "hamming":
                _into_hamming(db, job, names)
                if admin.job(job)["phase"] != "hamming":
                    raise SystemExit("the job is not in its hamming phase")
            if a.phase == "seed":
                _announce(url, job, tokens)
                end = time.monotonic() + 120
                while admin.job(job)["phase"] != "seed":
                    if time.monotonic() > end:
                        raise SystemExit("the job did not reach its seed phase")
                    time.sleep(0.1)
            counts = {"loops": 0, "errors": 0}
            threads = [threading.Thread(target=_agent_loop, args=(url, tokens[n], job, a.poll, stop, counts, a.wait),
                                        daemon=True, name=f"site-{n}") for n in names]
            if a.churn > 0:
                threads.append(threading.Thread(target=_churn, args=(db, job, names, a.churn, stop, counts), daemon=True))
            for t in threads:
                t.start()
            time.sleep(3)  # (every poller in its loop)
            sampler = Sampler(url, admin_token, coord.pid, port, db_port, a.sample_every)
            cpu0, req0, t0 = cpu_seconds(coord.pid), _requests_total(sampler.http, sampler.admin), time.perf_counter()
            sampler.start(job)
            time.sleep(a.seconds)
            samples = sampler.stop()
            seconds = time.perf_counter() - t0
            cpu1 = cpu_seconds(coord.pid)
            requests = _requests_total(sampler.http, sampler.admin) - req0 - sampler.requests_made - 1
            ok = [s for s in samples if "error" not in s]
            looks = {k: _summary([s[k] for s in ok]) for k in ("job_status_s", "dashboard_s", "job_page_s")}
            worst = max((v.get("max", 0.0) for v in looks.values()), default=None)
            out["result"] = {
                "phase": admin.job(job)["phase"], "seconds": round(seconds, 1),
                "coordinator_cpu_share": round((cpu1 - cpu0) / seconds, 3),
                "requests_per_second": round(requests / seconds, 1), "site_loops": counts["loops"],
                "site_errors": counts["errors"], "churned": counts.get("churned", 0), "site_last_error": counts.get("last_error"),
                "connections_to_database_max": max((s["database"] for s in ok), default=None),
                "looks": looks, "worst_look_seconds": worst, "looks_within_1s": worst is not None and worst <= 1.0,
                "look_errors": [s["error"] for s in samples if "error" in s],
                "load_during": _summary([s["load"] for s in ok])}
            log(f"{a.sites} sites polling, {a.phase}: {out['result']['requests_per_second']} req/s, coordinator "
                f"{out['result']['coordinator_cpu_share']} of a core; looks max {worst}")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=15)
            if coord is not None:
                stop_processes([coord])
            _drop_schema(a.database, schema)
    out["load_after"] = os.getloadavg()
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["result"], indent=1))
    return 0 if out["result"]["looks_within_1s"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
