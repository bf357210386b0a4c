"""What a site keeps at home, apart from the agent's loop: its data file, read and checked
(`load_site`, used by the agent and by Flower's ClientApp), what it must remember about each
job across restarts (`JobState`: small, JSON, mode 0600), and the job's machine state as the
coordinator shows it (`machine_view`)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from crypto.private_file import write_private
from xclp.data import DataError, validate_features, validate_labels
from xclp.datafile import Columns, load_data_file
from xclp.job_kinds import job_kind


class SiteData(NamedTuple):
    X: np.ndarray
    y: np.ndarray
    y_true: np.ndarray | None  # for scoring training jobs only
    ids: np.ndarray | None  # the ID column's values (strings), where one was named: carried into the results
    columns: tuple[str, ...] | None = None  # the feature columns' names (a table's header; a .npz has none)


def load_site(path: str | os.PathLike, columns: Columns | None = None) -> SiteData:
    """The site's .npz, .csv or .parquet, checked: y_true where the file has it, the IDs where
    `columns.id` names a column; a site column, if any, is not needed here."""
    columns = columns or Columns()
    a = load_data_file(path, columns, require_site=False)
    X = validate_features(a["X"])
    y_true = a.get("y_true")
    if y_true is not None:
        if np.shape(y_true) != (X.shape[0],):
            raise DataError(f"{path}: y_true must have one entry per row of X")
        y_true = np.asarray(y_true, dtype=np.int64)
    names = tuple(str(c) for c in a["columns"]) if "columns" in a else None
    return SiteData(X, validate_labels(a["y"], X.shape[0]), y_true, a["id"] if columns.id else None, names)


def load_site_data(path: str | os.PathLike, columns: Columns | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(X, y, y_true or None): `load_site` without the IDs."""
    return load_site(path, columns)[:3]


class JobState:
    """What the agent must remember about one job across restarts (small, JSON, private)."""

    def __init__(self, path: Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}

    def save(self) -> None:
        write_private(self.path, json.dumps(self.data))

    def __getitem__(self, k):
        return self.data.get(k)

    def get(self, k, default=None):
        return self.data.get(k, default)

    def __setitem__(self, k, v):
        self.data[k] = v
        self.save()


def machine_view(status: dict):
    """The job's machine state as the coordinator shows this site, from the job's status: the machine's own
    bytes (the one wire form of a state, which Flower's ServerApp ships too), read by the job kind's loader
    — never rebuilt from the status's fields, which are for people."""
    return job_kind(status["kind"]).load(base64.b64decode(status["machine"]))
