"""A site's data as .npz, .csv or .parquet: the same arrays from each, the same clear errors."""

import builtins
import csv
import json

import numpy as np
import pytest

from cli.main import main
from xclp.data import DataError, load_arrays
from xclp.datafile import Columns, dataset_from_file, load_data_file

pa = pytest.importorskip("pyarrow", reason="the Parquet tests need the optional extra: pip install -e '.[parquet]'")
import pyarrow.parquet as pq  # noqa: E402


def _rows(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = np.round(rng.normal(size=(n, 3)), 6)
    y_true = rng.integers(0, 3, n)
    y = np.where(np.arange(n) % 3 == 0, y_true, -1)
    site = np.array(["north", "south"])[np.arange(n) % 2]
    return X, y, site, y_true


def _write_csv(path, X, y, site, y_true, empty_unlabelled=True, label="label"):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["f0", "site", "f1", label, "f2", "y_true"])  # the columns in any order
        for i in range(len(y)):
            lab = "" if (y[i] < 0 and empty_unlabelled) else str(int(y[i]))
            w.writerow([repr(float(X[i, 0])), site[i], repr(float(X[i, 1])), lab, repr(float(X[i, 2])), int(y_true[i])])


def _write_parquet(path, X, y, site, y_true):
    table = pa.table({"f0": X[:, 0], "f1": X[:, 1], "f2": X[:, 2], "site": site.tolist(),
                      "label": pa.array([None if v < 0 else int(v) for v in y], type=pa.int64()),
                      "y_true": y_true.astype(np.int64)})
    pq.write_table(table, path)


def test_npz_csv_and_parquet_give_the_same_data(tmp_path):
    X, y, site, y_true = _rows()
    np.savez(tmp_path / "d.npz", X=X, y=y, site=site, y_true=y_true)
    _write_csv(tmp_path / "d.csv", X, y, site, y_true)
    _write_csv(tmp_path / "minus.csv", X, y, site, y_true, empty_unlabelled=False)  # −1, not empty
    _write_parquet(tmp_path / "d.parquet", X, y, site, y_true)
    ref = dataset_from_file(tmp_path / "d.npz")
    for name in ("d.csv", "minus.csv", "d.parquet"):
        ds = dataset_from_file(tmp_path / name)
        assert np.array_equal(ds.X, ref.X), name
        assert np.array_equal(ds.y, ref.y) and np.array_equal(ds.y_true, ref.y_true), name
        assert list(ds.site) == list(ref.site) and ds.n_classes == ref.n_classes, name
    # a site's own file needs no site column
    one = load_data_file(tmp_path / "d.csv", require_site=False)
    assert one["X"].shape == (40, 3) and int((one["y"] == -1).sum()) == int((y == -1).sum())


def test_named_columns(tmp_path):
    X, y, site, y_true = _rows()
    _write_csv(tmp_path / "d.csv", X, y, site, y_true, label="diagnosis")
    with pytest.raises(DataError, match="no label column 'label'.*--label-column"):
        dataset_from_file(tmp_path / "d.csv")
    ds = dataset_from_file(tmp_path / "d.csv", Columns(label="diagnosis"))
    assert np.array_equal(ds.y, y)
    # with y_true named as the site column there is no site column left, and the clash is refused
    with pytest.raises(DataError, match="three different names"):
        Columns(label="a", site="a")


@pytest.mark.parametrize("cell, column, message", [
    ("abc", "f1", "row 5, column 'f1': 'abc' is not a number"),
    ("inf", "f2", "row 5, column 'f2': 'inf' is not a value a feature may take"),
    ("", "f1", "row 5, column 'f1': empty feature value"),
    ("nan", "f1", "row 5, column 'f1': 'nan' is not a value a feature may take"),  # (where it is, as for inf)
    ("cat", "label", "row 5, column 'label': 'cat' is not an integer class label"),
    ("2.5", "label", "is not an integer class label"),
    ("-4", "label", "label -4"),
    ("", "site", "row 5: empty site name"),
])
def test_bad_cells_are_refused_with_where_they_are(tmp_path, cell, column, message):
    X, y, site, y_true = _rows()
    _write_csv(tmp_path / "d.csv", X, y, site, y_true)
    rows = list(csv.reader(open(tmp_path / "d.csv")))
    rows[4][rows[0].index(column)] = cell  # row 5 of the file, counting the header
    with open(tmp_path / "d.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(DataError, match=message.replace("-4", "−?-?4")):
        dataset_from_file(tmp_path / "d.csv")


def test_malformed_files(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "ragged.csv").write_text("f0,label,site\n1,0,a\n2,1\n")
    (tmp_path / "features.csv").write_text("label,site\n0,a\n1,b\n")
    (tmp_path / "dup.csv").write_text("f0,f0,label,site\n1,2,0,a\n")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "d.xlsx").write_bytes(b"")
    for name, message in [("empty.csv", "empty file"), ("ragged.csv", "row 3 has 2 cells"),
                          ("features.csv", "no feature columns"), ("dup.csv", "repeated column names"),
                          ("junk.parquet", "not a readable Parquet file"), ("d.xlsx", "unknown data format"),
                          ("missing.csv", "no such file")]:
        with pytest.raises(DataError, match=message):
            dataset_from_file(tmp_path / name)
    (tmp_path / "blank.csv").write_text("f0,label,site\n\n1,0,a\n2,x,a\n\n")  # blank lines skipped, rows named by line
    with pytest.raises(DataError, match="row 4, column 'label'"):
        dataset_from_file(tmp_path / "blank.csv")
    (tmp_path / "huge.csv").write_text("f0,label,site\n1,99999999999999999999,a\n2,1,b\n")
    with pytest.raises(DataError, match="not an integer class label below"):
        dataset_from_file(tmp_path / "huge.csv")
    (tmp_path / "nosite.csv").write_text("f0,label\n1,0\n2,1\n")
    with pytest.raises(DataError, match="no site column 'site'"):
        dataset_from_file(tmp_path / "nosite.csv")


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    X, y, site, y_true = _rows()
    _write_parquet(tmp_path / "d.parquet", X, y, site, y_true)
    real = builtins.__import__

    def no_pyarrow(name, *a, **k):
        if name.startswith("pyarrow"):
            raise ImportError("no pyarrow")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(DataError, match=r"pip install -e '\.\[parquet\]'"):
        dataset_from_file(tmp_path / "d.parquet")


