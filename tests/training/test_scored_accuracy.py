"""What a training job's accuracy measures (clients.trainer.eval_metrics, xclp.training.strategy.
scored_accuracy): the points a model did not train on where a site has a truth column, else the
labelled points it trained on — and the name says which."""

import numpy as np

from clients.trainer import eval_metrics
from xclp.training.strategy import SCORED_ON, scored_accuracy

X = np.arange(6.0)[:, None]  # each row's feature is its index
y = np.array([0, 1, -1, -1, -1, -1])  # two labelled rows, four unlabelled
y_true = np.array([0, 1, 1, 0, 1, -1])  # the last row has no truth either


def memoriser(X):
    """Right on the labelled rows it trained on, wrong on everything else."""
    return np.array([0, 1, 0, 1, 0, 0])[X[:, 0].astype(int)]


def test_with_a_truth_column_only_the_unlabelled_points_count():
    m = eval_metrics(X, y, y_true, memoriser)
    # training accuracy would say 100 %; the majority class of the scored truths (1, 0, 1) gets 2 right
    assert m == {"eval_n": 3, "eval_correct": 0, "eval_majority": 2, "eval_on": "unlabelled"}
    assert scored_accuracy({"a": m}) == (0.0, "accuracy on unlabelled points (truth column)")


def test_without_a_truth_column_it_is_a_training_accuracy_and_says_so():
    m = eval_metrics(X, y, None, memoriser)
    assert m == {"eval_n": 2, "eval_correct": 2, "eval_majority": 1, "eval_on": "labelled"}  # (labels 0, 1)
    assert scored_accuracy({"a": m}) == (1.0, "training accuracy on labelled points (no truth column)")


def test_sites_with_a_truth_column_decide_and_nothing_scored_says_nothing():
    held = eval_metrics(X, y, y_true, memoriser)
    own = eval_metrics(X, y, None, memoriser)
    assert scored_accuracy({"a": held, "b": own}) == (0.0, SCORED_ON["unlabelled"])  # b's training accuracy left out
    assert scored_accuracy({"a": {"eval_n": 0, "eval_correct": 0, "eval_on": "unlabelled"}}) == (None, None)
    assert scored_accuracy({}) == (None, None)
    # an agent of an earlier release sends counts without saying which points
    assert scored_accuracy({"a": {"eval_n": 4, "eval_correct": 3}}) == (0.75, "accuracy on the sites' own points")

