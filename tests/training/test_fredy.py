"""FREDY (xclp/training/fredy.py): FedAvg teachers, one noisy vote, a student; its accounting."""

import numpy as np
import pytest
from training_helpers import count_noise_draws

from cli.main import main
from xclp.privacy import discrete_laplace as dl
from xclp.privacy.ledger import NEIGHBOURING, epsilon_of
from xclp.training.fredy import FREDYConfig, FREDYStrategy
from xclp.training.runner import run_training
from xclp.training.strategy import Roster

SMALL = {"algorithm": "fredy", "dataset": "digits", "sites": 3, "labels": 300, "public_size": 200, "queries": 120,
         "rounds": 2, "local_epochs": 2, "quiet": True}


def test_fedavg_teachers_then_one_vote_and_a_student():
    out = run_training(SMALL)
    h = out["history"]
    assert [r["round"] for r in h] == [1, 2, 3] and h[-1]["stage"] == "vote" and h[-1]["teachers"] == 3
    assert out["final_accuracy"] > 0.5 and out["fedavg_accuracy"] > 0.2  # the student learns from the votes
    assert h[-1]["labelled_queries"] == 1.0 and out["privacy"]["epsilon"] is None and out["gamma"] is None
    assert out["communication_bytes"]["votes_up"] > 0 and out["communication_bytes"]["fedavg_model_bytes"] > 0


def test_noise_once_at_the_server_accounted_with_every_teacher_as_sensitivity(monkeypatch):
    calls = count_noise_draws(monkeypatch)
    out = run_training({**SMALL, "gamma": 2.0})
    assert calls == [(120, 10)]  # one draw for every count of every query, at the server
    (event,) = out["privacy"]["events"]
    assert event["count"] == 2 * 120 and event["event"]["sensitivity"] == 3  # all 3 teachers may move
    assert out["privacy"]["neighbouring"] == NEIGHBOURING
    assert out["privacy"]["epsilon"] == pytest.approx(epsilon_of(dl.event(2.0, 3), 240, 1e-5))


def test_budgets_and_empty_votes():
    s = FREDYStrategy(FREDYConfig(dp_epsilon=50.0).validate(), 10, n_public=100, n_sites=4)
    assert epsilon_of(dl.event(s.gamma, 4), 200, 1e-5) <= 50.0
    with pytest.raises(ValueError, match="past the budget"):
        FREDYStrategy(FREDYConfig(gamma=3.0, dp_epsilon=1.0).validate(), 10, n_public=100, n_sites=4)
    plan = s.configure_round(1, Roster(["a", "b"], ["a", "b"], []))
    assert s.aggregate(1, plan, [], None).tolist() == [-1] * 100  # no teacher: no label, never class 0
    # (digits and 20 queries: the refusal needs no large public set, whose accounting alone took seconds)
    assert main(["simulate", "train", "--algorithm", "fredy", "--dataset", "digits", "--queries", "20",
                 "--gamma", "5", "--dp-epsilon", "1", "--quiet"]) == 2
    assert main(["simulate", "train", "--algorithm", "fredy", "--model", "tree", "--quiet"]) == 2
    assert np.all(s.aggregate(1, plan, [np.zeros(100, dtype=np.int64)] * 4, None) >= -1)
