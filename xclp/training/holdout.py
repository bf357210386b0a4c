"""Held-out labelled points: what a training job's accuracy is measured on at a site without a truth column.

A site knows the labels of the points it trains on and no others, unless its file has a truth column
(`y_true`, for scoring only). Without one, the only honest score of a model is on labelled points it
did not train on: before training, the site hides a seeded, stratified share of its labelled points
(`holdout`, default 20 %) — their labels become "unlabelled" for the whole run: never in a local
update, never a seed of an XCLP pseudo-labelling job, never in a vote — and at the end it scores the
model on them ("accuracy on held-out labelled points (N held out)").

Like a truth column's unlabelled points, a held-out point may still be seen by the run as an unlabelled
point (its features, with a pseudo-label where an algorithm gives one): the score is transductive, the
same kind as the truth column's, never a training accuracy.

The points depend only on (the labels, the share, the run's seed, the site's name), so the simulation,
the agent (clients/trainer.py) and Flower's site (xclp_flower/client_app.py) hold out the same points of
the same data. A site with a truth column holds nothing out: its unlabelled points are scored instead.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

DEFAULT_HOLDOUT = 0.2  # the share of each class's labelled points a site without a truth column holds out

# what the scored points are, by `TrainingLabels.on` (xclp.training.strategy.SCORED_ON names them)
UNLABELLED, HELD_OUT, LABELLED = "unlabelled", "held_out", "labelled"


@dataclass(frozen=True)
class TrainingLabels:
    """A site's labels for one training run: `y` what it trains on (−1: unlabelled, held-out points
    included), `truth` what it scores on (−1: not scored; None: nothing), `on` which points those are."""

    y: np.ndarray
    truth: np.ndarray | None
    on: str

    @property
    def n_held_out(self) -> int:
        return int((self.truth >= 0).sum()) if self.on == HELD_OUT else 0


def held_out(y: np.ndarray, share: float, *, seed: int, site: str) -> np.ndarray:
    """The mask of the labelled points to hold out: in each class, round(share · n_c) of its n_c labelled
    points, at least 1 where the class has 2 or more, and never its last one (a class the site holds
    stays a class it trains on). Drawn from (seed, site) alone."""
    y = np.asarray(y)
    mask = np.zeros(y.shape, dtype=bool)
    if share <= 0:
        return mask
    material = hashlib.sha256(f"xclp-holdout|{int(seed)}|{site}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(material[:8], "big"))
    for c in np.unique(y[y >= 0]):
        idx = np.flatnonzero(y == c)
        k = min(max(int(round(share * idx.size)), 1), idx.size - 1)
        if k > 0:
            mask[rng.choice(idx, k, replace=False)] = True
    return mask


def training_labels(y: np.ndarray, y_true: np.ndarray | None, share: float, *, seed: int,
                    site: str) -> TrainingLabels:
    """The site's labels for a training run with holdout share `share` (see the module's doc)."""
    y = np.asarray(y, dtype=np.int64)
    if y_true is not None:
        return TrainingLabels(y, np.asarray(y_true, dtype=np.int64), UNLABELLED)
    mask = held_out(y, share, seed=seed, site=site)
    if not mask.any():
        return TrainingLabels(y, None, LABELLED)  # nothing to hold out: a training accuracy, named so
    return TrainingLabels(np.where(mask, -1, y), np.where(mask, y, -1), HELD_OUT)

