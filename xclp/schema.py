"""The consortium's schema: one JSON file every site shares, saying how a table becomes the job's vectors.
(About 700 lines: the format's parser with one message per mistake, and the one-pass reader that finds every
problem of a file at once — the two halves of one mechanism, kept together.)

A real table has text categories, class names and empty cells; XCLP needs the same numeric columns,
in the same order, at every site. The schema states, once for all sites, everything that decides
those columns — so no site computes anything of its own that another site would compute otherwise:

    {
      "format": "xclp-schema/1",
      "label": {"column": "species", "classes": ["Adelie", "Chinstrap", "Gentoo"]},
      "id": "animal",
      "missing": ["", "NA"],
      "features": [
        {"name": "bill_length_mm", "kind": "numeric", "fill": 43.9},
        {"name": "island", "kind": "categorical",
         "categories": ["Biscoe", "Dream", "Torgersen", "other"], "unknown": "other"},
        {"name": "sex", "kind": "categorical", "categories": ["female", "male", "unknown"], "fill": "unknown"}
      ],
      "ignore": ["year"]
    }

- "format": optional, "xclp-schema/1".
- "label": the label column, and optionally its "classes": a list (class i is the i-th name) or an
  object {"name": index} with the indices 0..C−1, so that sites whose labels are text agree on the
  indices. Without "classes" the labels are integers 0..C−1 as in any data file. An empty (missing)
  label cell is an unlabelled point; a name the classes lack is an error.
- "id": optional, a column of point IDs (not a feature; each must be present and unique).
- "missing": the cell texts that mean "no value" (default [""]); a Parquet null is missing too.
- "features": the feature columns, in the order the vectors take them. "numeric": a number per cell;
  "categorical": one of "categories" per cell, one-hot encoded in the list's order. "fill": the value
  a missing cell takes — a number for a numeric column, one of the categories for a categorical one —
  stated in the schema, never a statistic of a site's data (a per-site median differs between sites:
  agree a value, e.g. a published reference value, or add an "unknown" category); without "fill" a
  missing cell is an error. "unknown" (categorical only): what a value outside the list does —
  "error" (the default), "ignore" (its one-hot columns are all 0: scikit-learn's handle_unknown),
  or the name of one of the categories, which takes it (an "other" bucket).
- "ignore": optional, columns dropped on reading (a site that lacks one is fine).
Keys starting with "_" are comments; any other unknown key is an error (a typo would else be ignored).

Every column of a site's table must be a feature, the label, the ID, an ignored column, or the
simulation's site / truth columns; any other is an error, so that a column nobody agreed never
becomes a feature silently.

The encoding is scikit-learn's: one ColumnTransformer (`Schema.transformer`) with, per feature, a
SimpleImputer(strategy="constant") with the schema's fill and, for a categorical column, a
OneHotEncoder(categories=[the schema's list]) — fitted on a one-row table made from the schema
itself, so it learns nothing from any site's data and every site's columns come out alike:
numeric columns under their names, a categorical column as NAME_CATEGORY, in the schema's order.

`prepare` reads a .csv or .parquet through the schema and finds EVERY problem of the file in one
pass (each with its file, line and column): `xclp data check` prints them all, and a driver's loader
(`xclp.datafile.load_data_file`, whenever `Columns.schema` is set) refuses the file with the first
few. `draft` writes a first schema from a site's own file(s), for the consortium to agree on.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import json
import math
import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from xclp.data import UNLABELLED, DataError, separator_hint

FORMAT = "xclp-schema/1"
NUMERIC, CATEGORICAL = "numeric", "categorical"
ERROR, IGNORE = "error", "ignore"
BLOCK = 256  # rows encoded at a time
MAX_LABEL = 1 << 16
SHOWN_IN_ERRORS = 5  # problems a loader's error names (`xclp data check` lists them all)
_TOP_KEYS = {"format", "label", "id", "missing", "features", "ignore"}
_FEATURE_KEYS = {"name", "kind", "categories", "fill", "unknown"}
_DECIMAL_COMMA = re.compile(r"^[+-]?\d+,\d+$")


class SchemaError(DataError):
    """The schema file itself is wrong."""


@dataclass(frozen=True)
class Feature:
    name: str
    kind: str  # NUMERIC or CATEGORICAL
    categories: tuple[str, ...] = ()
    fill: float | str | None = None  # a missing cell's value; None: a missing cell is an error
    unknown: str = ERROR  # categorical: ERROR, IGNORE, or a category that takes unknown values

    def outputs(self) -> list[str]:
        return [self.name] if self.kind == NUMERIC else [f"{self.name}_{c}" for c in self.categories]


@dataclass(frozen=True)
class Schema:
    features: tuple[Feature, ...]
    label: str
    classes: tuple[str, ...] | None = None  # class i's name; None: integer labels
    id: str | None = None
    ignore: tuple[str, ...] = ()
    missing: tuple[str, ...] = ("",)
    source: str = field(default="", compare=False)

    # ---- reading and writing the file

    @classmethod
    def load(cls, path: str | os.PathLike) -> Schema:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise SchemaError(f"{path}: cannot read the schema ({exc.strerror or exc})") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        return cls.from_dict(d, str(path))

    @classmethod
    def from_dict(cls, d, source: str = "schema") -> Schema:
        def bad(where: str, what: str):
            return SchemaError(f"{source}: {where}: {what} (the format: xclp/schema.py, docs/operating.md)")

        if not isinstance(d, dict):
            raise bad("the top level", "must be a JSON object")
        _no_stray_keys(d, _TOP_KEYS, "the top level", bad)
        if d.get("format", FORMAT) != FORMAT:
            raise bad('"format"', f"{d['format']!r} is not {FORMAT!r}")
        lab = d.get("label")
        if isinstance(lab, str):
            lab = {"column": lab}
        if not isinstance(lab, dict) or not _name(lab.get("column")):
            raise bad('"label"', 'give {"column": NAME} (and optionally "classes")')
        _no_stray_keys(lab, {"column", "classes"}, '"label"', bad)
        classes = _classes(lab.get("classes"), lambda what: bad('"label"."classes"', what))
        ident = d.get("id")
        if ident is not None and not _name(ident):
            raise bad('"id"', "must be a column name")
        missing = d.get("missing", [""])
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            raise bad('"missing"', 'must be a list of cell texts, e.g. ["", "NA"]')
        missing = tuple(dict.fromkeys(m.strip() for m in missing))
        ignore = d.get("ignore", [])
        if not isinstance(ignore, list) or not all(_name(c) for c in ignore):
            raise bad('"ignore"', "must be a list of column names")
        feats = d.get("features")
        if not isinstance(feats, list) or not feats:
            raise bad('"features"', "must be a non-empty list of columns")
        features = tuple(_feature(f, missing, lambda what, i=i, f=f: bad(
            f'"features"[{i}]' + (f" ({f.get('name')!r})" if isinstance(f, dict) and f.get("name") else ""), what))
            for i, f in enumerate(feats))
        names = [f.name for f in features] + [lab["column"]] + ([ident] if ident else []) + list(ignore)
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise bad("the columns", f"{repeated[0]!r} is named twice (features, label, id and ignore are distinct)")
        schema = cls(features, lab["column"], classes, ident, tuple(ignore), missing, source)
        outs = schema.output_columns()
        if len(set(outs)) != len(outs):
            twice = sorted({c for c in outs if outs.count(c) > 1})
            raise bad('"features"', f"two features would make the column {twice[0]!r}: rename one")
        return schema

    def to_dict(self) -> dict:
        feats = []
        for f in self.features:
            e: dict = {"name": f.name, "kind": f.kind}
            if f.kind == CATEGORICAL:
                e["categories"] = list(f.categories)
            if f.fill is not None:
                e["fill"] = f.fill
            if f.kind == CATEGORICAL and f.unknown != ERROR:
                e["unknown"] = f.unknown
            feats.append(e)
        label: dict = {"column": self.label}
        if self.classes is not None:
            label["classes"] = list(self.classes)
        out: dict = {"format": FORMAT, "label": label}
        if self.id:
            out["id"] = self.id
        out["missing"] = list(self.missing)
        out["features"] = feats
        if self.ignore:
            out["ignore"] = list(self.ignore)
        return out

    def digest(self) -> str:
        """SHA-256 of the schema's content (not its comments or layout): sites compare it to know they
        read their files alike."""
        return "sha256:" + hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    # ---- what it makes

    @property
    def n_classes(self) -> int | None:
        return None if self.classes is None else len(self.classes)

    def output_columns(self) -> list[str]:
        """The vectors' columns, in order: what every site announces as its feature columns."""
        return [c for f in self.features for c in f.outputs()]

    def transformer(self):
        """scikit-learn's ColumnTransformer that encodes a table of the schema's features (an object array,
        one column per feature: floats with NaN for a missing number, strings with None for a missing
        category), fitted on one row made from the schema alone."""
        from sklearn.compose import ColumnTransformer
        from sklearn.impute import SimpleImputer
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import OneHotEncoder

        steps = []
        for j, f in enumerate(self.features):
            if f.kind == NUMERIC:
                t = "passthrough" if f.fill is None else SimpleImputer(strategy="constant", fill_value=float(f.fill))
            else:
                t = OneHotEncoder(categories=[list(f.categories)], sparse_output=False, dtype=np.float64,
                                  handle_unknown=IGNORE if f.unknown == IGNORE else ERROR)
                if f.fill is not None:
                    t = make_pipeline(SimpleImputer(strategy="constant", fill_value=f.fill, missing_values=None), t)
            steps.append((f"f{j}", t, [j]))
        ct = ColumnTransformer(steps, sparse_threshold=0.0, verbose_feature_names_out=False)
        example = np.array([[0.0 if f.kind == NUMERIC else f.categories[0] for f in self.features]], dtype=object)
        ct.fit(example)
        return ct


