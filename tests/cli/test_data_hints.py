"""A site's table read without a schema, as `xclp agent run --data FILE` reads it: each mistake one line
that says where and what to do — an inf (or nan) cell with its file, row and column; a semicolon-separated
"CSV" (a spreadsheet's in a decimal-comma locale) named as such; text in an ID-like column with
--id-column suggested."""

import pytest

from cli.main import main


def _agent(tmp_path, data, *extra) -> list[str]:
    return ["agent", "run", "--coordinator", "http://127.0.0.1:9", "--site", "a", "--token", "x" * 40, "--data",
            str(data), "--out", str(tmp_path / "out"), "--trust-on-first-use", *extra]


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("xclp:")]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("cell", ["inf", "-inf", "nan"])
def test_a_non_finite_cell_is_named_by_file_row_and_column(tmp_path, capsys, cell):
    data = tmp_path / "site.csv"
    data.write_text(f"patient_id,label,a,b\np1,0,1.0,2.0\np2,,2.5,3.0\np3,1,{cell},1.0\n")
    line = _error(capsys, _agent(tmp_path, data, "--id-column", "patient_id"))
    assert line.startswith(f"xclp: error: {data}: row 4, column 'a': '{cell}' is not a value a feature may take"), line


def test_a_semicolon_csv_is_named_as_such(tmp_path, capsys):
    data = tmp_path / "site.csv"
    data.write_text("patient_id;label;a;b\np1;0;1,0;2,0\np2;;1,5;3,0\n")
    line = _error(capsys, _agent(tmp_path, data, "--id-column", "patient_id"))
    assert "no label column 'label'" in line and "separated by semicolons, not commas" in line, line


def test_a_forgotten_id_column_gets_the_flag_suggested(tmp_path, capsys):
    data = tmp_path / "site.csv"
    data.write_text("patient_id,label,a,b\np1,0,1.0,2.0\np2,,1.5,3.0\n")
    line = _error(capsys, _agent(tmp_path, data))
    assert line.endswith("'p1' is not a number (a column of the rows' IDs? give --id-column patient_id; it is "
                         "carried into the results)"), line
    data.write_text("ward,label,a\nnorth,0,1.0\nsouth,,2.0\n")  # text that is no ID: the schema's categories
    assert "(text categories: encode them through the consortium's schema, --schema)" in _error(
        capsys, _agent(tmp_path, data))
