"""A site's data file, in the format the site already keeps: .npz, .csv or .parquet.

Every format comes out as the same arrays — X (n × d floats), y (n ints, −1 = unlabelled), and
where the file has them site (n names) and y_true (n ints, for scoring only) — and then goes
through the same checks (xclp.data: validate_features, validate_labels, make_dataset), so a bad
file gets the same clear error whatever its format.

- .npz: arrays named X, y, site, y_true (no pickle); an ID column names an array of the file (n entries).
- .csv: a header row; the label column (named by `Columns.label`, default "label") holds integer
  class labels, with an empty cell or −1 for an unlabelled point; an optional site column and an
  optional y_true column; optionally an ID column (`Columns.id`: not a feature, its values come back
  as "id" and go into the site's results) and columns to ignore (`Columns.ignore`: dropped); every
  other column is a feature and must be numeric. Read with the standard library's csv module, row by
  row (the core install needs nothing more).
- .parquet: the same columns; a null label is an unlabelled point. Read with pyarrow, the optional
  extra `pip install -e '.[parquet]'` (the error says so when it is missing).

With the consortium's schema (`Columns.schema`, xclp/schema.py), a .csv or .parquet is read through
it instead: text categories one-hot, missing cells filled, class names mapped to the schema's indices
— the one path every driver (agent, Flower node, simulations) takes.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xclp.data import UNLABELLED, DataError, Dataset, load_npz, make_dataset, separator_hint

FORMATS = (".npz", ".csv", ".parquet")
MAX_LABEL = 1 << 16  # more classes than the service takes: a label beyond it is a wrong column
CSV_BLOCK = 256  # rows parsed at a time: ~13 MB of strings at 784 columns, whatever the file's size


@dataclass(frozen=True)
class Columns:
    """Which columns of a table are not features. .npz files use their fixed array names instead."""

    label: str = "label"
    site: str = "site"
    truth: str = "y_true"
    id: str | None = None  # carried into the results, never a feature
    ignore: tuple[str, ...] = ()  # dropped
    # the consortium's schema (xclp.schema): the table is read and encoded through it; its label and ID
    # columns are the ones above (xclp.schema.with_schema)
    schema: object | None = field(default=None, compare=False)

    def __post_init__(self):
        names = [self.label, self.site, self.truth]
        if any(not isinstance(c, str) or not c.strip() for c in names) or len(set(names)) != 3:
            raise DataError(f"the label, site and truth columns need three different names, got {names}")
        if self.id is not None and (not self.id.strip() or self.id in names):
            raise DataError(f"the ID column {self.id!r} must be named and differ from the label, site and truth "
                            f"columns {names}")
        clash = [c for c in self.ignore if c in (self.label, self.id)]
        if clash:
            raise DataError(f"cannot ignore the label or ID column {clash[0]!r}")

    @property
    def not_features(self) -> set[str]:
        return {self.label, self.site, self.truth, *self.ignore} | ({self.id} if self.id else set())

    def named(self) -> list[str]:
        """The columns the user named besides the usual label/site/truth: each must exist."""
        return ([self.id] if self.id else []) + list(self.ignore)


def parse_column_list(text: str | None) -> tuple[str, ...]:
    """"a, b,c" (the --ignore-columns flag, a node config's ignore-columns=): the names, without spaces."""
    return tuple(c.strip() for c in (text or "").split(",") if c.strip())


def load_data_file(path: str | os.PathLike, columns: Columns | None = None,
                   require_site: bool = True) -> dict[str, np.ndarray]:
    """The arrays X, y and, where present, site and y_true, from a .npz, .csv or .parquet file."""
    path = Path(path)
    columns = columns or Columns()
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{path}: unknown data format {suffix or '(no suffix)'!r}; use one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if columns.schema is not None:  # text categories, class names, missing cells: the schema's encoding
        from xclp.schema import load_table

        return load_table(path, columns.schema, columns, require_site)
    if suffix == ".npz":
        return _npz(path, columns, require_site)
    X, other, lines, features = (_read_csv if suffix == ".csv" else _read_parquet)(path, columns, require_site)
    out = _arrays(path, X, other, columns, lines)
    out["columns"] = np.array(features, dtype=str)  # the feature columns' names: the job's data contract
    return out


def dataset_from_file(path: str | os.PathLike, columns: Columns | None = None) -> Dataset:
    """A pooled data set (every site's rows, with a site column) for simulations."""
    a = load_data_file(path, columns, require_site=True)
    return make_dataset(a["X"], a["y"], a["site"], a.get("y_true"))


def _layout(path: Path, header: list[str], columns: Columns, require_site: bool) -> list[str]:
    """The feature columns of a table (every column but label, site and truth), after the header's checks."""
    if len(set(header)) != len(header):
        raise DataError(f"{path}: repeated column names in the header {header}")
    if columns.label not in header:
        raise DataError(f"{path}: no label column {columns.label!r} (columns: {header}); name it with --label-column "
                        f"(a Flower node: label-column=){separator_hint(header)}")
    if require_site and columns.site not in header:
        raise DataError(f"{path}: no site column {columns.site!r} (columns: {header}); name it with --site-column")
    if columns.id and columns.id not in header:
        raise DataError(f"{path}: no ID column {columns.id!r} (columns: {header}); check --id-column (a Flower node: id-column=)")
    missing = [c for c in columns.ignore if c not in header]
    if missing:
        raise DataError(f"{path}: no column {missing[0]!r} to ignore (columns: {header}); check --ignore-columns (a Flower node: ignore-columns=)")
    features = [h for h in header if h not in columns.not_features]
    if not features:
        raise DataError(f"{path}: no feature columns (columns: {header})")
    return features


def _read_csv(path: Path, columns: Columns, require_site: bool) -> tuple[np.ndarray, dict[str, list], list[int], list[str]]:
    """(X, the label/site/truth columns' cells, row numbers, the feature columns' names). Streamed: the features become floats a
    block of rows at a time, so memory peaks at about twice the float matrix (its blocks, then the
    matrix) instead of every cell as a Python string (bench/datafile.py: a 20,000 × 784 file peaks at
    a fifth of what holding the strings took)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next((r for r in reader if any(c.strip() for c in r)), [])  # blank lines before it: none
            header = [h.strip() for h in header]
            if not header:
                raise DataError(f"{path}: empty file; expected a header row and one row per point")
            features = _layout(path, header, columns, require_site)
            at = [header.index(h) for h in features]
            other = {h: [] for h in header if h not in features and h not in columns.ignore}
            where = {h: header.index(h) for h in other}
            blocks, block, lines = [], [], []
            for r in reader:
                n = reader.line_num  # the file's own line (blank and quoted multi-line rows counted)
                if not any(c.strip() for c in r):
                    continue  # a blank line: no point
                if len(r) != len(header):
                    raise DataError(f"{path}: row {n} has {len(r)} cells, the header has {len(header)}")
                block.append([r[j] for j in at])
                for h, j in where.items():
                    other[h].append(r[j])
                lines.append(n)
                if len(block) == CSV_BLOCK:
                    blocks.append(_block(path, features, block, lines[-len(block):]))
                    block = []
            if block:
                blocks.append(_block(path, features, block, lines[-len(block):]))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: not a readable CSV file ({exc})") from None
    if not blocks:
        raise DataError(f"{path}: a header and no points")
    return np.vstack(blocks), other, lines, features


def _block(path: Path, features: list[str], rows: list[list[str]], lines: list[int]) -> np.ndarray:
    """Rows of feature cells as floats: numpy's parser for the block, and cell by cell only to name
    the cell that is wrong."""
    try:
        X = np.asarray(rows, dtype=np.float64)
        if np.isfinite(X).all():  # (nan, inf, -inf parse: they too are named cell by cell)
            return X
    except ValueError:
        pass
    return np.array([[_number(path, h, n, v) for h, v in zip(features, r)] for n, r in zip(lines, rows)])


def _read_parquet(path: Path, columns: Columns, require_site: bool) -> tuple[np.ndarray, dict[str, list], list[int], list[str]]:
    """As _read_csv. Numeric feature columns without nulls go to numpy whole; any other goes cell by
    cell, to name the cell that is wrong."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install -e '.[parquet]'") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own ArrowInvalid/OSError family
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    import pyarrow.types as pt

    header = [str(n) for n in table.column_names]
    features = _layout(path, header, columns, require_site)
    if table.num_rows == 0:
        raise DataError(f"{path}: a header and no points")
    lines = list(range(2, table.num_rows + 2))  # row k of the table is "line" k + 1, after a header line
    X = np.empty((table.num_rows, len(features)), dtype=np.float64)
    for j, name in enumerate(features):
        column = table.column(header.index(name))
        if (pt.is_integer(column.type) or pt.is_floating(column.type)) and column.null_count == 0:
            X[:, j] = column.to_numpy()
        else:
            X[:, j] = _numbers(path, name, lines, column.to_pylist())
    other = {h: table.column(header.index(h)).to_pylist() for h in header
             if h not in features and h not in columns.ignore}
    return X, other, lines, features


