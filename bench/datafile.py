"""Reading a site's CSV: peak memory of the row-by-row reader (xclp/datafile.py) against holding every
cell as a string first (`list(csv.reader(f))`, then numpy parses the matrix: what the reader did
before), in the same run.

    .venv/bin/python -m bench.datafile [--rows 20000] [--cols 784] [--json bench/results/datafile.json]

A Fashion-MNIST-shaped file (--rows × --cols features with three decimals, a label column with 10 %
labelled, a site column). Peak memory is tracemalloc's (Python objects and numpy buffers alike);
the baseline's peak is a lower bound of the old reader's, which also built per-column lists. Both
readers' matrices are checked equal.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from xclp.datafile import load_data_file

RESULTS = Path(__file__).resolve().parent / "results" / "datafile.json"


def write_csv(path: Path, rows: int, cols: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"px{j}" for j in range(cols)] + ["label", "site"])
        for i in range(rows):
            x = np.round(rng.random(cols), 3)
            w.writerow([f"{v:.3f}" for v in x] + [str(rng.integers(10)) if rng.random() < 0.1 else "", f"s{i % 5}"])


def peak(fn):
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, top, seconds


def all_cells(path: Path, cols: int) -> np.ndarray:
    with open(path, newline="", encoding="utf-8-sig") as f:
        cells = list(csv.reader(f))
    return np.asarray([r[:cols] for r in cells[1:]], dtype=np.float64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--cols", type=int, default=784)
    ap.add_argument("--json", default=str(RESULTS))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "site.csv"
        write_csv(path, args.rows, args.cols)
        size = path.stat().st_size
        got, new_peak, new_s = peak(lambda: load_data_file(path))
        X_old, old_peak, old_s = peak(lambda: all_cells(path, args.cols))
    same = bool(np.array_equal(got["X"], X_old))
    out = {"rows": args.rows, "features": args.cols, "file_mb": round(size / 1e6, 1),
           "row_by_row": {"peak_mb": round(new_peak / 1e6, 1), "seconds": round(new_s, 2)},
           "all_cells_as_strings": {"peak_mb": round(old_peak / 1e6, 1), "seconds": round(old_s, 2)},
           "peak_ratio": round(old_peak / new_peak, 2), "matrix_mb": round(got["X"].nbytes / 1e6, 1), "same_X": same}
    print(json.dumps(out, indent=1))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
