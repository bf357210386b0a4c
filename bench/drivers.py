"""A prediction job through each of its three drivers, before and after the one order (issue 24).

    nice -n 5 .venv/bin/python bench/drivers.py [--tree PATH] [--old ccc91e6|PATH] [--repeats 3]
        [--drivers simulation,service,flower] [--json bench/results/drivers.json] [--md docs/benchmarks.md]

Two code trees: the new one (--tree, default the repository this file is in) and the old one (--old:
a folder, or a revision that `git archive` writes into a temporary folder; default ccc91e6, the
commit before the prediction job's order moved into xclp/prediction_job.py). Every timed job runs
in a fresh subprocess with PYTHONPATH set to exactly that tree (`python -P`: nothing is imported
from the folder of this file), and the two trees alternate, old/new then new/old, for each driver
and repeat, so that the shared machine's load falls on both alike.

The same data in every run: digits, 600 points, 3 sites (Dirichlet β = 0.5, 10 % labelled, seed
0); the lattice protocol, L = 256, k = 8, α = 0.99. The drivers, each timed from the job's start to
the last site's labels (imports, data and set-up outside the clock):

- simulation: `xclp.simulation.run_xclp(ds, params)` in process (seed 0: the same seed contributions
  in both trees, so the labels must be identical between the trees, which is checked);
- service: the real coordinator app (`service.app.create_app`, SQLite in a temporary folder, its
  engine thread) behind FastAPI's TestClient, and three `clients.agent.Agent`s stepped in turn in
  this process (as tests/service/test_engine_inprocess.py does); clock from the submit to the last
  result file;
- flower: `xclp_flower.grid.InProcessGrid` with the ClientApp and `FlowerXCLP(grid, params).run()`
  (as tests/flower/test_flower_inprocess.py does): every message goes straight to a fresh ClientApp
  call, every node's Context through Flower's serialisation between calls.

On the first repeat the service's and Flower's labels are also checked equal to the same tree's
simulation with the sites' own seed contributions. Seconds are wall clock on a shared 2-core
machine: read the ratio new/old of the medians, measured in one run, and the spread of the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
DRIVERS = ("simulation", "service", "flower")
CFG = dict(dataset="digits", n=600, sites=3, split="dirichlet:0.5", labelled=0.1, seed=0, crypto="lattice",
           bits=256, k=8, alpha=0.99)
HEADING = "## Drivers before and after the one order (issue 24)"
ADMIN = "drivers-bench-admin-token-0123456789abcdef"  # the coordinator wants at least 32 characters


# ----------------------------------------------------------------------------------------------
# The child: one job through one driver, importing only from the tree on PYTHONPATH.
# ----------------------------------------------------------------------------------------------

def _dataset(cfg: dict):
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites

    X, y = load_arrays(cfg["dataset"], cfg["n"], cfg["seed"])
    return simulate_sites(X, y, cfg["sites"], cfg["split"], cfg["labelled"], seed=cfg["seed"])


def _params(ds, cfg: dict, job: str):
    try:
        from xclp.job_params import JobParams
    except ImportError:  # the old tree (ccc91e6) is from before xclp/protocol.py's split (96e690a)
        from xclp.protocol import JobParams

    return JobParams(job_id=job, n_classes=ds.n_classes, bits=cfg["bits"], k=cfg["k"], alpha=cfg["alpha"],
                     crypto=cfg["crypto"]).validate()


def _same_as_simulation(ds, cfg: dict, job: str, contributions: dict, got: dict) -> bool:
    """The driver's labels and confidences equal run_xclp's with the sites' own seed contributions."""
    import numpy as np

    from xclp.simulation import run_xclp

    ref = run_xclp(ds, _params(ds, cfg, job), contributions=contributions)
    return all(np.array_equal(got[s]["labels"], ref.predictions[s].labels)
               and np.array_equal(got[s]["confidence"], ref.predictions[s].confidence) for s in ds.sites)