def _name(v) -> bool:
    return isinstance(v, str) and bool(v.strip()) and v == v.strip()


def _no_stray_keys(d: dict, allowed: set[str], where: str, bad) -> None:
    stray = sorted(k for k in d if k not in allowed and not str(k).startswith("_"))
    if stray:
        raise bad(where, f"unknown key {stray[0]!r} (known: {', '.join(sorted(allowed))}; \"_…\" keys are comments)")


def _classes(v, bad) -> tuple[str, ...] | None:
    if v is None:
        return None
    if isinstance(v, list):
        names = v
    elif isinstance(v, dict):
        idx = list(v.values())
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in idx) or sorted(idx) != list(range(len(idx))):
            raise bad(f"the indices must be 0..{len(idx) - 1}, each once, got {sorted(idx, key=str)}")
        names = sorted(v, key=v.get)
    else:
        raise bad('a list of class names (class i is the i-th) or an object {"name": index}')
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise bad("class names must be non-empty strings")
    names = [n.strip() for n in names]
    if len(set(names)) != len(names):
        raise bad(f"{next(n for n in names if names.count(n) > 1)!r} is named twice")
    return tuple(names)


def _feature(f, missing: tuple[str, ...], bad) -> Feature:
    if not isinstance(f, dict):
        raise bad('each feature is an object {"name": …, "kind": "numeric" or "categorical"}')
    _no_stray_keys(f, _FEATURE_KEYS, "", bad)
    if not _name(f.get("name")):
        raise bad('"name" must be a column name')
    kind = f.get("kind")
    fill = f.get("fill")
    if kind == NUMERIC:
        if "categories" in f or "unknown" in f:
            raise bad('"categories" and "unknown" are for a categorical column')
        if fill is not None and (isinstance(fill, bool) or not isinstance(fill, (int, float)) or not math.isfinite(fill)):
            raise bad(f'"fill" must be a finite number, got {fill!r} (a value the consortium states, not a statistic '
                      "of a site's data)")
        return Feature(f["name"], NUMERIC, fill=None if fill is None else float(fill))
    if kind != CATEGORICAL:
        raise bad(f'"kind" must be "numeric" or "categorical", got {kind!r}')
    cats = f.get("categories")
    if not isinstance(cats, list) or not cats or not all(isinstance(c, str) for c in cats):
        raise bad('"categories" must be a non-empty list of strings')
    cats = [c.strip() for c in cats]
    if len(set(cats)) != len(cats):
        raise bad(f"the category {next(c for c in cats if cats.count(c) > 1)!r} is listed twice")
    in_missing = [c for c in cats if c in missing]
    if in_missing:
        raise bad(f"the category {in_missing[0]!r} is also a missing-value text (\"missing\"): a cell cannot be both")
    if fill is not None and fill not in cats:
        raise bad(f'"fill" must be one of the categories, got {fill!r} (add it to the list to give it a column)')
    unknown = f.get("unknown", ERROR)
    if not isinstance(unknown, str) or (unknown not in (ERROR, IGNORE) and unknown not in cats):
        raise bad(f'"unknown" must be "error", "ignore" or one of the categories (the bucket), got {unknown!r}')
    return Feature(f["name"], CATEGORICAL, tuple(cats), fill, unknown)


