"""The plaintext blocked job through the product's own command at 10⁵ → 10⁶ points (issue 35, point 4):
`xclp simulate predict` on a data file, every message of the job included, its wall time and peak memory.

    # the file (50 sites × N points, 64 features, 20 classes, 1 % labelled: the issue's file)
    .venv/bin/python -m bench.million --write /tmp/million_1e6.npz --per-site 20000
    # the job, in a fresh process under /usr/bin/time -v; its row appended to the JSON
    nice -n 5 .venv/bin/python -m bench.million --run /tmp/million_1e6.npz --tag after \\
        --json bench/results/million.json [--reference /tmp/before.npz] [--predictions /tmp/after.npz]

The command run is the issue's, with the file's sites and labels:

    xclp simulate predict --data FILE --graph blocked --crypto plaintext --bits 1024 --no-baselines
        --json … --predictions …

(--no-baselines: per-site and centralized LP are the command's comparison, not the job; at 10⁶ the
centralized one alone is a 10⁶-point graph in one process.) Recorded per run: the wall time of the
whole command (loading the file included), the kernel's "Maximum resident set size" of the process
(/usr/bin/time -v), the command's own `peak_memory_bytes` and phase seconds (its --json), the bytes
of every message, and, with --reference (an earlier run's --predictions), whether the labels are
identical (np.array_equal).

Data: `bench.synthetic.clustered` with dim = 64 and classes = 20 (the issue's file): 50 sites, each
its class mix from Dir(0.5) and its points from its own seed, 1 % of each site's points labelled, the
true labels kept as y_true (accuracy only).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SITES, DIM, CLASSES = 50, 64, 20


def write(path: Path, per_site: int, sites: int = SITES, seed: int = 0) -> None:
    from bench.synthetic import clustered

    ds = clustered(sites=sites, per_site=per_site, labelled=0.01, seed=seed, dim=DIM, classes=CLASSES)
    np.savez(path, X=ds.X, y=ds.y, site=ds.site, y_true=ds.y_true)
    print(f"{path}: {ds.n:,} points, {sites} sites, {DIM} features, {CLASSES} classes, "
          f"{int((ds.y >= 0).sum()):,} labelled", file=sys.stderr)


def command(data: Path, js: Path, pred: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "xclp"), "simulate", "predict", "--data", str(data),
            "--graph", "blocked", "--crypto", "plaintext", "--bits", "1024", "--no-baselines",
            "--json", str(js), "--predictions", str(pred)]


def max_rss(time_v: str) -> int:
    """The kernel's peak resident set of the process, in bytes, from /usr/bin/time -v's report (KiB)."""
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_v)
    if m is None:
        raise RuntimeError(f"no 'Maximum resident set size' in /usr/bin/time's report:\n{time_v[-2000:]}")
    return int(m.group(1)) * 1024


def run(data: Path, tag: str, reference: Path | None, predictions: Path | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        js, pred = Path(tmp) / "out.json", predictions or Path(tmp) / "pred.npz"
        t0 = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-v", *command(data, js, pred)], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"the command failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        out = json.loads(js.read_text())
        labels = np.load(pred)["labels"]
    row = {"tag": tag, "data": str(data), "n": out["n"], "sites": out["sites"], "classes": out["classes"],
           "wall_s": round(wall, 2), "max_rss_bytes": max_rss(proc.stderr),
           "peak_memory_bytes": out["peak_memory_bytes"], "timings": out["timings"],
           "bytes_total": out["bytes"]["total"], "accuracy": out["accuracy"]["xclp"]}
    if reference is not None:
        row["reference"] = str(reference)
        row["labels_equal"] = bool(np.array_equal(np.load(reference)["labels"], labels))
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", type=Path, help="write the synthetic data file (.npz) here")
    what.add_argument("--run", type=Path, help="run the job on this data file")
    ap.add_argument("--per-site", type=int, default=20_000, help="--write: points per site (default 20000)")
    ap.add_argument("--tag", default="", help="--run: a name for the row (e.g. before, after)")
    ap.add_argument("--reference", type=Path, help="--run: an earlier run's predictions (.npz): labels must match")
    ap.add_argument("--predictions", type=Path, help="--run: keep this run's predictions here (.npz)")
    ap.add_argument("--json", type=Path, help="--run: append the row to this JSON list")
    a = ap.parse_args(argv)
    if a.write:
        write(a.write, a.per_site)
        return
    if not a.run.exists():
        ap.error(f"{a.run}: no such file (make it with --write)")
    row = run(a.run, a.tag, a.reference, a.predictions)
    print(json.dumps(row, indent=1))
    if a.json:
        rows = json.loads(a.json.read_text()) if a.json.exists() else []
        a.json.write_text(json.dumps(rows + [row], indent=1) + "\n")


if __name__ == "__main__":
    main()
