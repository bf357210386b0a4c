"""A Flower lattice prediction job with sites that restore their saved session at each message, against
the same job with sites that replayed their earlier steps (issue 24).

    .venv/bin/python -m bench.flower_restore          # about 4 minutes; JSON on stdout and in
                                                      # bench/results/flower_restore.json; --quick: small

Until commit ccc91e6 a Flower site kept its secrets and every message it had taken in Context.state and
replayed them at each call, its draws repeated from a keystream (xclp_flower/replay.py); now it saves
its session to bytes and restores it (SiteSession.to_bytes / from_bytes). Both are timed here on the
same job, in the same way: the old code is taken from git (`git archive ccc91e6`) into a temporary
folder and each variant runs in its own process with its tree first on the path. The job runs through
xclp_flower/grid.py's InProcessGrid (every ClientApp call a fresh FlowerSite, every Context through
Flower's protobuf serialisation in between, no SuperLink): that is the site's own cost per message,
without the deployment's per-round latency (6–9 s a round, bench.flower), which neither variant
changes. Both variants run the lattice protocol with one thread (the replay needed one: its draws had
to come in a fixed order), on the same sites' data. Each variant: `--repeats` timed runs (the least
reported: the machine is shared), then one run with every ClientApp call timed by step and the
largest node state measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "flower_restore.json"
OLD = "ccc91e6"  # the last commit whose Flower sites replayed
CASES = {"quick": [("digits", 300, 128)],
         "full": [("digits", 300, 128), ("digits", 1500, 256), ("fashion-mnist", 3000, 1024)]}


def worker(args) -> dict:
    """One variant, in this process (its tree first on sys.path): the job's times and state size."""
    here = Path(__file__).resolve().parent  # bench/ holds a crypto.py: never let it shadow the package
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    import numpy as np
    from flwr.common.serde import context_to_proto

    import crypto.lattice_hamming as lh
    from xclp.data import load_arrays
    from xclp.job_params import JobParams
    from xclp.splits import simulate_sites
    from xclp_flower.client_app import app as client_app
    from xclp_flower.grid import InProcessGrid
    from xclp_flower.server_app import FlowerXCLP

    init = lh.LatticeHamming.__init__

    def one_thread(self, **kw):  # the replaying code made its own with threads=1; the restoring one too
        kw["threads"] = 1
        init(self, **kw)

    lh.LatticeHamming.__init__ = one_thread
    X, y = load_arrays(args.dataset, limit=args.points, seed=1)
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=1)
    tmp = Path(tempfile.mkdtemp(prefix="flower-restore-"))
    configs = []
    for s in ds.sites:
        m = ds.site == s
        np.savez(tmp / f"{s}.npz", X=ds.X[m], y=ds.y[m])
        configs.append({"site": s, "data-path": str(tmp / f"{s}.npz"), "out": str(tmp / f"out-{s}")})

    def job(i: int, grid) -> float:
        params = JobParams(job_id=f"bench-{i}", n_classes=10, bits=args.bits, k=10, crypto="lattice")
        t = time.perf_counter()
        out = FlowerXCLP(grid, params).run()
        assert out["sites"] == ds.sites
        return time.perf_counter() - t

    walls = [job(i, InProcessGrid(client_app, configs, run_id=i + 1)) for i in range(args.repeats)]
    by_step: dict[str, float] = {}
    state_bytes = [0]

    def timed(message, context):
        step = next(iter(message.content.config_records.values())).get("step", "?")
        t = time.perf_counter()
        reply = client_app(message, context)
        by_step[str(step)] = by_step.get(str(step), 0.0) + time.perf_counter() - t
        state_bytes[0] = max(state_bytes[0], context_to_proto(context).ByteSize())
        return reply

    job(args.repeats, InProcessGrid(timed, configs, run_id=99))
    return {"wall_s": walls, "best_s": min(walls), "client_s_by_step": {k: round(v, 3) for k, v in by_step.items()},
            "client_s": round(sum(by_step.values()), 3), "max_node_state_bytes": state_bytes[0]}


def run_variant(tree: Path, case: tuple, repeats: int) -> dict:
    dataset, points, bits = case
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--dataset", dataset, "--points", str(points),
           "--bits", str(bits), "--repeats", str(repeats)]
    r = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if r.returncode:
        raise RuntimeError(f"{tree}: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small case only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--old", default=OLD, help="the commit of the replaying code")
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dataset", default="digits", help=argparse.SUPPRESS)
    ap.add_argument("--points", type=int, default=300, help=argparse.SUPPRESS)
    ap.add_argument("--bits", type=int, default=128, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="xclp-replay-") as old:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        for case in CASES["quick" if args.quick else "full"]:
            replay = run_variant(Path(old), case, args.repeats)
            restore = run_variant(ROOT, case, args.repeats)
            rows.append({"dataset": case[0], "points": case[1], "sites": 3, "bits": case[2], "crypto": "lattice",
                         "replay": replay, "restore": restore,
                         "replay_over_restore": round(replay["best_s"] / restore["best_s"], 2),
                         "client_replay_over_restore": round(replay["client_s"] / restore["client_s"], 2)})
    out = {"old_commit": args.old, "cpus": os.cpu_count(), "repeats": args.repeats, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
