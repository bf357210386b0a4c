"""The masked protocol's kernel (crypto/sampled_dots.py) against the alternatives, on the candidate
patterns of a real masked blocked job (issue 35):

    .venv/bin/python -m bench.sampled_dots [--n 10000] [--runs 12] [--json bench/results/sampled_dots.json]

Runs the blocked job with crypto="masked" on n Fashion-MNIST images (bench.scale's data), keeps the
CSR patterns of its `runs` largest products, and times on each, with random values in [0, 2^11) (the
coordinator's and A's operands; B's are bits), CPU seconds per entry, one thread:

- per_row: a matrix-vector product per row over its gathered columns (the protocol's first kernel);
- grouped_gemm_g: rows in runs of g, one BLAS GEMM over the union of their columns, entries picked;
- sampled_addmm_f64 / _f32: torch.sparse.sampled_addmm (what the kernel runs; f32 with bit operands).

Every result is checked against the kernel's (exact integers). CPU time, not wall, so that a loaded
machine distorts it less; the numbers still move with the load (`load` is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

L = 1024


def capture(n: int, runs: int) -> list[tuple[np.ndarray, np.ndarray, int, int]]:
    """The `runs` largest (ptr, cols, m, n_cols) patterns the job's products ran on."""
    import crypto.masked_hamming as mh
    from bench.scale import dataset, params
    from xclp.simulation import run_xclp

    seen: list = []
    kernel = mh.sampled_dots

    def keep(left, right, ptr, cols):
        seen.append((np.array(ptr), np.array(cols), left.shape[0], right.shape[0]))
        return kernel(left, right, ptr, cols)

    mh.sampled_dots = keep
    try:
        run_xclp(dataset(n, 0), params("blocked", "masked"), seed=0)
    finally:
        mh.sampled_dots = kernel
    seen.sort(key=lambda p: -p[1].size)
    return seen[: 3 * runs : 3]  # each run's products come in threes (A, B, the coordinator): one of each


def per_row(left, right, ptr, cols):
    out = np.empty(cols.size)
    for i in np.flatnonzero(np.diff(ptr)).tolist():
        a, b = int(ptr[i]), int(ptr[i + 1])
        out[a:b] = right[cols[a:b]].astype(np.float64) @ left[i].astype(np.float64)
    return out.astype(np.int64)


def grouped_gemm(left, right, ptr, cols, g):
    rows = np.repeat(np.arange(left.shape[0]), np.diff(ptr))
    lf, out = left.astype(np.float64), np.empty(cols.size)
    for s in range(0, left.shape[0], g):
        a, b = int(ptr[s]), int(ptr[min(left.shape[0], s + g)])
        if a == b:
            continue
        u, inv = np.unique(cols[a:b], return_inverse=True)
        out[a:b] = (lf[s : s + g] @ right[u].astype(np.float64).T)[rows[a:b] - s, inv]
    return out.astype(np.int64)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--json", default="bench/results/sampled_dots.json")
    a = ap.parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    from crypto.sampled_dots import sampled_dots

    patterns = capture(a.n, a.runs)
    torch.set_num_threads(1)
    threadpool_limits(1)  # BLAS on one thread too (the GEMM route): every way on one core
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    totals: dict[str, float] = {}
    entries = 0
    for ptr, cols, m, nb in patterns:
        left = rng.integers(0, 2048, (m, L)).astype(np.uint16)
        right = rng.integers(0, 2048, (nb, L)).astype(np.uint16)
        bits = rng.integers(0, 2, (nb, L)).astype(np.uint8)
        ways = {"per_row": (per_row, right), "grouped_gemm_8": (lambda *x: grouped_gemm(*x, 8), right),
                "grouped_gemm_32": (lambda *x: grouped_gemm(*x, 32), right),
                "sampled_addmm_f64": (sampled_dots, right), "sampled_addmm_f32": (sampled_dots, bits)}
        for name, (f, other) in ways.items():
            t = time.process_time()
            got = f(left, other, ptr, cols)
            totals[name] = totals.get(name, 0.0) + time.process_time() - t
            assert np.array_equal(got, per_row(left, other, ptr, cols)), name  # exact: every way the same
        entries += cols.size
    result = {"command": "python -m bench.sampled_dots " + " ".join(argv if argv is not None else sys.argv[1:]),
              "n": a.n, "patterns": len(patterns), "entries": int(entries),
              "shapes": [[int(m), int(nb), int(c.size)] for _, c, m, nb in patterns],
              "us_per_entry_cpu": {k: v / entries * 1e6 for k, v in totals.items()},
              "load": {"before": load_before, "after": os.getloadavg(), "cpus": os.cpu_count()}}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["us_per_entry_cpu"], indent=1))


if __name__ == "__main__":
    main()
