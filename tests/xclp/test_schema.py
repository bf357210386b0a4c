"""The consortium's schema (xclp/schema.py): a real table — text categories, class names, empty cells —
read through one shared file: every problem of a file in one run, the same columns at every site,
scikit-learn's OneHotEncoder doing the encoding, and each rule for an unknown category."""

import csv
import json
import warnings

import numpy as np
import pytest
from sklearn.preprocessing import OneHotEncoder

from cli.main import main
from clients.site_state import load_site
from xclp.data import DataError
from xclp.datafile import Columns, dataset_from_file, load_data_file
from xclp.schema import Schema, SchemaError, draft, prepare, with_schema

SPECIES = ["Adelie", "Chinstrap", "Gentoo"]
ISLANDS = ["Biscoe", "Dream", "Torgersen"]
HEADER = ["animal", "species", "island", "bill_length_mm", "flipper_length_mm", "sex", "year"]

SCHEMA = {
    "format": "xclp-schema/1",
    "_comment": "the penguins consortium's schema",
    "label": {"column": "species", "classes": {"Adelie": 0, "Chinstrap": 1, "Gentoo": 2}},
    "id": "animal",
    "missing": ["", "NA"],
    "features": [
        {"name": "bill_length_mm", "kind": "numeric", "fill": 44.0},
        {"name": "island", "kind": "categorical", "categories": ISLANDS},
        {"name": "flipper_length_mm", "kind": "numeric", "fill": 200.0},
        {"name": "sex", "kind": "categorical", "categories": ["female", "male", "unknown"], "fill": "unknown"},
    ],
    "ignore": ["year"],
}