def child_simulation(ds, cfg: dict, work: Path, check: bool) -> dict:
    import numpy as np

    from xclp.simulation import run_xclp

    params = _params(ds, cfg, "drivers-bench")
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_xclp(ds, params)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    np.savez(work / "labels.npz", labels=res.labels, confidence=res.confidence)
    return {"seconds": seconds, "cpu_seconds": cpu, "phase_seconds": {k: round(v, 4) for k, v in res.timings.items()},
            "bytes": int(res.bytes["total"]), "labels": str(work / "labels.npz")}


def child_service(ds, cfg: dict, work: Path, check: bool) -> dict:
    import numpy as np
    from fastapi.testclient import TestClient

    from clients.agent import Agent
    from clients.api import CoordinatorClient
    from service.app import Settings, create_app

    settings = Settings(database=f"sqlite:///{work / 'coordinator.db'}", admin_token=ADMIN)
    # an agent takes part only with peers it knows (its membership) or, as here, trusts on first use; a tree
    # from before memberships has no such flag
    import inspect

    trust = {"trust_on_first_use": True} if "trust_on_first_use" in inspect.signature(Agent).parameters else {}
    with TestClient(create_app(settings)) as tc:
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)
        agents = {}
        for s in ds.sites:
            token = admin.add_site(s)["token"]
            idx = np.flatnonzero(ds.site == s)
            np.savez(work / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])
            client = CoordinatorClient("http://testserver", token, transport=tc._transport)
            agents[s] = Agent(client, s, work / f"{s}.npz", work / f"out-{s}", **trust)
        t0, c0 = time.perf_counter(), time.process_time()
        job = admin.submit_job(kind="predict", sites=ds.sites, crypto=cfg["crypto"], bits=cfg["bits"], k=cfg["k"],
                               alpha=cfg["alpha"], classes=ds.n_classes)
        steps = idle = 0
        next_look = 0.0
        deadline = time.monotonic() + 600
        while not all(a.result_path(job).exists() for a in agents.values()):
            busy = False
            for a in agents.values():
                busy |= bool(a.step(job))
                steps += 1
            if not busy:
                idle += 1
                if time.monotonic() > next_look:  # a failed job would leave the agents idle for ever
                    st = admin.job(job)
                    if st["status"] == "failed":
                        raise RuntimeError(f"job {job} failed: {st.get('failure')}")
                    next_look = time.monotonic() + 1.0
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {job}: no results after 600 s: {admin.job(job)}")
                time.sleep(0.005)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        st = admin.job(job)
        got = {s: dict(np.load(a.result_path(job))) for s, a in agents.items()}
        contributions = {s: bytes.fromhex(a.state(job)["contribution"]) for s, a in agents.items()}
    out = {"seconds": seconds, "cpu_seconds": cpu, "phase_seconds": st.get("timings") or {}, "agent_steps": steps,
           "idle_rounds": idle}
    if check:
        out["labels_equal_simulation"] = _same_as_simulation(ds, cfg, job, contributions, got)
    return out