# ---- the problems of a file


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    column: str | None
    message: str
    kind: str = "other"

    def __str__(self) -> str:
        where = [self.file] + ([f"line {self.line}"] if self.line is not None else []) + \
                ([f"column {self.column!r}"] if self.column is not None else [])
        return f"{where[0]}: " + (", ".join(where[1:]) + ": " if len(where) > 1 else "") + self.message


class Problems:
    """Every problem found, kept up to `keep` per (column, kind); the rest are counted, with their lines."""

    def __init__(self, keep: int | None = None):
        self.keep, self.items = keep, []
        self._seen: Counter = Counter()
        self._more: dict[tuple, list] = {}

    def add(self, file, line, column, message, kind="other") -> None:
        key = (file, column, kind)
        self._seen[key] += 1
        if self.keep is None or self._seen[key] <= self.keep:
            self.items.append(Problem(str(file), line, column, message, kind))
        else:
            m = self._more.setdefault(key, [0, line, line])
            m[0] += 1
            m[2] = line

    def __len__(self) -> int:
        return sum(self._seen.values())

    def lines(self) -> list[str]:
        files = list(dict.fromkeys(p.file for p in self.items))  # each file's problems by line, in reading order
        out = [str(p) for p in sorted(self.items, key=lambda p: (files.index(p.file), p.line or 0))]
        for (file, column, kind), (n, first, last) in self._more.items():
            where = f"column {column!r}: " if column is not None else ""
            span = f" (lines {first}–{last})" if first is not None else ""
            out.append(f"{file}: {where}{n} more {kind} problem(s) like the above{span}; --all lists every one")
        return out