def penguins(n=90, seed=0):
    """A penguins-like table: text labels (some blank: unlabelled), islands, sex with blanks, numbers with NA."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        s = int(rng.integers(3))
        rows.append([f"P{i:03d}", SPECIES[s] if rng.random() < 0.6 else "",
                     ISLANDS[(s + int(rng.integers(2))) % 3],
                     "NA" if rng.random() < 0.1 else f"{38 + 5 * s + rng.normal():.1f}",
                     "" if rng.random() < 0.1 else f"{190 + 10 * s + rng.normal():.0f}",
                     ["female", "male", ""][int(rng.integers(3))], str(2007 + i % 3)])
    return rows


def write_csv(path, rows, header=HEADER):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture
def schema_file(tmp_path):
    p = tmp_path / "schema.json"
    p.write_text(json.dumps(SCHEMA, indent=2))
    return p


def site_files(tmp_path):
    rows = penguins()
    # three sites; site C sees no Torgersen penguin and no blank sex: its columns must not change
    a = rows[:30]
    b = rows[30:60]
    c = [r[:2] + ["Dream" if r[2] == "Torgersen" else r[2]] + r[3:5] + [r[5] or "male"] + r[6:] for r in rows[60:]]
    return [write_csv(tmp_path / f"{name}.csv", part) for name, part in zip("abc", (a, b, c))], (a, b, c)


def test_three_sites_get_the_same_columns_from_a_mixed_table(tmp_path, schema_file):
    files, parts = site_files(tmp_path)
    schema = Schema.load(schema_file)
    cols = with_schema(Columns(), schema)
    got = [load_site(f, cols) for f in files]  # the agent's and the Flower node's loader
    want = ("bill_length_mm", "island_Biscoe", "island_Dream", "island_Torgersen", "flipper_length_mm",
            "sex_female", "sex_male", "sex_unknown")
    for site, rows in zip(got, parts):
        assert site.columns == want
        assert site.X.shape == (len(rows), len(want)) and np.isfinite(site.X).all()
        assert list(site.ids) == [r[0] for r in rows]
        assert list(site.y) == [SPECIES.index(r[1]) if r[1] else -1 for r in rows]  # names → the schema's indices
        bill = [44.0 if r[3] == "NA" else float(r[3]) for r in rows]  # the schema's fill, no site statistic
        assert np.allclose(site.X[:, 0], bill)
        assert np.allclose(site.X[:, 4], [200.0 if r[4] == "" else float(r[4]) for r in rows])
    assert not got[2].X[:, 3].any() and not got[2].X[:, 7].any()  # site C: no Torgersen, no unknown sex — columns kept


def test_onehotencoder_does_the_encoding(tmp_path, schema_file):
    files, parts = site_files(tmp_path)
    path, rows = files[0], parts[0]
    X = load_site(path, with_schema(Columns(), Schema.load(schema_file))).X
    island = OneHotEncoder(categories=[ISLANDS], sparse_output=False).fit_transform([[r[2]] for r in rows])
    sex = OneHotEncoder(categories=[["female", "male", "unknown"]], sparse_output=False).fit_transform(
        [[r[5] or "unknown"] for r in rows])
    assert np.array_equal(X[:, 1:4], island) and np.array_equal(X[:, 5:8], sex)
    ct = Schema.load(schema_file).transformer()
    steps = dict((name, t) for name, t, _ in ct.transformers_)
    assert type(steps["f1"]).__name__ == "OneHotEncoder" and steps["f1"].categories_[0].tolist() == ISLANDS


def test_the_simulation_and_the_flower_node_read_through_the_same_schema(tmp_path, schema_file):
    rows = penguins()
    pooled = write_csv(tmp_path / "pooled.csv", [r + ["abc"[i % 3]] for i, r in enumerate(rows)], HEADER + ["site"])
    ds = dataset_from_file(pooled, with_schema(Columns(), Schema.load(schema_file)))
    assert ds.X.shape == (90, 8) and sorted(ds.sites) == ["a", "b", "c"] and ds.n_classes == 3
    from xclp_flower.client_app import _columns

    cols = _columns({"schema": str(schema_file)})
    assert cols.schema == Schema.load(schema_file) and cols.label == "species" and cols.id == "animal"
    assert _columns({}).schema is None


BAD_ROWS = [
    ["P1", "Adelie", "Biscoe", "39.1", "181", "male", "2007"],
    ["P2", "Adelei", "Dream", "12,5", "186", "female", "2007"],      # unknown class name; decimal comma (row too long)
    ["P3", "Gentoo", "biscoe", "abc", "NaN", "female", "2008"],      # unknown category; not a number; NaN
    ["P1", "", "Atlantis", "40.2", "inf", "male", "2009"],           # duplicate ID; unknown category; inf
    ["P5", "Chinstrap", "Dream", "41.0", "190", "F", "2009"],        # unknown category
]


def test_a_bad_file_reports_every_problem_in_one_run(tmp_path, schema_file, capsys):
    header = [h for h in HEADER if h != "flipper_length_mm"] + ["flipper_length_mm", "weight"]  # extra column
    rows = [[r[0], r[1], r[2], r[3], r[5], r[6], r[4], "1"] for r in BAD_ROWS]
    rows[1][3] = "12,5"
    with open(tmp_path / "bad.csv", "w", newline="") as f:
        f.write(",".join(header) + "\n")
        f.write("\n".join(",".join(r) for r in rows) + "\n")  # unquoted: "12,5" splits the row
    bad = tmp_path / "bad.csv"
    assert main(["data", "check", str(bad), "--schema", str(schema_file)]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    expect = [
        f"{bad}: line 1, column 'weight': extra: a column the schema does not name",
        f"{bad}: line 3: 9 cells, the header has 8 (a comma inside an unquoted cell, e.g. a decimal comma?)",
        f"{bad}: line 4, column 'island': 'biscoe' is not one of the schema's categories",
        f"{bad}: line 4, column 'bill_length_mm': 'abc' is not a number",
        f"{bad}: line 4, column 'flipper_length_mm': 'NaN' is not a value",
        f"{bad}: line 5, column 'island': 'Atlantis' is not one of the schema's categories",
        f"{bad}: line 5, column 'flipper_length_mm': 'inf' is not a value",
        f"{bad}: line 5, column 'animal': the ID 'P1' repeats line 2's",
        f"{bad}: line 6, column 'sex': 'F' is not one of the schema's categories",
    ]
    for e in expect:
        assert sum(line.startswith(e) for line in lines) == 1, (e, lines)
    assert len(lines) == len(expect)
    assert "did you mean 'Biscoe'?" in out and "Traceback" not in err
    assert "9 problem(s) in 1 file(s)" in err
    # a label name the classes lack, in a row of the right length
    rows[1] = ["P2", "Adelei", "Dream", "12.5", "female", "2007", "186", "1"]
    write_csv(bad, rows, header)
    assert main(["data", "check", str(bad), "--schema", str(schema_file)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: line 3, column 'species': 'Adelei' is not one of the schema's classes" in out
    assert "did you mean 'Adelie'?" in out
    # the drivers' loader refuses the file with the first problems and points to the check
    with pytest.raises(DataError, match=r"line 1, column 'weight': extra.*; .*more problem\(s\): `xclp data check"):
        load_site(bad, with_schema(Columns(), Schema.load(schema_file)))


def test_missing_columns_semicolons_and_missing_values_without_a_fill(tmp_path, schema_file, capsys):
    write_csv(tmp_path / "few.csv", [["P1", "Adelie", "Biscoe", "", "2007"]],
              ["animal", "species", "island", "sex", "year"])
    schema = Schema.load(schema_file)
    _, problems = prepare(tmp_path / "few.csv", schema, Columns(label=schema.label, id=schema.id))
    text = "\n".join(problems.lines())
    assert "column 'bill_length_mm': missing: the schema's feature column is not in the file" in text
    assert "column 'flipper_length_mm': missing" in text and len(problems) == 2  # a blank sex is filled
    (tmp_path / "semi.csv").write_text("animal;species;island\nP1;Adelie;Biscoe\n")
    assert main(["data", "check", str(tmp_path / "semi.csv"), "--schema", str(schema_file)]) == 1
    assert "a semicolon-separated file?" in capsys.readouterr().out
    strict = json.loads(json.dumps(SCHEMA))
    del strict["features"][0]["fill"]
    rows = [r[:3] + ["40.0" if r[3] == "NA" else r[3]] + r[4:] for r in penguins(20)]
    rows[4][3] = "NA"
    _, problems = prepare(write_csv(tmp_path / "a.csv", rows), Schema.from_dict(strict),
                          Columns(label=Schema.from_dict(strict).label))
    assert [str(p) for p in problems.items] == [f"{tmp_path / 'a.csv'}: line 6, column 'bill_length_mm': a missing "
                                                "value, and the schema gives this column no \"fill\""]
    assert main(["data", "check", str(tmp_path / "a.csv"), "--schema", str(schema_file)]) == 0


@pytest.mark.parametrize("rule, want", [
    ("error", None),
    ("ignore", [0, 0, 0]),              # scikit-learn's handle_unknown="ignore": all zeros
    ("other", [0, 0, 0, 1]),            # the bucket category takes it
])
def test_a_category_outside_the_schema_gets_the_rules_outcome(tmp_path, rule, want):
    d = json.loads(json.dumps(SCHEMA))
    island = d["features"][1]
    island["unknown"] = rule
    if rule == "other":
        island["categories"] = ISLANDS + ["other"]
    rows = penguins(12)
    rows[3][2] = "Anvers"
    path = write_csv(tmp_path / "a.csv", rows)
    cols = with_schema(Columns(), Schema.from_dict(d, "s.json"))
    if want is None:
        with pytest.raises(DataError, match=r"line 5, column 'island': 'Anvers' is not one of the schema's categories"):
            load_site(path, cols)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rule is the schema's: no warning about it
        site = load_site(path, cols)
    width = len(island["categories"])
    assert site.X[3, 1:1 + width].tolist() == want
    assert site.columns[1:1 + width] == tuple(f"island_{c}" for c in island["categories"])


@pytest.mark.parametrize("change, words", [
    (lambda d: d["features"][0].update(fill="median"), r'"fill" must be a finite number.*not a statistic'),
    (lambda d: d["features"][1].update(unknown="maybe"), r'"unknown" must be "error", "ignore" or one of'),
    (lambda d: d["features"][3].update(fill="n/a"), r'"fill" must be one of the categories'),
    (lambda d: d["features"][1].update(categories=["Biscoe", "Biscoe"]), "listed twice"),
    (lambda d: d["features"][1].update(kind="text"), r'"kind" must be "numeric" or "categorical"'),
    (lambda d: d["label"].update(classes={"Adelie": 0, "Gentoo": 2}), r"indices must be 0..1"),
    (lambda d: d.update(colums=[]), r"unknown key 'colums'"),
    (lambda d: d["features"].append({"name": "island", "kind": "numeric"}), "'island' is named twice"),
])
def test_a_wrong_schema_is_one_clear_line(change, words):
    d = json.loads(json.dumps(SCHEMA))
    change(d)
    with pytest.raises(SchemaError, match=words):
        Schema.from_dict(d, "s.json")


def test_flags_that_contradict_the_schema_are_refused(tmp_path, schema_file, capsys):
    schema = Schema.load(schema_file)
    with pytest.raises(DataError, match="the label column is 'diagnosis' by --label-column"):
        with_schema(Columns(label="diagnosis"), schema)
    assert with_schema(Columns(label="species"), schema).label == "species"
    (tmp_path / "wrong.json").write_text('{"label": "species", "features": []}')
    assert main(["data", "check", str(tmp_path / "a.csv"), "--schema", str(tmp_path / "wrong.json")]) == 2
    assert main(["data", "check", str(tmp_path / "a.csv")]) == 2  # no schema: a usage error
    np.savez(tmp_path / "a.npz", X=np.ones((3, 2)), y=np.zeros(3))
    with pytest.raises(DataError, match="give a .csv or .parquet file.*drop --schema"):
        load_data_file(tmp_path / "a.npz", with_schema(Columns(), schema), require_site=False)


def test_parquet_reads_as_csv(tmp_path, schema_file):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = penguins(40)
    table = {h: [r[j] or None for r in rows] for j, h in enumerate(HEADER)}
    table["bill_length_mm"] = [None if v in (None, "NA") else float(v) for v in table["bill_length_mm"]]
    table["year"] = [int(v) for v in table["year"]]
    pq.write_table(pa.table(table), tmp_path / "a.parquet")
    cols = with_schema(Columns(), Schema.load(schema_file))
    ref = load_site(write_csv(tmp_path / "a.csv", rows), cols)
    got = load_site(tmp_path / "a.parquet", cols)
    assert np.allclose(got.X, ref.X) and np.array_equal(got.y, ref.y) and got.columns == ref.columns


def test_a_drafted_schema_lists_the_files_columns_for_the_consortium(tmp_path, capsys):
    rows = penguins(30)
    path = write_csv(tmp_path / "a.csv", rows)
    assert main(["data", "schema", str(path), "--label-column", "species", "--id-column", "animal",
                 "--ignore-columns", "year", "--out", str(tmp_path / "draft.json")]) == 0
    assert "DRAFT" in capsys.readouterr().err
    d = json.loads((tmp_path / "draft.json").read_text())
    assert d["label"] == {"column": "species", "classes": SPECIES} and d["id"] == "animal"
    assert d["missing"] == ["", "NA"] and d["ignore"] == ["year"]
    kinds = {f["name"]: (f["kind"], f.get("categories")) for f in d["features"]}
    assert kinds == {"island": ("categorical", ISLANDS), "bill_length_mm": ("numeric", None),
                     "flipper_length_mm": ("numeric", None), "sex": ("categorical", ["female", "male"])}
    assert not any("fill" in f for f in d["features"])  # the consortium states the fills
    assert any("'sex'" in t and "fill" in t for t in d["_todo"])
    # as drafted, missing cells have no fill: the check says so for each, in one run
    assert main(["data", "check", str(path), "--schema", str(tmp_path / "draft.json")]) == 1
    assert "gives this column no \"fill\"" in capsys.readouterr().out
    assert draft([path], "species", "animal", ignore=("year",)) == d


def test_simulate_predict_reads_a_pooled_table_through_the_schema(tmp_path, schema_file, capsys):
    rows = penguins(60)
    pooled = write_csv(tmp_path / "pooled.csv", [r + ["abc"[i % 3]] for i, r in enumerate(rows)], HEADER + ["site"])
    assert main(["simulate", "predict", "--data", str(pooled), "--schema", str(schema_file), "--bits", "64",
                 "--k", "5", "--no-baselines", "--quiet", "--json", str(tmp_path / "r.json")]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["n"] == 60 and r["sites"] == 3 and r["classes"] == 3


def test_many_problems_of_one_kind_are_counted_after_the_first_ones(tmp_path, schema_file, capsys):
    rows = penguins(40)
    for r in rows:
        r[2] = "Atlantis"
    path = write_csv(tmp_path / "a.csv", rows)
    assert main(["data", "check", str(path), "--schema", str(schema_file), "--max-per-column", "3"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[3] == (f"{path}: column 'island': 37 more category problem(s) like the above "
                                            "(lines 5–41); --all lists every one")
    assert main(["data", "check", str(path), "--schema", str(schema_file), "--all"]) == 1
    assert len(capsys.readouterr().out.splitlines()) == 40
