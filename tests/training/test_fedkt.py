"""FedKT (xclp/training/fedkt.py) and the discrete Laplace mechanism of its noisy votes: consistent
voting, no silent class 0, noise drawn once where its level says, the ledger's ε against
dp-accounting, budgets calibrated and refused, and the one-shot run end to end."""

import json
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy.stats import chisquare
from training_helpers import count_noise_draws

from cli.main import main
from xclp.privacy import discrete_laplace as dl
from xclp.privacy.ledger import SITE_LEVEL, DiscreteLaplaceEvent, PrivacyLedger, epsilon_of
from xclp.training import fedkt
from xclp.training.fedkt import FedKTConfig, FedKTStrategy, consistent_votes, server_labels
from xclp.training.runner import run_training

DELTA = 1e-5


def test_a_party_whose_students_disagree_is_not_counted():
    students = np.array([[1, 2, 3, 0], [1, 0, 3, 0]])  # s = 2 students of one party on 4 points
    assert consistent_votes(students).tolist() == [1, -1, 3, 0]
    # three parties, s = 2: on point 0 two consistent parties say 1 and one says 2 → 1; on point 1
    # the only party that voted 2 disagreed with itself (−1), the other two say 0 → 0, not 2
    votes = np.array([[1, -1, 4], [1, 0, -1], [2, 0, -1]])
    assert server_labels(votes, 5, partitions=2, gamma=None).tolist() == [1, 0, 4]


def test_an_empty_vote_is_never_a_silent_class_0():
    votes = np.full((3, 6), -1)  # no party consistent anywhere
    assert server_labels(votes, 4, partitions=2, gamma=None).tolist() == [-1] * 6
    # with noise the threshold is on the noisy counts: at γ = 30 the noise is 0 with probability
    # 1 − 2e^−30/(1 + e^−30), so no point of an empty vote reaches s/2
    assert server_labels(votes, 4, partitions=2, gamma=30.0, noise_key=b"k" * 32).tolist() == [-1] * 6


def test_discrete_laplace_noise_has_its_distribution_and_is_fresh():
    gamma = 0.7
    x = dl.sample((200_000,), gamma, key=b"d" * 32)
    q = math.exp(-gamma)
    ks = np.arange(-8, 9)
    pmf = (1 - q) / (1 + q) * q ** np.abs(ks)
    observed = np.array([(x == k).sum() for k in ks] + [(np.abs(x) > 8).sum()])
    expected = np.append(pmf, 1 - pmf.sum()) * x.size
    assert chisquare(observed, expected).pvalue > 1e-4
    assert np.array_equal(x[:100], dl.sample((200_000,), gamma, key=b"d" * 32)[:100])  # a key reproduces
    assert not np.array_equal(dl.sample((50,), gamma), dl.sample((50,), gamma))  # os.urandom otherwise
    with pytest.raises(ValueError, match="positive"):
        dl.sample((3,), 0.0)


def test_the_ledger_accounts_discrete_laplace_as_dp_accounting_does():
    gamma, k = 0.3, 40
    direct = pld_lib.from_discrete_laplace_mechanism(gamma, sensitivity=2, value_discretization_interval=1e-4)
    assert epsilon_of(DiscreteLaplaceEvent(gamma, 2), k, DELTA) == pytest.approx(
        direct.self_compose(k).get_epsilon_for_delta(DELTA), rel=1e-9)
    # one query is pure DP with ε = γ·Δ; k of them at most k·γ·Δ (and, at δ > 0, less)
    assert epsilon_of(DiscreteLaplaceEvent(gamma, 2), 1, DELTA) == pytest.approx(2 * gamma, abs=1e-3)
    assert epsilon_of(DiscreteLaplaceEvent(gamma, 2), k, DELTA) < k * 2 * gamma
    ledger = PrivacyLedger(DELTA, budget=5.0, neighbouring=SITE_LEVEL)
    ledger.spend("counts", DiscreteLaplaceEvent(gamma, 1), 10)
    again = PrivacyLedger.from_json(json.loads(json.dumps(ledger.to_json())))
    assert again.epsilon() == pytest.approx(ledger.epsilon()) and again.neighbouring == SITE_LEVEL


