"""Soak (issue 36, point 4): small prediction jobs back to back on one coordinator and three agents,
with the retention rule an operator runs from cron (`xclp job purge --older-than DAYS`, here its API
every --purge-every jobs with a window of --retain-seconds), and what must stay flat measured.

    .venv/bin/python -m bench.soak [--jobs 200] [--retain-seconds 60] [--purge-every 10]
        [--database URL] [--json bench/results/soak.json]

Measured after every job: the coordinator's resident memory and open files (its process tree); after
every purge: the database's bytes (SQLite: the file and its write-ahead log; PostgreSQL: the
schema's tables, pg_total_relation_size) and the blob store's. Reported: the least-squares slope of
each against the job number after a warm-up (--warm jobs), and whether it is bounded — memory: the
slope over the run at most 15 % of the warm memory + 16 MiB (a leak of one job's arrays or of a
connection per job grows by more); open files: at most 3 more at the end than after the warm-up;
the stores: after the retention window has filled, what the last purge leaves grows only by the
purged jobs' tombstone rows (bytes per job reported). At the end, each agent's folder holds only its
identity, its ledger, and per job its results and its state record with the keys wiped (the checks of
tests/network/test_soak.py, bench/proc_stats.py). JSON is rewritten after every purge: a run stopped
early keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def log(msg: str) -> None:
    print(f"  · [{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


def _db_bytes(url: str) -> int:
    from bench.proc_stats import tree_bytes

    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        return sum(tree_bytes(Path(str(path) + ext)) for ext in ("", "-wal", "-shm"))
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.connect() as conn:
        n = conn.execute(text("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                              "JOIN pg_namespace n ON n.oid = c.relnamespace "
                              "WHERE n.nspname = current_schema() AND c.relkind = 'r'")).scalar()
    eng.dispose()
    return int(n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--warm", type=int, default=10, help="jobs before the flatness is measured")
    p.add_argument("--retain-seconds", type=float, default=60.0, help="the retention window (--older-than)")
    p.add_argument("--purge-every", type=int, default=10)
    p.add_argument("--points", type=int, default=180, help="digits over the three sites")
    p.add_argument("--database", default=None, help="default: SQLite in the work folder")
    p.add_argument("--json", default=str(RESULTS / "soak.json"))
    a = p.parse_args(argv)

    from bench.fifty_agents import _drop_schema, _schema_url
    from bench.proc_stats import agent_folder_problems, open_files, rss_kib, slope, tree_bytes
    from cli.demo import LocalCluster
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites

    X, y = load_arrays("digits", limit=a.points, seed=3)
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=3)
    sites = {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s]} for s in ds.sites}
    out: dict = {"config": {k: getattr(a, k) for k in ("jobs", "warm", "retain_seconds", "purge_every", "points")},
                 "load_before": os.getloadavg(), "per_job": [], "purges": []}
    schema = f"xclp_soak_{os.getpid()}"

    def write() -> None:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="xclp-bench-soak-") as work:
        work = Path(work)
        db = _schema_url(a.database, schema) if a.database else f"sqlite:///{work / 'coordinator.db'}"
        out["config"]["database"] = "postgresql" if a.database else "sqlite"
        cluster = LocalCluster(work, sites, database=db, start_agents=True, agent_options=["--allow-plaintext"])
        blobs = work / "blobs"  # (the coordinator's default blob folder beside its SQLite file; PostgreSQL: below)
        try:
            pid, jobs, t0 = cluster.coordinator.pid, [], time.perf_counter()
            for i in range(1, a.jobs + 1):
                t = time.perf_counter()
                job = cluster.admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=128, k=6,
                                               classes=10)
                while (st := cluster.admin.job(job))["status"] == "running":
                    time.sleep(0.05)
                if st["status"] != "done":
                    raise SystemExit(f"job {i} ({job}) {st['status']}: {st.get('failure')}")
                for s in ds.sites:  # the job ends for a site once it has written its labels
                    if not cluster.result(job, s, timeout=120).exists():
                        raise SystemExit(f"job {i} ({job}): no labels at {s}")
                jobs.append(job)
                out["per_job"].append({"job": i, "seconds": round(time.perf_counter() - t, 2),
                                       "rss_kib": rss_kib(pid), "open_files": open_files(pid)})
                if i % a.purge_every == 0 or i == a.jobs:
                    r = cluster.admin.purge_jobs_older_than(a.retain_seconds / 86400)
                    blob_dir = next((d for d in (blobs, *work.glob("*blobs*")) if d.is_dir()), blobs)
                    out["purges"].append({"after_job": i, "purged": len(r["purged"]),
                                          "db_bytes": _db_bytes(db), "blob_bytes": tree_bytes(blob_dir),
                                          "jobs_kept": sum(not j.get("purged_at") for j in cluster.admin.jobs()),
                                          "seconds_so_far": round(time.perf_counter() - t0, 1)})
                    log(f"job {i}: {out['per_job'][-1]}, purge {out['purges'][-1]}")
                    write()
            out["seconds"] = round(time.perf_counter() - t0, 1)
            # flatness over the jobs after the warm-up
            after = [r for r in out["per_job"] if r["job"] > a.warm]
            xs = [r["job"] for r in after]
            rss_slope = slope(xs, [r["rss_kib"] for r in after])
            warm = out["per_job"][a.warm - 1]
            last = out["per_job"][-1]
            grown_kib = rss_slope * (len(after) - 1)
            out["flat"] = {
                "rss_kib_warm": warm["rss_kib"], "rss_kib_last": last["rss_kib"],
                "rss_slope_kib_per_job": round(rss_slope, 1), "rss_growth_fit_kib": round(grown_kib),
                "rss_bounded": grown_kib <= warm["rss_kib"] * 0.15 + 16 * 1024,
                "open_files_warm": warm["open_files"], "open_files_last": last["open_files"],
                "open_files_slope_per_job": round(slope(xs, [r["open_files"] for r in after]), 4),
                "open_files_bounded": last["open_files"] <= warm["open_files"] + 3}
            # the stores, once the retention window is full: only tombstones accumulate
            full = [q for q in out["purges"] if q["seconds_so_far"] > 2 * a.retain_seconds]
            if len(full) >= 2:
                db_slope = slope([q["after_job"] for q in full], [q["db_bytes"] for q in full])
                blob_slope = slope([q["after_job"] for q in full], [q["blob_bytes"] for q in full])
                out["stores"] = {"db_bytes_first": full[0]["db_bytes"], "db_bytes_last": full[-1]["db_bytes"],
                                 "db_slope_bytes_per_job": round(db_slope), "blob_slope_bytes_per_job": round(blob_slope),
                                 "blob_bytes_last": full[-1]["blob_bytes"],
                                 "jobs_kept_max": max(q["jobs_kept"] for q in full)}
            # each agent, idle: only what is meant to outlast its jobs
            end, problems = time.monotonic() + 60, None
            while problems != [] and time.monotonic() < end:
                problems = [q for s in ds.sites for q in agent_folder_problems(cluster.out(s), jobs)]
                if problems:
                    time.sleep(0.5)
            out["agent_folders_clean"] = not problems
            out["agent_folder_problems"] = problems[:20]
            out["agent_state_files"] = {s: len(list((cluster.out(s) / ".agent-state").iterdir())) for s in ds.sites}
        finally:
            cluster.close()
            if a.database:
                _drop_schema(a.database, schema)
    out["load_after"] = os.getloadavg()
    write()
    print(json.dumps({k: out.get(k) for k in ("seconds", "flat", "stores", "agent_folders_clean")}, indent=1))
    ok = out["agent_folders_clean"] and out["flat"]["rss_bounded"] and out["flat"]["open_files_bounded"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
