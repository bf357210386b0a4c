"""`xclp job wait`'s progress: phases for prediction jobs, rounds for training jobs, in a terminal or not."""

import sys

import pytest

from cli.progress import wait_for_job


class FakeClient:
    def __init__(self, statuses):
        self.statuses, self.i = statuses, 0

    def job(self, job_id):
        st = self.statuses[min(self.i, len(self.statuses) - 1)]
        self.i += 1
        return st


def train_status(status, phase, rnd, done):
    return {"job": "t", "kind": "train", "status": status, "phase": phase, "attempt": 0, "round": rnd,
            "dropped": {}, "failure": None,
            "progress": {"phase": phase, "round": rnd, "rounds": 3, "rounds_done": done, "received": 0, "expected": 2}}


def predict_status(status, phase):
    return {"job": "p", "kind": "predict", "status": status, "phase": phase, "attempt": 0, "round": 0,
            "dropped": {}, "failure": None, "progress": {"received": 1, "expected": 3}}


TRAIN = [train_status("running", "setup", 0, 0), train_status("running", "round", 1, 0),
         train_status("running", "round", 2, 1), train_status("running", "evaluate", 3, 3),
         train_status("done", "done", 3, 3)]
PREDICT = [predict_status("running", "setup"), predict_status("running", "hamming"), predict_status("done", "done")]


@pytest.mark.parametrize("tty", [False, True])
@pytest.mark.parametrize("statuses", [TRAIN, PREDICT], ids=["train", "predict"])
def test_wait_follows_rounds_and_phases(statuses, tty, monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    st = wait_for_job(FakeClient(statuses), "j", timeout=10, interval=0)
    assert st["status"] == "done"
    err = capsys.readouterr().err
    if statuses is TRAIN:
        assert ("3/3 rounds" in err) if tty else ("phase round (round 2)" in err)
    else:
        assert ("5/5 phases" in err) if tty else ("phase hamming (attempt 0)" in err)


def test_wait_gives_up_at_the_timeout():
    assert wait_for_job(FakeClient([TRAIN[1]]), "j", timeout=0.05, interval=0.01, quiet=True) is None
