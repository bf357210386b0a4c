"""A site's results for one prediction job, written beside each other in its output folder:
`<job>.npz` (labels, confidence, and ids where the data file has an ID column; aligned with the
rows of the data file) and `<job>.csv` (id,label,confidence: one row per point, for a spreadsheet
or a database import). Without an ID column, the id is the row's position in the data file (0 = its
first point). Each file is written whole or not at all (a temporary file, then a rename), the .npz
last: once it is there, so is the CSV. A training job's final labels are written the same way
(clients.trainer); its rounds' XCLP child jobs write only the .npz, into the agent's private state
folder, unless the agent keeps them (`--keep-rounds`)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np


def write_results(path: str | os.PathLike, labels: np.ndarray, confidence: np.ndarray,
                  ids: np.ndarray | None = None, table: bool = True, **extra: np.ndarray) -> tuple[Path, Path | None]:
    """`path` (.npz; `extra` arrays go in too) and, with `table`, the same name with .csv; returns both
    paths (None for a CSV not written)."""
    path = Path(path)
    labels, confidence = np.asarray(labels), np.asarray(confidence)
    if ids is not None and len(ids) != labels.size:
        raise ValueError(f"{len(ids)} IDs for {labels.size} labels")
    arrays = {"labels": labels, "confidence": confidence, **extra}
    if ids is not None:
        arrays["ids"] = np.asarray(ids, dtype=str)
    table = path.with_suffix(".csv") if table else None
    if table is not None:
        tmp = table.with_name(table.stem + ".partial.csv")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["id", "label", "confidence"])
            names = ids if ids is not None else range(labels.size)
            w.writerows((str(i), int(lab), repr(float(c))) for i, lab, c in zip(names, labels, confidence))
        os.replace(tmp, table)
    tmp = path.with_name(path.stem + ".partial.npz")  # last: the .npz there means both are
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return path, table
