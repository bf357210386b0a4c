"""A site's results for one job, written beside each other in its output folder:
`<job>.npz` (labels, confidence, and ids where the data file has an ID column; aligned with the
rows of the data file) and `<job>.csv` (id,label,confidence: one row per point, for a spreadsheet
or a database import). Without an ID column, the id is the row's position in the data file (0 = its
first point). Each file is written whole or not at all (a temporary file, then a rename), the .npz
last: once it is there, so are the CSV and the files beside it (`files`: a training job's model and
its scaling). Every one of them readable by the site's owner only, whatever the umask, for every driver
(the agent, Flower's ClientApp): the labels name the site's patients by their IDs and say what the job
found of them; a learner is fitted on the site's own rows; even the run's global model and pooled
scaling are the consortium's, not the machine's other users' — the owner shares what it chooses.
A training job's final labels are written the same way (clients.trainer, xclp_flower.training_site);
its rounds' XCLP child jobs write only the .npz, into the agent's private state folder, unless the
agent keeps them (`--keep-rounds`)."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import numpy as np

from crypto.private_file import write_private


def write_results(path: str | os.PathLike, labels: np.ndarray, confidence: np.ndarray,
                  ids: np.ndarray | None = None, table: bool = True, files: dict[str, bytes | None] | None = None,
                  **extra: np.ndarray) -> tuple[Path, Path | None]:
    """`path` (.npz; `extra` arrays go in too) and, with `table`, the same name with .csv; `files`:
    {suffix: body} written beside them under the same name (None: no file); returns the .npz's and
    the CSV's paths (None for a CSV not written). Mode 0600 for each (the module says why)."""
    path = Path(path)
    labels, confidence = np.asarray(labels), np.asarray(confidence)
    if ids is not None and len(ids) != labels.size:
        raise ValueError(f"{len(ids)} IDs for {labels.size} labels")
    arrays = {"labels": labels, "confidence": confidence, **extra}
    if ids is not None:
        arrays["ids"] = np.asarray(ids, dtype=str)
    for suffix, body in (files or {}).items():
        if body is not None:
            write_private(path.with_name(path.stem + suffix), body)
    table = path.with_suffix(".csv") if table else None
    if table is not None:
        text = io.StringIO(newline="")
        w = csv.writer(text)
        w.writerow(["id", "label", "confidence"])
        names = ids if ids is not None else range(labels.size)
        w.writerows((str(i), int(lab), repr(float(c))) for i, lab, c in zip(names, labels, confidence))
        write_private(table, text.getvalue().encode("utf-8"))
    body = io.BytesIO()
    np.savez(body, **arrays)
    write_private(path, body.getvalue())  # last: the .npz there means all of them are
    return path, table
