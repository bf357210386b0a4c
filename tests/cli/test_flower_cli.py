"""`xclp flower run` / `xclp flower wait`: the exit status follows how the run ended, from the replies
of Flower's own CLI (captured from a real SuperLink: flwr_replies.json). A stand-in `flwr` script
plays those replies back, so the whole command runs without a SuperLink (the real one is
tests/flower/test_flower_deployment_fedct.py's failed-run test)."""

import json
import sys
from pathlib import Path

import pytest

import cli.flower
from cli.flower import FlowerError, outcome, parse_reply, run_status
from cli.main import main

REPLIES = json.loads((Path(__file__).with_name("flwr_replies.json")).read_text())
RUN_ID = REPLIES["run"]["run-id"]


def test_status_and_outcome_of_the_captured_runs():
    assert run_status(REPLIES["ls_starting"], RUN_ID)[0] == "starting"
    assert outcome(*run_status(REPLIES["ls_starting"], RUN_ID), RUN_ID) is None
    assert outcome(*run_status(REPLIES["ls_running"], RUN_ID), RUN_ID) is None
    assert outcome(*run_status(REPLIES["ls_completed"], RUN_ID), RUN_ID)[0] == 0
    code, line = outcome(*run_status(REPLIES["ls_failed"], RUN_ID), RUN_ID)
    assert code == 1 and "\n" not in line
    assert line.endswith("finished:failed: ServerApp failed with exception: xclp: the run failed: "
                         "n_classes must be at least 2, got 1")
    assert outcome("finished:stopped", "", "7") == (1, "xclp: run 7 finished:stopped: Flower gave no reason")


@pytest.mark.parametrize("stdout, says", [
    (json.dumps(REPLIES["ls_unreachable"]), "flwr ls: Connection to the SuperLink is unavailable."),
    (json.dumps(REPLIES["ls_unknown_run"]), "flwr ls: [code: 16] Run ID not found."),
    ("Traceback (most recent call last):\n  boom", "flwr ls: not Flower's JSON reply:   boom"),
    ("", "flwr ls: not Flower's JSON reply: nothing"),
    ('{"success": true, "runs": "x"}', "flwr ls: no list of runs"),
    ('{"success": true, "runs": []}', f"flwr ls: the SuperLink has no run {RUN_ID}"),
])
def test_flowers_errors_and_bad_json_become_one_line(stdout, says):
    with pytest.raises(FlowerError) as e:
        run_status(parse_reply(stdout, "flwr ls"), RUN_ID)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def fake_flwr(tmp_path, monkeypatch, ls_replies, run_reply=None) -> Path:
    """A `flwr` that prints `run_reply` for `run` and the next of `ls_replies` for each `ls` (the last
    one again once they are used up); it records its arguments in calls.txt."""
    (tmp_path / "replies.json").write_text(json.dumps({"run": run_reply or REPLIES["run"], "ls": ls_replies}))
    script = tmp_path / "flwr"
    script.write_text(f"""#!{sys.executable}
import json, sys
from pathlib import Path
here = Path({str(tmp_path)!r})
r = json.loads((here / "replies.json").read_text())
calls = here / "calls.txt"
with calls.open("a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "run":
    print(json.dumps(r["run"]))
else:
    ls_seen = [c for c in (calls.read_text().splitlines()) if c.startswith("ls")]
    print(json.dumps(r["ls"][min(len(ls_seen), len(r["ls"])) - 1]))
""")
    script.chmod(0o755)
    monkeypatch.setattr(cli.flower, "flwr_binary", lambda: str(script))
    return tmp_path / "calls.txt"


def test_flower_run_follows_a_failing_run_to_exit_1_with_its_reason(tmp_path, monkeypatch, capsys):
    calls = fake_flwr(tmp_path, monkeypatch, [REPLIES["ls_starting"], REPLIES["ls_failed"]])
    code = main(["flower", "run", "examples/flower-xclp", "local", "-c", "classes=1", "-c", "nodes=2",
                 "--poll", "0.01"])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert calls.read_text().splitlines() == [
        "run examples/flower-xclp local --run-config classes=1 --run-config nodes=2 --format json",
        f"ls local --run-id {RUN_ID} --format json", f"ls local --run-id {RUN_ID} --format json"]
    assert f"run {RUN_ID}: starting" in err and f"run {RUN_ID}: finished:failed" in err  # progress lines
    assert err.strip().splitlines()[-1] == (f"xclp: run {RUN_ID} finished:failed: ServerApp failed with exception: "
                                            "xclp: the run failed: n_classes must be at least 2, got 1")
    assert out == ""


def test_flower_run_exits_0_when_the_run_completed(tmp_path, monkeypatch, capsys):
    fake_flwr(tmp_path, monkeypatch, [REPLIES["ls_starting"], REPLIES["ls_running"], REPLIES["ls_completed"]])
    assert main(["flower", "run", "app", "local", "--poll", "0.01"]) == 0
    assert capsys.readouterr().out == f"run {RUN_ID}: finished:completed\n"


def test_flower_wait_and_its_usage_and_connection_errors(tmp_path, monkeypatch, capsys):
    fake_flwr(tmp_path, monkeypatch, [REPLIES["ls_failed"]])
    assert main(["flower", "wait", RUN_ID, "local"]) == 1
    (tmp_path / "x").mkdir()
    fake_flwr(tmp_path / "x", monkeypatch, [REPLIES["ls_unreachable"]])
    capsys.readouterr()
    assert main(["flower", "wait", RUN_ID, "local"]) == 2
    assert capsys.readouterr().err == "xclp: flwr ls: Connection to the SuperLink is unavailable. Please check your " \
                                      "network connection and 'address' in the SuperLink connection configuration.\n"
    # a SuperLink that refuses the run: `flwr run` says why, nothing is followed
    (tmp_path / "y").mkdir()
    calls = fake_flwr(tmp_path / "y", monkeypatch, [], run_reply={"success": False, "error-message": "\nFailed to "
                      "load Flower App configuration in '/nope/pyproject.toml'. File may be missing or invalid."})
    assert main(["flower", "run", "/nope", "local"]) == 2
    assert capsys.readouterr().err.startswith("xclp: flwr run: Failed to load Flower App configuration")
    assert len(calls.read_text().splitlines()) == 1


def test_timeout_and_ctrl_c_leave_the_run_at_the_superlink(tmp_path, monkeypatch, capsys):
    fake_flwr(tmp_path, monkeypatch, [REPLIES["ls_starting"]])
    assert main(["flower", "wait", RUN_ID, "local", "--timeout", "0.01", "--poll", "0.01"]) == 3
    assert "still starting after 0.01 s (it goes on at the SuperLink)" in capsys.readouterr().err

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli.flower.time, "sleep", interrupted)
    assert main(["flower", "wait", RUN_ID, "local"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"xclp: stopped following run {RUN_ID}; it goes on at the SuperLink"), err


def test_without_flower_installed_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(cli.flower.importlib.util, "find_spec", lambda name: None)
    assert main(["flower", "run", "app", "local"]) == 2
    assert capsys.readouterr().err == ("xclp: Flower is not installed (it is the optional extra: "
                                       "pip install -e '.[flower]')\n")
