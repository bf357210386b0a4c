"""What a site measures of its own data and tells the coordinator: a model's score on its points (counts,
never points) and how good the pseudo-labels it trains on are. Every driver's sites measure with these:
the agent (clients/trainer.py), Flower's sites and the simulation's (xclp/training/simulation.py).
"""

from __future__ import annotations

import numpy as np


def eval_metrics(X: np.ndarray, y: np.ndarray, y_true: np.ndarray | None, predict, on: str | None = None) -> dict:
    """A model scored at the site: counts, never the points, and which points (`eval_on`).

    With a truth column the points are the unlabelled ones (the model never trained on their labels:
    an accuracy that says how it labels new points); with `on="held_out"`, `y_true` holds the labels of
    the points the site held out (xclp.training.holdout: their labels are −1 in `y`), scored alike;
    without either, the site knows labels only of the points it trains on, so it scores those and
    says so ("labelled": a training accuracy).
    xclp.training.strategy.scored_accuracy pools the counts and names the result."""
    if y_true is not None:
        on, truth, m = on or "unlabelled", y_true, (y < 0) & (y_true >= 0)
    else:
        on, truth, m = "labelled", y, y >= 0
    if not m.any():
        return {"eval_n": 0, "eval_correct": 0, "eval_on": on}
    # eval_majority: how many the most common class alone gets right — the bar a model must clear to
    # be more than a constant (xclp.training_job.collapsed)
    return {"eval_n": int(m.sum()), "eval_correct": int((predict(X[m].astype(np.float32)) == truth[m]).sum()),
            "eval_majority": int(np.bincount(truth[m].astype(np.int64)).max()), "eval_on": on}


def pseudo_metrics(y: np.ndarray, y_true: np.ndarray | None, labels: np.ndarray | None,
                   weights: np.ndarray | None) -> dict:
    """How many pseudo-labels a site trains on, and (where it knows the truth) how many are right."""
    out = {"n_labelled": int((y >= 0).sum())}
    if labels is None:
        return {**out, "n_pseudo": 0}
    use = (y < 0) & (labels >= 0) & (weights > 0)
    out["n_pseudo"] = int(use.sum())
    if y_true is not None:
        m = use & (y_true >= 0)
        out.update(pseudo_n=int(m.sum()), pseudo_correct=int((labels[m] == y_true[m]).sum()))
    return out