def _arrays(path: Path, X: np.ndarray, col: dict[str, list], columns: Columns, lines: list[int]) -> dict:
    n = X.shape[0]
    out = {"X": X, "y": np.array([_label(path, columns.label, line, v) for line, v in zip(lines, col[columns.label])],
                                 dtype=np.int64).reshape(n)}
    if columns.site in col:
        sites = ["" if v is None else str(v).strip() for v in col[columns.site]]
        if any(s == "" for s in sites):
            raise DataError(f"{path}: row {lines[sites.index('')]}: empty site name in column {columns.site!r}")
        out["site"] = np.array(sites, dtype=str).reshape(n)
    if columns.id:
        ids = ["" if v is None else str(v).strip() for v in col[columns.id]]
        if "" in ids:
            raise DataError(f"{path}: row {lines[ids.index('')]}: empty ID in column {columns.id!r}")
        out["id"] = np.array(ids, dtype=str).reshape(n)
    if columns.truth in col:
        out["y_true"] = np.array([_label(path, columns.truth, line, v) for line, v in zip(lines, col[columns.truth])],
                                 dtype=np.int64).reshape(n)
    return out


def _npz(path: Path, columns: Columns, require_site: bool) -> dict[str, np.ndarray]:
    """A .npz's arrays; an ID column is one of them (n entries), as "id"; an ignored one is not read anyway."""
    arrays = load_npz(path, require_site=require_site)
    missing = [c for c in columns.named() if c not in arrays]
    if missing:
        raise DataError(f"{path}: no array {missing[0]!r} (arrays: {sorted(arrays)}); check --id-column / "
                        "--ignore-columns")
    if columns.id:
        ids = np.asarray(arrays[columns.id])
        if ids.shape != (np.shape(arrays["X"])[0],):
            raise DataError(f"{path}: the ID array {columns.id!r} must have one entry per row of X")
        arrays["id"] = ids.astype(str)
    return arrays