def child_flower(ds, cfg: dict, work: Path, check: bool) -> dict:
    import numpy as np

    from xclp_flower import prediction
    from xclp_flower.client_app import app as client_app
    from xclp_flower.grid import InProcessGrid
    from xclp_flower.prediction import FlowerXCLP

    rounds: list[tuple[str, float, float]] = []  # each message round: (step or phase, CPU s, wall s)
    link = getattr(prediction, "FlowerLink", None)
    if link is not None and hasattr(link, "round_to_sites"):  # both trees: every round goes through it
        through = link.round_to_sites

        def timed(self, step, *a, **kw):
            c0, t0 = time.process_time(), time.perf_counter()
            try:
                return through(self, step, *a, **kw)
            finally:
                rounds.append((str(step), time.process_time() - c0, time.perf_counter() - t0))

        link.round_to_sites = timed

    configs = []
    for s in ds.sites:
        idx = np.flatnonzero(ds.site == s)
        np.savez(work / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])
        configs.append({"site": s, "data-path": str(work / f"{s}.npz"), "out": str(work / f"out-{s}"),
                        "trust-on-first-use": "true"})  # (as the service's agents: no membership here)
    grid = InProcessGrid(client_app, configs)
    job = "drivers-bench-flower"
    params = _params(ds, cfg, job)
    t0, c0 = time.perf_counter(), time.process_time()
    summary = FlowerXCLP(grid, params).run()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    got = {s: dict(np.load(summary["written"][s])) for s in ds.sites}
    out = {"seconds": seconds, "cpu_seconds": cpu, "phase_seconds": summary.get("seconds") or {},
           "bytes": int(summary["bytes_total"]),
           "bytes_by_phase": summary.get("bytes") or {},
           "messages_to_nodes": int(sum(getattr(grid, "taken", {}).values())),
           "rounds": [(st, round(c, 4), round(w, 4)) for st, c, w in rounds],
           "payloads_seen": len(getattr(grid, "seen", []))}
    if check:
        contributions = {s: got[s]["seed_contribution"].tobytes() for s in ds.sites}
        out["labels_equal_simulation"] = _same_as_simulation(ds, cfg, job, contributions, got)
    return out


def child(args) -> int:
    import hashlib

    import numpy as np

    cfg = json.loads(args.cfg)
    work = Path(args.work)
    ds = _dataset(cfg)
    data_hash = hashlib.sha256(np.ascontiguousarray(ds.X).tobytes() + np.ascontiguousarray(ds.y).tobytes()
                               + "|".join(map(str, ds.site)).encode()).hexdigest()[:16]
    run = {"simulation": child_simulation, "service": child_service, "flower": child_flower}[args.child]
    out = run(ds, cfg, work, args.check)
    import xclp

    out.update({"driver": args.child, "n": int(ds.n), "data_sha256_16": data_hash,
                "xclp_from": str(Path(xclp.__file__).resolve().parent.parent)})
    Path(args.result).write_text(json.dumps(out))
    return 0


# ----------------------------------------------------------------------------------------------
# The parent: both trees, alternating, then the JSON and the markdown section.
# ----------------------------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"  · {msg}", file=sys.stderr, flush=True)


def git_rev(tree: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+changes" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "?"


def old_tree(spec: str, new: Path, tmp: Path) -> tuple[Path, str]:
    """--old: a folder as it is, or a revision of the new tree's repository written out by git archive."""
    if Path(spec).is_dir():
        return Path(spec).resolve(), git_rev(Path(spec))
    dest = tmp / f"old-{spec}"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(new), "archive", spec], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    rev = subprocess.run(["git", "-C", str(new), "rev-parse", "--short", spec], capture_output=True, text=True,
                         check=True).stdout.strip()
    return dest, rev


def run_child(tree: Path, driver: str, tmp: Path, tag: str, check: bool, timeout: float, *, script: Path = HERE,
              cfg: dict | None = None) -> dict:
    """One timed job in a fresh `python -P script --child driver` with PYTHONPATH = tree (bench/train_drivers.py
    runs its own children through this too)."""
    work = tmp / tag
    work.mkdir()
    result = work / "result.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, "-P", str(script), "--child", driver, "--work", str(work), "--result", str(result),
           "--cfg", json.dumps(CFG if cfg is None else cfg)] + (["--check"] if check else [])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=str(work), capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0 or not result.exists():
        raise RuntimeError(f"{driver} in {tree} failed (rc {p.returncode}):\n{p.stderr[-4000:]}")
    out = json.loads(result.read_text())
    if Path(out["xclp_from"]).resolve() != tree.resolve():
        raise RuntimeError(f"the child imported xclp from {out['xclp_from']}, not {tree}")
    out["process_wall_seconds"] = wall
    return out


def stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": [round(v, 3) for v in values]}