# ---- reading a table's cells


def _cell(v) -> str | None:
    """A cell as text, stripped; None for a Parquet null. An integral float is written as an integer
    (a Parquet column of 1.0, 2.0 against categories "1", "2")."""
    if v is None:
        return None
    if isinstance(v, str):
        return v.strip()
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return str(int(v))
    return str(v)


def _table(path: Path, problems: Problems):
    """(header, rows): rows yield (line, cells) — cells as read (str from CSV, Python values from
    Parquet). None when the file cannot be read at all (the problem is recorded)."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _csv_table(path, problems)
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            problems.add(path, None, None, "reading Parquet needs pyarrow: pip install -e '.[parquet]'", "file")
            return None
        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow's own error family
            problems.add(path, None, None, f"not a readable Parquet file ({exc})", "file")
            return None
        header = [str(n) for n in table.column_names]
        cols = [table.column(i).to_pylist() for i in range(len(header))]
        return header, ((k + 2, list(r)) for k, r in enumerate(zip(*cols)))
    problems.add(path, None, None, f"a schema describes a table: give a .csv or .parquet file, not {suffix or 'no suffix'!r}"
                 + (" (a .npz's X is numbers already: drop --schema)" if suffix == ".npz" else ""), "file")
    return None


def _csv_table(path: Path, problems: Problems):
    try:
        f = open(path, newline="", encoding="utf-8-sig")
    except OSError as exc:
        problems.add(path, None, None, f"cannot read it ({exc.strerror or exc})", "file")
        return None
    reader = csv.reader(f)
    try:
        header = next((r for r in reader if any(c.strip() for c in r)), [])
    except (UnicodeDecodeError, csv.Error) as exc:
        f.close()
        problems.add(path, None, None, f"not a readable CSV file ({exc}); save it as UTF-8 CSV", "file")
        return None
    header = [h.strip() for h in header]

    def rows():
        with f:
            try:
                for r in reader:
                    if any(c.strip() for c in r):
                        yield reader.line_num, r
            except (UnicodeDecodeError, csv.Error) as exc:
                problems.add(path, reader.line_num + 1, None, f"unreadable from here on ({exc}); save it as UTF-8 CSV",
                             "file")

    return header, rows()


# ---- one pass over a file: every problem, and the arrays when there is none


def prepare(path: str | os.PathLike, schema: Schema, columns, require_site: bool = False,
            problems: Problems | None = None) -> tuple[dict | None, Problems]:
    """Read a .csv or .parquet through the schema: (the arrays X, y, and where present site, y_true,
    id, columns — as xclp.datafile.load_data_file gives them — or None, the problems). Every problem
    of the file is found in this one pass; the arrays come only from a file without any. `columns`: the
    file's columns (xclp.datafile.Columns: site, truth and ignored columns besides the schema's)."""
    path = Path(path)
    problems = problems if problems is not None else Problems()
    before = len(problems)
    if not path.is_file():
        problems.add(path, None, None, "no such file", "file")
        return None, problems
    read = _table(path, problems)
    if read is None:
        return None, problems
    header, rows = read
    if not header:
        problems.add(path, None, None, "empty file; expected a header row and one row per point", "file")
        return None, problems
    if len(header) == 1 and ";" in header[0]:
        problems.add(path, 1, None, f"the header is one column, {header[0]!r}: a semicolon-separated file? Save it as "
                     "comma-separated CSV (in a spreadsheet: CSV with ',' as the field delimiter, '.' as the decimal "
                     "point)", "layout")
        return None, problems
    for h in sorted({h for h in header if header.count(h) > 1}):
        problems.add(path, 1, h, "the header names this column twice", "layout")
    feature_names = [f.name for f in schema.features]
    special = {schema.label, columns.site, columns.truth} | ({schema.id} if schema.id else set())
    known = set(feature_names) | special | set(schema.ignore) | set(columns.ignore)
    for c in feature_names:
        if c not in header:
            problems.add(path, 1, c, f"missing: the schema's feature column is not in the file (columns: {header})",
                         "layout")
    if schema.label not in header:
        problems.add(path, 1, schema.label, f"missing: no label column (columns: {header}){separator_hint(header)}",
                     "layout")
    if schema.id and schema.id not in header:
        problems.add(path, 1, schema.id, f"missing: no ID column (columns: {header})", "layout")
    if require_site and columns.site not in header:
        problems.add(path, 1, columns.site, f"missing: no site column (columns: {header}); name it with --site-column",
                     "layout")
    for c in columns.ignore:
        if c not in header:
            problems.add(path, 1, c, f"no such column to ignore (columns: {header}); check --ignore-columns", "layout")
    for c in header:
        if c not in known:
            problems.add(path, 1, c, 'extra: a column the schema does not name; add it to the schema\'s "features" or '
                         'to its "ignore" list', "layout")
    at = {h: header.index(h) for h in header}
    feats = [(f, at.get(f.name)) for f in schema.features]
    ct = schema.transformer()
    blocks, ys, sites, truths, ids, id_lines = [], [], [], [], [], {}
    n = 0

    def encode(block: list[tuple[int, list]]) -> None:
        table = np.empty((len(block), len(feats)), dtype=object)
        for j, (f, k) in enumerate(feats):
            for i, (line, r) in enumerate(block):
                table[i, j] = _feature_cell(path, line, f, None if k is None else r[k], schema.missing, problems)
        for line, r in block:
            ys.append(_label_cell(path, line, schema.label, r[at[schema.label]], schema, problems)
                      if schema.label in at else UNLABELLED)
            if columns.truth in at:
                truths.append(_label_cell(path, line, columns.truth, r[at[columns.truth]], schema, problems))
            if columns.site in at:
                s = _cell(r[at[columns.site]])
                if not s or s in schema.missing:
                    problems.add(path, line, columns.site, "empty site name", "site")
                sites.append(s or "")
            if schema.id and schema.id in at:
                v = _cell(r[at[schema.id]])
                if not v or v in schema.missing:
                    problems.add(path, line, schema.id, "empty ID", "id")
                elif v in id_lines:
                    problems.add(path, line, schema.id, f"the ID {v!r} repeats line {id_lines[v]}'s", "id")
                else:
                    id_lines[v] = line
                ids.append(v or "")
        if len(problems) == before:
            with warnings.catch_warnings():  # "unknown": "ignore" is the schema's rule, not news
                warnings.filterwarnings("ignore", message="Found unknown categories", category=UserWarning)
                blocks.append(np.asarray(ct.transform(table), dtype=np.float64))

    block = []
    for line, r in rows:
        if len(r) != len(header):
            hint = " (a comma inside an unquoted cell, e.g. a decimal comma?)" if len(r) > len(header) else ""
            problems.add(path, line, None, f"{len(r)} cells, the header has {len(header)}{hint}", "row")
            continue
        block.append((line, r))
        n += 1
        if len(block) == BLOCK:
            encode(block)
            block = []
    if block:
        encode(block)
    if n == 0 and len(problems) == before:
        problems.add(path, None, None, "a header and no points", "file")
    if len(problems) != before:
        return None, problems
    out = {"X": np.vstack(blocks), "y": np.array(ys, dtype=np.int64),
           "columns": np.array(schema.output_columns(), dtype=str)}
    if sites:
        out["site"] = np.array(sites, dtype=str)
    if truths:
        out["y_true"] = np.array(truths, dtype=np.int64)
    if schema.id:
        out["id"] = np.array(ids, dtype=str)
    return out, problems


def _feature_cell(path, line, f: Feature, v, missing, problems: Problems):
    """A feature cell as the transformer takes it: a float (NaN: missing) or a category (None: missing)."""
    text = _cell(v)
    if text is None or text in missing:
        if f.fill is None:
            problems.add(path, line, f.name, "a missing value, and the schema gives this column no \"fill\"", "missing")
        return np.nan if f.kind == NUMERIC else None
    if f.kind == NUMERIC:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            x = float(v)
        else:
            try:
                x = float(text)
            except ValueError:
                hint = " (a decimal comma? write 12.5)" if _DECIMAL_COMMA.match(text) else ""
                problems.add(path, line, f.name, f"{text!r} is not a number{hint}", "number")
                return np.nan
        if not math.isfinite(x):
            problems.add(path, line, f.name, f"{text!r} is not a value: leave the cell empty (a missing value) or "
                         "give a number", "nan")
            return np.nan
        return x
    if text in f.categories:
        return text
    if f.unknown == ERROR:
        near = difflib.get_close_matches(text, f.categories, n=1)
        problems.add(path, line, f.name, f"{text!r} is not one of the schema's categories {list(f.categories)}"
                     + (f"; did you mean {near[0]!r}?" if near else "")
                     + ' (or give the column "unknown": "ignore" or an "other" category)', "category")
        return None
    return text if f.unknown == IGNORE else f.unknown


def _label_cell(path, line, column: str, v, schema: Schema, problems: Problems) -> int:
    """A class index; a missing cell is an unlabelled point (−1)."""
    text = _cell(v)
    if text is None or text in schema.missing:
        return UNLABELLED
    if schema.classes is not None:
        if text in schema.classes:
            return schema.classes.index(text)
        near = difflib.get_close_matches(text, schema.classes, n=1)
        problems.add(path, line, column, f"{text!r} is not one of the schema's classes {list(schema.classes)}"
                     + (f"; did you mean {near[0]!r}?" if near else "") + " (an empty cell is unlabelled)", "label")
        return UNLABELLED
    try:
        x = float(text)
    except ValueError:
        x = None
    if x is None or not math.isfinite(x) or x != int(x) or not -1 <= x < MAX_LABEL:
        problems.add(path, line, column, f"{text!r} is not an integer class label (0..C−1; empty or −1 for "
                     'unlabelled; class names need the schema\'s "label": {"classes": [...]})', "label")
        return UNLABELLED
    return int(x)


def load_table(path, schema: Schema, columns, require_site: bool) -> dict:
    """`prepare`'s arrays, or a DataError naming the first problems (`xclp data check` lists them all)."""
    out, problems = prepare(path, schema, columns, require_site)
    if out is None:
        lines = problems.lines()
        more = len(problems) - min(len(lines), SHOWN_IN_ERRORS)
        raise DataError("; ".join(lines[:SHOWN_IN_ERRORS])
                        + (f"; and {more} more problem(s): `xclp data check {path} --schema {schema.source or 'SCHEMA'}` "
                           "lists them all" if more > 0 else ""))
    return out