def test_simulate_predict_takes_csv_and_parquet(tmp_path, capsys):
    X, y_true = load_arrays("digits", limit=200, seed=1)
    y = np.where(np.arange(200) % 4 == 0, y_true, -1)
    site = np.array(["north", "south"])[np.arange(200) % 2]
    np.savez(tmp_path / "mine.npz", X=X, y=y, site=site, y_true=y_true)
    cols = {f"px{j}": X[:, j] for j in range(X.shape[1])}
    pq.write_table(pa.table({**cols, "hospital": site.tolist(),
                             "dx": pa.array([None if v < 0 else int(v) for v in y], type=pa.int64()),
                             "y_true": y_true}), tmp_path / "mine.parquet")
    results = {}
    for name, extra in [("mine.npz", []), ("mine.parquet", ["--label-column", "dx", "--site-column", "hospital"])]:
        out = tmp_path / f"{name}.json"
        assert main(["simulate", "predict", "--data", str(tmp_path / name), "--bits", "128", "--quiet",
                     "--no-baselines", "--json", str(out), *extra]) == 0
        results[name] = json.loads(out.read_text())
    assert results["mine.parquet"]["accuracy"] == results["mine.npz"]["accuracy"]
    assert set(results["mine.parquet"]["per_site_accuracy"]) == {"north", "south"}
    # a bad file ends in a clear message and exit code 2, not a traceback
    (tmp_path / "bad.csv").write_text("f0,label,site\n1,x,a\n")
    assert main(["simulate", "predict", "--data", str(tmp_path / "bad.csv"), "--quiet"]) == 2
    assert "'x' is not an integer class label" in capsys.readouterr().err


def test_csv_is_parsed_a_block_at_a_time_and_still_names_the_bad_cell(tmp_path, monkeypatch):
    import xclp.datafile as datafile

    X, y, site, y_true = _rows(40)
    _write_csv(tmp_path / "d.csv", X, y, site, y_true)
    whole = dataset_from_file(tmp_path / "d.csv")
    monkeypatch.setattr(datafile, "CSV_BLOCK", 3)  # 14 blocks, the last one short
    rows = list(csv.reader(open(tmp_path / "d.csv")))
    rows.insert(10, [])  # a blank line inside a block: no point, and the row numbers still count it
    with open(tmp_path / "d.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    blocks = dataset_from_file(tmp_path / "d.csv")
    assert np.array_equal(blocks.X, whole.X) and np.array_equal(blocks.y, whole.y)
    rows[30][rows[0].index("f2")] = "n/a"  # file row 31, in a later block
    with open(tmp_path / "d.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(DataError, match="row 31, column 'f2': 'n/a' is not a number"):
        dataset_from_file(tmp_path / "d.csv")


def test_edge_files_are_clear(tmp_path):
    X, y, site, y_true = _rows(6)
    _write_csv(tmp_path / "d.csv", X, y, site, y_true)
    text = (tmp_path / "d.csv").read_text()
    (tmp_path / "late.csv").write_text("\n\n" + text)  # blank lines before the header
    assert np.array_equal(dataset_from_file(tmp_path / "late.csv").X, dataset_from_file(tmp_path / "d.csv").X)
    bad = text.splitlines()
    bad[3] = bad[3].replace(bad[3].split(",")[0], "oops", 1)
    (tmp_path / "late.csv").write_text("\n\n" + "\n".join(bad) + "\n")
    with pytest.raises(DataError, match="row 6, column 'f0': 'oops'"):  # its line in the file
        dataset_from_file(tmp_path / "late.csv")
    (tmp_path / "head.csv").write_text(text.splitlines()[0] + "\n")
    with pytest.raises(DataError, match="head.csv: a header and no points"):
        dataset_from_file(tmp_path / "head.csv")
    table = pa.table({"f0": pa.array([[1.0, 2.0]] * 3), "label": [0, 1, 0], "site": ["a", "b", "a"]})
    pq.write_table(table, tmp_path / "lists.parquet")
    with pytest.raises(DataError, match="column 'f0'.*is not a number"):
        dataset_from_file(tmp_path / "lists.parquet")