def phase_medians(runs: list[dict]) -> dict:
    names: list[str] = []
    for r in runs:
        names += [k for k in r.get("phase_seconds", {}) if k not in names]
    return {k: round(statistics.median(r.get("phase_seconds", {}).get(k, 0.0) for r in runs), 3) for k in names}


# The Flower driver's phases by the old names (xclp_flower/prediction.py before: one message round a step)
# and the new (the core's phases, xclp.prediction_job): the same work, grouped.
FLOWER_GROUPS = {"announce + roster / setup": ("who", "announce", "roster", "setup"), "seed": ("seed",),
                 "counts": ("counts",), "the pair protocols (pairs / hamming)": ("pairs", "hamming"),
                 "graph + influence solve (the ServerApp's)": ("graph",),
                 "after the pairs: influence + sums / row_sums + done": ("influence", "sums", "row_sums", "done")}


# The message rounds by their step (old) or phase (new) name, grouped the same way.
ROUND_GROUPS = {"announce + roster / setup": ("announce", "roster", "setup"), "seed": ("seed",),
                "counts": ("recount", "counts"), "the pair protocols (pairs / hamming)": ("pairs", "hamming"),
                "after the pairs: influence + sums / row_sums + done": ("influence", "rows", "sums", "row_sums", "done")}


def round_groups(runs: list[dict]) -> dict:
    """Per group: how many message rounds, and the median over the runs of their CPU and wall seconds."""
    out = {}
    for g, names in ROUND_GROUPS.items():
        mine = [[x for x in r.get("rounds", []) if x[0] in names] for r in runs]
        out[g] = {"rounds": len(mine[0]) if mine else 0,
                  "cpu": round(statistics.median(sum(x[1] for x in m) for m in mine), 3) if mine else 0.0,
                  "wall": round(statistics.median(sum(x[2] for x in m) for m in mine), 3) if mine else 0.0}
    return out


def grouped(phases: dict, groups: dict) -> dict:
    return {g: round(sum(phases.get(k, 0.0) for k in ks), 3) for g, ks in groups.items()}


def verdict(old: dict, new: dict) -> str:
    ratio = new["median"] / old["median"]
    if new["min"] > old["max"] and ratio > 1.10:
        return "slower"
    if new["max"] < old["min"] and ratio < 0.90:
        return "faster"
    return "same within noise"


def reading(out: dict) -> str:
    parts = []
    for d, r in out["drivers"].items():
        parts.append(f"{d} {r['ratio_new_over_old']:.2f}× wall, {r['cpu_ratio_new_over_old']:.2f}× CPU ({r['verdict']})")
    text = ["Reading: new / old, " + "; ".join(parts) + "."]
    fl = out["drivers"].get("flower")
    if fl and fl.get("rounds_old"):
        pg, ag = "the pair protocols (pairs / hamming)", "after the pairs: influence + sums / row_sums + done"
        po, pn, ao, an = fl["rounds_old"][pg], fl["rounds_new"][pg], fl["rounds_old"][ag], fl["rounds_new"][ag]
        text.append(
            f"Flower: the new driver sends as many messages ({fl['messages_to_nodes']['new']} to the nodes, old "
            f"{fl['messages_to_nodes']['old']}) and as many bytes ({fl['bytes']['new'] - fl['bytes']['old']:+,}: the "
            f"job's state rides in every round), so what it adds is compute at the sites. The {ao['rounds']} old / "
            f"{an['rounds']} new rounds after the pair protocols cost {ao['cpu']:.2f} → {an['cpu']:.2f} CPU s "
            f"({an['cpu'] / max(ao['cpu'], 1e-9):.1f}×), and the {po['rounds']} / {pn['rounds']} pair rounds "
            f"{po['cpu']:.2f} → {pn['cpu']:.2f} s.")
        if an["cpu"] > 2 * ao["cpu"]:
            text.append(
                "Why: a Flower site keeps no objects between messages, so at each message the ClientApp replays "
                "every input it has taken so far (xclp_flower/replay.py). The old ClientApp skipped the pair "
                "step when it replayed a step after the pairs (`PAST_PAIRS` in the old client_app.py: no later step "
                "needs the pair protocols' state); the new one (`FlowerSite.handle`) replays them all through the "
                "core's `PredictSite`, so each round after the pairs runs the site's share of the lattice "
                "SecureHamming again. That cost grows with the pair protocols' work (points × points), not with "
                f"the round's own message: here {(an['cpu'] - ao['cpu']) / max(an['rounds'], 1):.2f} CPU s more a round.")
    return "\n\n".join(text)


