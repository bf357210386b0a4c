"""A site's ID column and ignored columns: the ID is no feature and comes back with the results, the
ignored columns are dropped, and a column named but absent is one clear line."""

import csv
import os
import stat

import numpy as np
import pytest

from cli.main import main
from clients.results import write_results
from clients.site_state import load_site, load_site_data
from xclp.data import DataError
from xclp.datafile import Columns, parse_column_list

HEADER = ["patient", "f0", "diagnosis", "notes", "f1", "ward"]


def _write(path, n=6):
    rows = [[f"P-{i:03d}", 0.5 * i, "" if i % 2 else str(i % 3), f"note, {i}", -1.0 * i, "A"] for i in range(n)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)
    return rows


def test_an_id_column_is_carried_and_ignored_columns_are_dropped(tmp_path):
    rows = _write(tmp_path / "a.csv")
    cols = Columns(label="diagnosis", id="patient", ignore=parse_column_list(" notes, ward "))
    X, y, y_true, ids, _ = load_site(tmp_path / "a.csv", cols)
    assert X.shape == (6, 2) and np.array_equal(X[:, 0], [r[1] for r in rows])  # f0, f1 only
    assert list(ids) == [r[0] for r in rows] and y_true is None
    assert list(y) == [0, -1, 2, -1, 1, -1]
    assert len(load_site_data(tmp_path / "a.csv", cols)) == 3  # the old three-tuple stays
    with pytest.raises(DataError, match="'notes', row 2: .* is not a number|column 'notes'"):
        load_site(tmp_path / "a.csv", Columns(label="diagnosis", id="patient", ignore=("ward",)))