def with_schema(columns, schema: Schema):
    """A driver's Columns (its flags or node config) with the schema's label and ID columns, and the schema."""
    if columns.label not in ("label", schema.label):
        raise DataError(f"the label column is {columns.label!r} by --label-column (label-column=), {schema.label!r} "
                        f"by the schema {schema.source}: drop the flag")
    if columns.id and schema.id and columns.id != schema.id:
        raise DataError(f"the ID column is {columns.id!r} by --id-column (id-column=), {schema.id!r} by the schema "
                        f"{schema.source}: drop the flag")
    return replace(columns, label=schema.label, id=schema.id or columns.id, schema=schema)


# ---- a first draft, from a site's own file(s)

_MISSING_TEXTS = ("NA", "N/A", "NaN", "nan", "null", "NULL", "None")


def draft(paths, label: str, id_column: str | None = None, site: str | None = None, truth: str | None = None,
          ignore: tuple[str, ...] = ()) -> dict:
    """A schema drafted from the file(s): every other column a feature — numeric where every non-missing
    cell is a number, else categorical with the values seen, sorted — and the label's values as its
    classes (none when they are integers). A missing cell gets no "fill": the consortium states one.
    What it lists is THIS site's categories and class names: a draft for the operators to compare with
    the consortium's data dictionary, not a file to send as is."""
    problems = Problems()
    seen: dict[str, list] = {}
    order: list[str] = []
    empty: Counter = Counter()
    skip = {id_column, site, truth, *ignore} - {None}
    for p in paths:
        read = _table(Path(p), problems)
        if read is None:
            raise DataError("; ".join(problems.lines()))
        header, rows = read
        if label not in header:
            raise DataError(f"{p}: no label column {label!r} (columns: {header}); check --label-column"
                            f"{separator_hint(header)}")
        take = [(h, j) for j, h in enumerate(header) if h not in skip]
        for h, _ in take:
            if h not in seen:
                seen[h] = []
                order.append(h)
        for _, r in rows:
            if len(r) != len(header):
                continue
            for h, j in take:
                t = _cell(r[j])
                if t is None or t == "":
                    empty[h] += 1
                else:
                    seen[h].append(t)
    if problems.items:
        raise DataError("; ".join(problems.lines()))
    markers = sorted({t for vals in seen.values() for t in vals if t in _MISSING_TEXTS})
    todo, feats = [], []
    for h in order:
        vals = [t for t in seen[h] if t not in markers]
        n_missing = empty[h] + (len(seen[h]) - len(vals))
        if h == label:
            continue
        numbers = _numbers(vals)
        if numbers is not None:  # (a column with no value at all, too: the consortium says what it is)
            feats.append({"name": h, "kind": NUMERIC})
            if n_missing:
                todo.append(f"{h!r}: {n_missing} missing cell(s) here: agree a \"fill\" (a value the consortium states, "
                            f"e.g. from a reference; this file's median is {float(np.median(numbers)):g})")
        else:
            feats.append({"name": h, "kind": CATEGORICAL, "categories": sorted(set(vals))})
            if n_missing:
                todo.append(f"{h!r}: {n_missing} missing cell(s) here: agree a \"fill\" (one of the categories, e.g. "
                            "add \"unknown\")")
            todo.append(f"{h!r}: the categories are this file's; agree the full list (a data dictionary), and "
                        "\"unknown\": \"error\", \"ignore\" or a bucket category")
    labels = [t for t in seen[label] if t not in markers]
    lab: dict = {"column": label}
    ints = _numbers(labels)
    if ints is None or any(x != int(x) for x in ints):
        lab["classes"] = sorted(set(labels))
        todo.append(f"{label!r}: the classes are this file's label names, in sorted order (class i is the i-th): "
                    "agree the list and its order")
    out: dict = {"format": FORMAT, "_note": "drafted from " + ", ".join(str(p) for p in paths) + ": it lists this "
                 "site's own categories and class names; agree every list with the consortium (e.g. from a data "
                 "dictionary) before it is shared, and settle each _todo", "label": lab}
    if id_column:
        out["id"] = id_column
    out["missing"] = [""] + markers
    out["features"] = feats
    if ignore:
        out["ignore"] = list(ignore)
    if todo:
        out["_todo"] = todo
    if not feats:
        raise DataError(f"{', '.join(map(str, paths))}: no feature columns besides the label")
    Schema.from_dict(out, "the draft")  # what it writes, it reads
    return out


def _numbers(vals: list[str]) -> list[float] | None:
    try:
        xs = [float(v) for v in vals]
    except ValueError:
        return None
    return xs if all(math.isfinite(x) for x in xs) else None