def test_gamma_from_a_budget_is_the_least_noise_within_it():
    g = dl.gamma_for_budget(2.0, DELTA, 100, 2)
    assert epsilon_of(dl.event(g, 2), 100, DELTA) <= 2.0
    assert epsilon_of(dl.event(g * 1.01, 2), 100, DELTA) > 2.0
    # a γ past the budget is refused before anything is released
    with pytest.raises(ValueError, match="past the budget"):
        FedKTStrategy(FedKTConfig(gamma=1.0, dp_epsilon=2.0).validate(), 10, 200)


@pytest.mark.parametrize("levels", ["L1", "L2"])
def test_noise_is_drawn_once_per_count_at_its_level(levels, monkeypatch):
    calls = count_noise_draws(monkeypatch)
    out = run_training({"algorithm": "fedkt", "dataset": "digits", "sites": 3, "labels": 600, "public_size": 120,
                        "levels": levels, "gamma": 0.5, "partitions": 2, "teachers": 3, "quiet": True})
    n_u1, n_u2, C = 60, 60, 10
    if levels == "L1":  # the server's counts once; no party adds any
        assert calls == [(n_u2, C)]
        assert out["privacy"]["neighbouring"] == SITE_LEVEL
        assert out["privacy"]["events"][0]["count"] == 2 * n_u2 and out["privacy"]["events"][0]["event"]["sensitivity"] == 2
    else:  # each party's teachers' counts, once per partition; nothing at the server
        assert calls == [(n_u1, C)] * (3 * 2)
        assert out["privacy"]["events"][0]["count"] == 2 * 2 * n_u1
    assert out["privacy"]["epsilon"] == pytest.approx(
        epsilon_of(dl.event(0.5, 2 if levels == "L1" else 1), out["privacy"]["events"][0]["count"], DELTA))


def test_fedkt_one_shot_run_with_baselines_and_the_command_line(tmp_path):
    out = run_training({"algorithm": "fedkt", "dataset": "digits", "sites": 4, "split": "dirichlet:0.5",
                        "labels": 1000, "public_size": 400, "baselines": True, "quiet": True})
    assert len(out["history"]) == 1 and out["privacy"]["epsilon"] is None and out["gamma"] is None
    row = out["history"][0]
    assert out["final_accuracy"] > 0.5 and row["labelled_queries"] > 0.8 and row["parties_voted"] == 4
    assert 0 < out["baselines"]["pate_central_accuracy"] <= 1 and len(out["baselines"]["solo_accuracy"]) == 4
    assert out["communication_bytes"]["votes_up"] > 0
    # the command line: ε in --json, and the algorithm's errors as exit code 2
    path = tmp_path / "kt.json"
    assert main(["simulate", "train", "--algorithm", "fedkt", "--dataset", "digits", "--sites", "3", "--labels", "600",
                 "--public-size", "120", "--teachers", "3", "--dp-epsilon", "20", "--quiet", "--json", str(path)]) == 0
    privacy = json.loads(path.read_text())["privacy"]
    assert 0 < privacy["epsilon"] <= 20 and privacy["accountant"].startswith("PLD")
    assert main(["simulate", "train", "--algorithm", "fedkt", "--gamma", "9", "--dp-epsilon", "1", "--quiet"]) == 2
    assert main(["simulate", "train", "--algorithm", "fedkt", "--model", "tree,mlp", "--quiet"]) == 2


def test_training_jobs_take_fedkt():
    from service.training_api import TrainJobCreate, training_params

    body = TrainJobCreate(algorithm="fedkt", sites=["a", "b"], classes=10, public_sha256="0" * 64, public_size=100, teachers=3,
                          levels="L2", gamma=1.0)
    params = training_params(body, "job")
    assert params["config"]["teachers"] == 3 and params["config"]["levels"] == "L2"
    assert fedkt.FedKTStrategy.family == "fedkt"