def _numbers(path: Path, column: str, lines: list[int], values: list) -> np.ndarray:
    """A feature column as floats: numpy's own parser for the whole column, and cell by cell only to
    name the cell that is wrong (an empty cell or a null also lands there)."""
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        x = None
    if x is None or x.ndim != 1 or not np.isfinite(x).all():  # (2-D: a column of lists, refused cell by cell)
        x = np.array([_number(path, column, line, v) for line, v in zip(lines, values)], dtype=np.float64)
    return x


def _number(path: Path, column: str, line: int, value) -> float:
    """A feature cell as a float; an empty, non-numeric or non-finite (nan, inf) cell is an error naming
    where it is: the file, the row (the file's line) and the column."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{path}: row {line}, column {column!r}: empty feature value")
    if isinstance(value, bool):
        return float(value)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{path}: row {line}, column {column!r}: {value!r} is not a number"
                        f"{_id_hint(column)}") from None
    if not math.isfinite(x):
        raise DataError(f"{path}: row {line}, column {column!r}: {value!r} is not a value a feature may take: "
                        "give a finite number (a missing value: the consortium's schema fills it, --schema)")
    return x


# Column names that usually hold the rows' identifiers, not a feature
_ID_NAME = re.compile(r"(^|[^a-z])(id|ids|uuid|mrn|key)([^a-z]|$)|patient|record|subject|sample", re.I)


def _id_hint(column: str) -> str:
    """For text in a feature column: the ID column forgotten (its name says so), else the schema's categories."""
    if _ID_NAME.search(column):
        return f" (a column of the rows' IDs? give --id-column {column}; it is carried into the results)"
    return " (text categories: encode them through the consortium's schema, --schema)"


def _label(path: Path, column: str, line: int, value) -> int:
    """An integer class label; empty, null or −1 is unlabelled. '3.0' is 3; 'cat' or 2.5 is an error."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return UNLABELLED
    try:
        v = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise DataError(f"{path}: row {line}, column {column!r}: {value!r} is not an integer class label "
                        "(0..C−1; empty or −1 for unlabelled)") from None
    if not math.isfinite(v) or v != int(v) or abs(v) > MAX_LABEL:
        raise DataError(f"{path}: row {line}, column {column!r}: {value!r} is not an integer class label"
                        + (f" below {MAX_LABEL}" if math.isfinite(v) and v == int(v) else ""))
    return int(v)