def ratio_table(out: dict, o: str, n: str) -> list[str]:
    """The Markdown table of each driver's old and new seconds, their ratio, verdict and CPU seconds
    (this benchmark's and bench/train_drivers.py's results have the same form)."""
    lines = [f"| driver | old `{o}`: seconds, median (min–max) | new `{n}`: seconds, median (min–max) | new / old "
             f"| verdict | CPU seconds old → new (medians) | CPU new / old |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for d, r in out["drivers"].items():
        lines.append(f"| {d} | {r['old']['median']:.2f} ({r['old']['min']:.2f}–{r['old']['max']:.2f}) | "
                     f"{r['new']['median']:.2f} ({r['new']['min']:.2f}–{r['new']['max']:.2f}) | "
                     f"**{r['ratio_new_over_old']:.2f}×** | {r['verdict']} | {r['cpu_old']['median']:.2f} → "
                     f"{r['cpu_new']['median']:.2f} | {r['cpu_ratio_new_over_old']:.2f}× |")
    return lines


def markdown(out: dict) -> str:
    cfg, trees = out["config"], out["trees"]
    o, n = trees["old"]["rev"], trees["new"]["rev"]
    lines = [
        HEADING, "",
        f"    nice -n 5 .venv/bin/python bench/drivers.py{out['argv']}    # about "
        f"{round(out['total_seconds'] / 60)} minutes; results in `bench/results/drivers.json`", "",
        f"One prediction job through each of its three drivers, in the old tree (`{o}`, before the job's order "
        f"moved into `xclp/prediction_job.py`) and the new one (`{n}`), each job in a fresh process with "
        f"PYTHONPATH set to its tree, old and new alternating, {out['repeats']} repeats each. The data: "
        f"{cfg['dataset']}, {out['n']} points, {cfg['sites']} sites ({cfg['split']}, "
        f"{int(cfg['labelled'] * 100)} % labelled); {cfg['crypto']}, L = {cfg['bits']}, k = {cfg['k']}, "
        f"α = {cfg['alpha']}. Seconds from the job's start to the last site's labels (imports, data and set-up "
        f"outside the clock): *simulation* `run_xclp` in process; *service* the coordinator app "
        f"(`create_app`, SQLite, its engine thread) behind FastAPI's TestClient with 3 `Agent`s stepped in turn "
        f"in the same process, submit → last result file; *Flower* `FlowerXCLP(InProcessGrid(...), params).run()`. "
        f"Machine: {out['machine']['cpus']} cores, shared (load average {out['machine']['loadavg_start'][0]:.1f} "
        f"at start, {out['machine']['loadavg_end'][0]:.1f} at end).", "",
    ]
    lines += ratio_table(out, o, n)
    lines += ["", "Verdict: *slower* only where every new run was slower than every old run and the medians "
              "differ by more than 10 %; *faster* the same the other way; else *same within noise*. CPU seconds: "
              "`time.process_time()` of the job's process over the same interval (every thread: the service's engine "
              "and HTTP threads too), less sensitive than wall seconds to the other jobs on the machine; the "
              "service's wall time also includes its agents' idle sleeps (5 ms) and the engine's wake-ups.", "",
              "Per run (seconds, in the order run): " + "; ".join(
        f"{d} old {', '.join(f'{v:.2f}' for v in r['old']['runs'])}, new {', '.join(f'{v:.2f}' for v in r['new']['runs'])}"
        for d, r in out["drivers"].items()) + ".", ""]
    checks = out["labels"]
    lines.append("Labels: " + "; ".join(f"{k}: {'yes' if v else '**NO**'}" for k, v in checks.items()) + ".")
    for d in out["drivers"]:
        ph = out["drivers"][d]
        if not ph.get("phases_old") and not ph.get("phases_new"):
            continue
        names = list(dict.fromkeys([*ph["phases_old"], *ph["phases_new"]]))
        lines += ["", f"{d}: seconds by phase (medians; each tree's own phase names)", "",
                  "| phase | old | new |", "|---|---:|---:|"]
        for k in names:
            a, b = ph["phases_old"].get(k), ph["phases_new"].get(k)
            lines.append(f"| {k} | {'—' if a is None else f'{a:.3f}'} | {'—' if b is None else f'{b:.3f}'} |")
        if ph.get("groups_old"):
            lines += ["", f"{d}, the same work grouped (medians, seconds):", "", "| | old | new | new − old |",
                      "|---|---:|---:|---:|"]
            for g in ph["groups_old"]:
                a, b = ph["groups_old"][g], ph["groups_new"][g]
                lines.append(f"| {g} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
        if ph.get("rounds_old") and ph["rounds_old"][next(iter(ph["rounds_old"]))]["rounds"]:
            lines += ["", f"{d}, CPU seconds by message round (the ServerApp's handling and every ClientApp call of "
                      "the round, all in this process; medians):", "",
                      "| | old: rounds, CPU s | new: rounds, CPU s | new − old |", "|---|---:|---:|---:|"]
            for g in ph["rounds_old"]:
                a, b = ph["rounds_old"][g], ph["rounds_new"][g]
                lines.append(f"| {g} | {a['rounds']}, {a['cpu']:.3f} | {b['rounds']}, {b['cpu']:.3f} | "
                             f"{b['cpu'] - a['cpu']:+.3f} |")
        extra = ph.get("extra")
        if extra:
            lines += ["", extra]
    if out.get("reading"):
        lines += ["", out["reading"]]
    return "\n".join(lines) + "\n"


def write_section(md_path: Path, section: str, heading: str = HEADING) -> None:
    text = md_path.read_text() if md_path.exists() else "# Benchmarks\n"
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    md_path.write_text(text)


def parser(doc: str, *, old: str, results: str, drivers) -> argparse.ArgumentParser:
    """The flags of a before/after drivers benchmark (this one and bench/train_drivers.py), the parent's
    and the child's (a timed job re-runs the script with --child)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=REPO, help="the new code tree (default: this repository)")
    ap.add_argument("--old", default=old, help="the old tree: a folder, or a revision (git archive)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drivers", default=",".join(drivers))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one job's process may take")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / results)
    ap.add_argument("--md", default=str(REPO / "docs" / "benchmarks.md"),
                    help="the page whose section this run writes ('' for none)")
    ap.add_argument("--child", choices=drivers, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    ap = parser(__doc__, old="ccc91e6", results="drivers.json", drivers=DRIVERS)
    ap.add_argument("--n", type=int, default=CFG["n"], help=f"points (default {CFG['n']})")
    ap.add_argument("--dataset", default=CFG["dataset"], help=f"xclp.data.load_arrays' name (default {CFG['dataset']})")
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    import numpy as np

    drivers = [d.strip() for d in args.drivers.split(",") if d.strip()]
    CFG.update(n=args.n, dataset=args.dataset)
    new = args.tree.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="xclp-bench-drivers-"))
    t_all = time.perf_counter()
    try:
        old, old_rev = old_tree(args.old, new, tmp)
        trees = {"old": old, "new": new}
        out = {"argv": "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:])),
               "config": CFG, "repeats": args.repeats,
               "trees": {"old": {"path": str(old), "rev": old_rev, "spec": args.old},
                         "new": {"path": str(new), "rev": git_rev(new)}},
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version(), "loadavg_start": list(os.getloadavg())},
               "runs": []}
        log(f"old {old_rev} ({old}), new {out['trees']['new']['rev']} ({new}); {args.repeats} repeats; {drivers}")
        for r in range(args.repeats):
            for i, d in enumerate(drivers):
                order = ("old", "new") if (r + i) % 2 == 0 else ("new", "old")
                for which in order:
                    res = run_child(trees[which], d, tmp, f"{d}-{which}-{r}", check=(r == 0), timeout=args.timeout)
                    res.update({"tree": which, "repeat": r})
                    out["runs"].append(res)
                    log(f"repeat {r + 1} {d:10s} {which}: {res['seconds']:.2f} s "
                        f"(process {res['process_wall_seconds']:.1f} s)")
        runs = out["runs"]
        out["n"] = runs[0]["n"]
        out["data_identical"] = len({x["data_sha256_16"] for x in runs}) == 1
        out["drivers"] = {}
        for d in drivers:
            by = {w: [x for x in runs if x["driver"] == d and x["tree"] == w] for w in ("old", "new")}
            so, sn = stats([x["seconds"] for x in by["old"]]), stats([x["seconds"] for x in by["new"]])
            co, cn = stats([x["cpu_seconds"] for x in by["old"]]), stats([x["cpu_seconds"] for x in by["new"]])
            entry = {"old": so, "new": sn, "ratio_new_over_old": round(sn["median"] / so["median"], 3),
                     "cpu_old": co, "cpu_new": cn, "cpu_ratio_new_over_old": round(cn["median"] / co["median"], 3),
                     "verdict": verdict(so, sn), "phases_old": phase_medians(by["old"]),
                     "phases_new": phase_medians(by["new"]),
                     "process_wall_seconds": {w: stats([x["process_wall_seconds"] for x in by[w]]) for w in by}}
            if d == "flower":
                entry["groups_old"] = grouped(entry["phases_old"], FLOWER_GROUPS)
                entry["groups_new"] = grouped(entry["phases_new"], FLOWER_GROUPS)
                entry["rounds_old"], entry["rounds_new"] = round_groups(by["old"]), round_groups(by["new"])
                entry["messages_to_nodes"] = {w: by[w][0]["messages_to_nodes"] for w in by}
                entry["payloads_seen"] = {w: by[w][0]["payloads_seen"] for w in by}
                entry["bytes"] = {w: by[w][0]["bytes"] for w in by}
                entry["extra"] = (f"Flower messages the ServerApp sent to the nodes: old {entry['messages_to_nodes']['old']}, "
                                  f"new {entry['messages_to_nodes']['new']}; payload bytes both ways: old "
                                  f"{entry['bytes']['old']:,}, new {entry['bytes']['new']:,}.")
            if d == "service":
                entry["agent_steps"] = {w: stats([x["agent_steps"] for x in by[w]]) for w in by}
            out["drivers"][d] = entry
        labels = {"the same data in every run": out["data_identical"]}
        if "simulation" in drivers:
            sims = [x for x in runs if x["driver"] == "simulation"]
            ref = np.load(sims[0]["labels"])
            labels["simulation: old and new give identical labels and confidences (every run)"] = all(
                np.array_equal(np.load(x["labels"])["labels"], ref["labels"])
                and np.array_equal(np.load(x["labels"])["confidence"], ref["confidence"]) for x in sims)
        for x in runs:
            if "labels_equal_simulation" in x:
                labels[f"{x['driver']} ({x['tree']}) = its tree's simulation with the sites' seed contributions"] = \
                    bool(x["labels_equal_simulation"])
        out["labels"] = labels
        for x in runs:
            x.pop("labels", None)
        out["reading"] = reading(out)
        out["machine"]["loadavg_end"] = list(os.getloadavg())
        out["total_seconds"] = round(time.perf_counter() - t_all, 1)
        section = markdown(out)
        print(section)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        if args.md:
            write_section(Path(args.md), section)
        return 0 if all(labels.values()) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