def test_the_same_from_parquet_and_npz(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = _write(tmp_path / "a.csv")
    table = pa.table({h: [r[j] for r in rows] for j, h in enumerate(HEADER)})
    pq.write_table(table, tmp_path / "a.parquet")
    cols = Columns(label="diagnosis", id="patient", ignore=("notes", "ward"))
    ref = load_site(tmp_path / "a.csv", cols)
    got = load_site(tmp_path / "a.parquet", cols)
    assert np.array_equal(got.X, ref.X) and np.array_equal(got.y, ref.y) and list(got.ids) == list(ref.ids)
    np.savez(tmp_path / "a.npz", X=ref.X, y=ref.y, patient=ref.ids)
    assert list(load_site(tmp_path / "a.npz", Columns(id="patient")).ids) == list(ref.ids)
    assert load_site(tmp_path / "a.npz").ids is None
    with pytest.raises(DataError, match="no array 'mrn'"):
        load_site(tmp_path / "a.npz", Columns(id="mrn"))


@pytest.mark.parametrize("cols, words", [
    (Columns(label="diagnosis", id="mrn"), "no ID column 'mrn' .*--id-column"),
    (Columns(label="diagnosis", ignore=("notes", "comment")), "no column 'comment' to ignore .*--ignore-columns"),
    (Columns(label="label"), "no label column 'label' .*--label-column"),
])
def test_a_named_column_that_is_not_there_is_one_clear_error(tmp_path, cols, words):
    _write(tmp_path / "a.csv")
    with pytest.raises(DataError, match=words):
        load_site(tmp_path / "a.csv", cols)


def test_the_id_and_label_columns_cannot_be_ignored_or_shared():
    with pytest.raises(DataError, match="cannot ignore"):
        Columns(label="diagnosis", ignore=("diagnosis",))
    with pytest.raises(DataError, match="ID column 'site' must"):
        Columns(id="site")


def test_results_are_written_as_npz_and_csv(tmp_path):
    labels, conf = np.array([2, 0, -1]), np.array([0.9, 0.51, 0.0])
    npz, table = write_results(tmp_path / "job1.npz", labels, conf, np.array(["P-1", "P-2", "P-3"]))
    assert table == tmp_path / "job1.csv" and not list(tmp_path.glob("*.partial*"))
    with np.load(npz) as f:
        assert list(f["ids"]) == ["P-1", "P-2", "P-3"] and np.array_equal(f["labels"], labels)
    with open(table, newline="") as f:
        got = list(csv.reader(f))
    assert got[0] == ["id", "label", "confidence"]
    assert [(r[0], int(r[1]), float(r[2])) for r in got[1:]] == [("P-1", 2, 0.9), ("P-2", 0, 0.51), ("P-3", -1, 0.0)]
    write_results(tmp_path / "job2.npz", labels, conf)  # no ID column: the row's position
    with open(tmp_path / "job2.csv", newline="") as f:
        assert [r[0] for r in csv.reader(f)] == ["id", "0", "1", "2"]
    with np.load(tmp_path / "job2.npz") as f:
        assert "ids" not in f.files


def test_every_result_file_is_the_owners_only_whatever_the_umask(tmp_path):
    """One rule for every driver (the agent's prediction and training jobs, Flower's ClientApp): the
    labels with the patients' IDs, the CSV, the model and the scaling beside them are 0600, under a
    umask that would leave a plain write world-readable; a suffix given None writes no file."""
    old = os.umask(0o022)
    try:
        npz, table = write_results(tmp_path / "job3.npz", np.array([1, 0]), np.array([0.7, 0.6]), np.array(["P-1", "P-2"]),
                                   files={".model.npz": b"weights", ".scaling.json": b"{}", ".none": None})
    finally:
        os.umask(old)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["job3.csv", "job3.model.npz", "job3.npz", "job3.scaling.json"], written
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == dict.fromkeys(written, 0o600)
    assert (tmp_path / "job3.model.npz").read_bytes() == b"weights"


def test_the_agent_names_a_missing_column_in_one_line(tmp_path, capsys):
    _write(tmp_path / "a.csv")
    code = main(["agent", "run", "--coordinator", "http://127.0.0.1:9", "--site", "a", "--token", "t" * 32,
                 "--data", str(tmp_path / "a.csv"), "--label-column", "diagnosis", "--id-column", "mrn",
                 "--out", str(tmp_path / "out"), "--trust-on-first-use"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("xclp:")]  # (besides the agent's start log)
    assert code == 2 and len(errors) == 1 and "no ID column 'mrn'" in errors[0] and "Traceback" not in err


def _pooled(path, X, y, site, extra: bool):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow((["pid"] if extra else []) + [f"px{j}" for j in range(X.shape[1])] + ["label", "site"]
                   + (["note"] if extra else []))
        for i in range(len(y)):
            w.writerow(([f"p{i}"] if extra else []) + [repr(float(v)) for v in X[i]]
                       + ["" if y[i] < 0 else int(y[i]), site[i]] + (["free, text"] if extra else []))


def test_simulations_read_the_same_points_with_an_id_and_ignored_columns(tmp_path):
    from xclp.data import load_arrays
    from xclp.training.runner import TrainConfig, prepare_files

    X, y_true = load_arrays("digits", limit=120, seed=1)
    y = np.where(np.arange(120) % 3 == 0, y_true, -1)
    site = np.array(["north", "south"])[np.arange(120) % 2]
    _pooled(tmp_path / "plain.csv", X, y, site, extra=False)
    _pooled(tmp_path / "extra.csv", X, y, site, extra=True)
    _pooled(tmp_path / "test-plain.csv", X[:20], y_true[:20], site[:20], extra=False)
    _pooled(tmp_path / "test-extra.csv", X[:20], y_true[:20], site[:20], extra=True)
    plain = prepare_files(TrainConfig(algorithm="fedavg", data=str(tmp_path / "plain.csv"),
                                      test=str(tmp_path / "test-plain.csv")))
    extra = prepare_files(TrainConfig(algorithm="fedavg", data=str(tmp_path / "extra.csv"),
                                      test=str(tmp_path / "test-extra.csv"), id_column="pid", ignore_columns="note"))
    for a, b in zip(plain[0], extra[0]):
        assert a.name == b.name and np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y)
    assert np.array_equal(plain[2][0], extra[2][0]) and plain[3] == extra[3]
    for name, flags in [("plain.csv", []), ("extra.csv", ["--id-column", "pid", "--ignore-columns", "note"])]:
        assert main(["simulate", "predict", "--data", str(tmp_path / name), "--bits", "64", "--quiet",
                     "--no-baselines", "--predictions", str(tmp_path / f"{name}.npz"), *flags]) == 0
    with np.load(tmp_path / "plain.csv.npz") as a, np.load(tmp_path / "extra.csv.npz") as b:
        assert np.array_equal(a["labels"], b["labels"]) and np.array_equal(a["confidence"], b["confidence"])
