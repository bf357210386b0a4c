"""`xclp job submit`: no silent class count, and the predict job's label-DP budget from the command line."""

import pytest

import cli.main as cli_main

COORD = ["--coordinator", "http://127.0.0.1:9", "--admin-token=" + "a" * 32, "--sites", "p,q"]


class FakeAdmin:
    def __init__(self):
        self.sent = {}

    def submit_job(self, **body):
        self.sent = body
        return "job1"

    def submit_train(self, **body):
        self.sent = body
        return "job2"


@pytest.fixture
def admin(monkeypatch):
    fake = FakeAdmin()
    monkeypatch.setattr(cli_main, "_admin", lambda args: fake)
    return fake


@pytest.mark.parametrize("kind", ["predict", "train"])
def test_a_job_needs_its_number_of_classes(admin, capsys, kind):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["job", "submit", kind, *COORD])
    assert exc.value.code == 2 and "--classes" in capsys.readouterr().err and not admin.sent
    assert cli_main.main(["job", "submit", kind, *COORD, "--classes", "3"]) == 0
    assert admin.sent["classes"] == 3


def test_a_predict_job_takes_a_label_dp_budget(admin):
    assert cli_main.main(["job", "submit", "predict", *COORD, "--classes", "2"]) == 0
    assert not {"dp_epsilon", "dp_delta", "label_dp", "dp_clip"} & set(admin.sent)  # exact sums
    assert cli_main.main(["job", "submit", "predict", *COORD, "--classes", "2", "--dp-epsilon", "2",
                          "--label-dp", "gaussian", "--dp-delta", "1e-6"]) == 0
    assert {k: admin.sent[k] for k in ("dp_epsilon", "dp_delta", "label_dp", "dp_clip")} == {
        "dp_epsilon": 2.0, "dp_delta": 1e-6, "label_dp": "gaussian", "dp_clip": 1.0}


def test_a_bad_budget_is_one_usage_line(admin, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["job", "submit", "predict", *COORD, "--classes", "2", "--dp-epsilon", "-1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--dp-epsilon" in err and "Traceback" not in err


def test_a_predict_job_takes_the_graph(admin):
    assert cli_main.main(["job", "submit", "predict", *COORD, "--classes", "2"]) == 0
    assert admin.sent["graph"] == "exact"  # the default: every pair
    assert cli_main.main(["job", "submit", "predict", *COORD, "--classes", "2", "--graph", "blocked",
                          "--max-bucket", "16", "--influence-rank", "0"]) == 0
    assert {k: admin.sent[k] for k in ("graph", "max_bucket", "influence_rank")} == {
        "graph": "blocked", "max_bucket": 16, "influence_rank": 0}


def test_simulate_predict_runs_a_blocked_graph(tmp_path):
    out = tmp_path / "r.json"
    assert cli_main.main(["simulate", "predict", "--dataset", "digits", "--limit", "150", "--sites", "3", "--bits", "64",
                          "--k", "5", "--graph", "blocked", "--blocking-tables", "8", "--max-bucket", "8",
                          "--influence-rank", "0", "--no-baselines", "--quiet", "--json", str(out)]) == 0
    import json

    got = json.loads(out.read_text())
    assert got["graph"] == "blocked" and got["solver"] == "push+spectral"
