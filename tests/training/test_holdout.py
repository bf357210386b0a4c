"""Held-out labelled points (xclp.training.holdout): a site without a truth column hides a seeded,
stratified share of its labelled points from training and scores the model on them; the simulation,
the agent's trainer (with the service's job parameters) and Flower's site hide the same points."""

from types import SimpleNamespace

import numpy as np
import pytest

from clients.trainer import Trainer, eval_metrics
from service.training_api import TrainJobCreate, training_params
from xclp.training.holdout import DEFAULT_HOLDOUT, held_out, training_labels
from xclp.training.options import TRAINING_OPTIONS
from xclp.training.runner import TrainConfig, prepare_files
from xclp.training.strategy import scored_accuracy

y = np.array([0] * 10 + [1] * 5 + [2] * 2 + [3] + [-1] * 7)


def test_a_stratified_seeded_share_at_least_one_per_class_never_its_last():
    m = held_out(y, 0.2, seed=0, site="a")
    assert [int(m[y == c].sum()) for c in range(4)] == [2, 1, 1, 0]  # 20 % of 10, ≥ 1 of 5 and of 2, not the lone 3
    assert not m[y < 0].any()
    assert (held_out(y, 0.2, seed=0, site="a") == m).all()  # the same points from the same (seed, site)
    others = [held_out(y, 0.2, seed=s, site=x) for s, x in ((1, "a"), (0, "b"))]
    assert all((o != m).any() for o in others)  # another seed or another site draws others
    assert not held_out(y, 0.0, seed=0, site="a").any()
    assert next(o for o in TRAINING_OPTIONS if o.name == "holdout").default == DEFAULT_HOLDOUT == 0.2


def test_held_out_labels_are_hidden_from_training_and_scored_and_named():
    held = training_labels(y, None, 0.2, seed=0, site="a")
    m = held_out(y, 0.2, seed=0, site="a")
    assert held.on == "held_out" and held.n_held_out == 4
    assert (held.y[m] == -1).all() and (held.y[~m] == y[~m]).all()  # the model never sees their labels
    assert (held.truth[m] == y[m]).all() and (held.truth[~m] == -1).all()
    X = np.arange(y.size, dtype=float)[:, None]

    def memoriser(Z):  # right on every label it trained on, wrong elsewhere
        train = held.y[Z[:, 0].astype(int)]
        return np.where(train >= 0, train, 9)

    metrics = eval_metrics(X, held.y, held.truth, memoriser, on=held.on)
    # a training accuracy would be 1.0; the held-out truths are 0, 0, 1, 2: the majority class gets 2 right
    assert sorted(held.truth[m]) == [0, 0, 1, 2]
    assert metrics == {"eval_n": 4, "eval_correct": 0, "eval_majority": 2, "eval_on": "held_out"}
    assert scored_accuracy({"a": metrics}) == (0.0, "accuracy on held-out labelled points (4 held out)")
    truth = training_labels(y, np.where(y < 0, 1, y), 0.2, seed=0, site="b")  # a truth column: nothing held out, its unlabelled scored
    both = eval_metrics(X, truth.y, truth.truth, memoriser, on=truth.on)
    acc, of = scored_accuracy({"a": metrics, "b": both})
    assert of.startswith("accuracy on points the model did not train on") and "4 held-out" in of
    assert training_labels(y, None, 0.0, seed=0, site="a").on == "labelled"  # --holdout 0: a training accuracy


def _csv(path, X, y, site=None):
    cols = [f"f{j}" for j in range(X.shape[1])]
    head = ",".join(cols + ["label"] + (["site"] if site is not None else []))
    rows = [",".join([*map(str, X[i]), str(y[i])] + ([site[i]] if site is not None else [])) for i in range(len(y))]
    path.write_text(head + "\n" + "\n".join(rows) + "\n")
    return path


def test_the_simulation_the_agent_and_flowers_site_hold_out_the_same_points(tmp_path):
    rng = np.random.default_rng(0)
    names = ["hospital-a", "hospital-b"]
    site = np.repeat(names, 30)
    X = rng.normal(size=(60, 3)).round(3)
    labels = np.where(rng.random(60) < 0.5, rng.integers(0, 3, 60), -1)
    _csv(tmp_path / "all.csv", X, labels, site)
    _csv(tmp_path / "test.csv", X[:6], np.abs(labels[:6]))
    sim, _, _, _ = prepare_files(TrainConfig(algorithm="fedavg", data=str(tmp_path / "all.csv"),
                                             test=str(tmp_path / "test.csv"), holdout=0.3, seed=7))
    status = {"params": training_params(TrainJobCreate(algorithm="fedavg", sites=names, classes=3, holdout=0.3,
                                                       seed=7), "j1")}
    for s in sim:
        mine = site == s.name
        agent = SimpleNamespace(api=None, site=s.name, X=X[mine], y=labels[mine], y_true=None)
        held = Trainer(agent).labels(status)
        assert held.on == "held_out" and held.n_held_out > 0
        assert (held.y == s.y).all() and (held.truth == s.y_true).all(), s.name
        flwr = pytest.importorskip("flwr.app", reason="Flower is the optional extra")
        from xclp_flower.client_app import FlowerSite

        _csv(tmp_path / f"{s.name}.csv", X[mine], labels[mine])
        node = {"trust-on-first-use": "true", "site": s.name, "data-path": str(tmp_path / f"{s.name}.csv"), "out": str(tmp_path / s.name)}
        for algorithm, same in (("fedavg", True), ("predict", False)):  # a prediction run hides nothing
            ctx = flwr.Context(run_id=1, node_id=0, node_config=node, state=flwr.RecordDict(),
                               run_config={"algorithm": algorithm, "holdout": 0.3, "seed": 7})
            f = FlowerSite(ctx)
            assert bool((f.y == s.y).all() and f.scored_on == "held_out") is same
            assert (f.file_labels == labels[mine]).all()
    # a job stored before holdouts (no "holdout" in its params) holds nothing out, as it did
    old = {"params": {k: v for k, v in status["params"].items() if k != "holdout"}}
    agent = SimpleNamespace(api=None, site=names[0], X=X[site == names[0]], y=labels[site == names[0]], y_true=None)
    assert Trainer(agent).labels(old).on == "labelled"
