"""A scikit-learn-style estimator for one party: XCLP's numerics without the federation.

    >>> model = XCLPLabelSpreading(k=10, alpha=0.99).fit(X, y)   # y = −1 for unlabelled
    >>> model.transduction_, model.label_distributions_, model.confidence_

Like sklearn's LabelSpreading: parameters in __init__, validated in fit, results in attributes
with a trailing underscore; labels may be any integers (−1 marks unlabelled).
"""

from __future__ import annotations

import numpy as np

from xclp import graph as graphs
from xclp.baselines import build_graph
from xclp.data import DataError, validate_features, validate_labels
from xclp.influence import propagate
from xclp.lsh import l2_normalise
from xclp.propagation import class_counts, label_matrix, predict_from_scores


class XCLPLabelSpreading:
    def __init__(self, k: int = 10, alpha: float = 0.99, power: float = 3.0, similarity: str = "exact",
                 bits: int = 4096, seed: int = 0, balanced: bool = True, solver: str = "auto", tol: float = 1e-8):
        self.k, self.alpha, self.power, self.similarity = k, alpha, power, similarity
        self.bits, self.seed, self.balanced, self.solver, self.tol = bits, seed, balanced, solver, tol

    def get_params(self, deep: bool = True) -> dict:
        return {k: getattr(self, k) for k in ("k", "alpha", "power", "similarity", "bits", "seed", "balanced",
                                               "solver", "tol")}

    def set_params(self, **params) -> XCLPLabelSpreading:
        for k, v in params.items():
            if k not in self.get_params():
                raise ValueError(f"unknown parameter {k!r}")
            setattr(self, k, v)
        return self

    def _validate(self) -> None:
        if int(self.k) < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.similarity not in ("exact", "lsh"):
            raise ValueError(f"similarity must be 'exact' or 'lsh', got {self.similarity!r}")

    def fit(self, X, y) -> XCLPLabelSpreading:
        self._validate()
        X = validate_features(X)
        y = validate_labels(y, X.shape[0])
        labelled = y >= 0
        if not labelled.any():
            raise DataError("fit needs at least one labelled point (y ≥ 0)")
        self.classes_ = np.unique(y[labelled])
        if self.classes_.size < 2:
            raise DataError("fit needs labelled points of at least two classes")
        yi = np.full(y.shape, -1)
        yi[labelled] = np.searchsorted(self.classes_, y[labelled])
        C = self.classes_.size
        seed = np.random.default_rng(self.seed).bytes(32)
        n = X.shape[0]
        W = build_graph(X, min(int(self.k), n - 1), self.power, self.similarity, self.bits, seed)
        Y = np.zeros((n, C))
        Y[labelled] = label_matrix(yi[labelled], class_counts(yi, C), self.balanced)
        Z, info = propagate(W, Y, self.alpha, self.solver, self.tol)
        pred = predict_from_scores(Z, yi)
        self.X_ = l2_normalise(X)
        self.label_distributions_ = pred.probabilities
        self.label_distributions_[labelled] = np.eye(C)[yi[labelled]]
        self.transduction_ = np.where(pred.labels >= 0, self.classes_[np.maximum(pred.labels, 0)], -1)
        self.confidence_ = pred.confidence
        self.solver_ = info.method
        return self

    def predict_proba(self, X) -> np.ndarray:
        """New points: their k nearest training points' distributions, weighted like graph edges."""
        if not hasattr(self, "X_"):
            raise RuntimeError("call fit before predict")
        Xn = l2_normalise(validate_features(X))
        sim = Xn @ self.X_.T
        k = min(int(self.k), self.X_.shape[0])
        nn = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        w = np.clip(graphs.edge_weight(np.take_along_axis(sim, nn, axis=1), self.power), 0, None)
        P = np.einsum("ik,ikc->ic", w, self.label_distributions_[nn])
        total = P.sum(axis=1, keepdims=True)
        return np.divide(P, total, out=np.full_like(P, 1.0 / P.shape[1]), where=total > 0)

    def predict(self, X) -> np.ndarray:
        proba = self.predict_proba(X)  # raises before fit
        return self.classes_[proba.argmax(axis=1)]

    def score(self, X, y) -> float:
        return float(np.mean(self.predict(X) == np.asarray(y)))
