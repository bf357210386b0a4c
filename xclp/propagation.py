"""Labels in, scores out: the label matrix, the site's contribution and the final labels (steps 9–11).

Numerics of the authors' code (Scott, Yeo & Lampert, TMLR 2023, and its reference implementation): class-balanced Y; Z clipped at 0 and L1-normalised per
row; confidence ω = 1 − entropy/log C, divided by its maximum; labelled points keep their label
with weight 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xclp.data import UNLABELLED


def class_counts(y: np.ndarray, n_classes: int) -> np.ndarray:
    """Labelled points per class (the vector each site feeds into the secure sum)."""
    lab = y[y >= 0]
    if lab.size and lab.max() >= n_classes:
        raise ValueError(f"label {int(lab.max())} out of range for {n_classes} classes")
    return np.bincount(lab, minlength=n_classes).astype(np.int64)


def label_matrix(y_labelled: np.ndarray, global_counts: np.ndarray, balanced: bool = True) -> np.ndarray:
    """Y_L (l × C): one-hot rows, scaled by 1 / (global count of the class) when class-balanced."""
    C = global_counts.shape[0]
    Y = np.zeros((y_labelled.size, C))
    Y[np.arange(y_labelled.size), y_labelled] = 1.0
    if balanced:
        Y /= np.where(global_counts > 0, global_counts, 1)[None, :]
    return Y


def contribution(influence_cols: np.ndarray, y_labelled: np.ndarray, global_counts: np.ndarray,
                 balanced: bool = True) -> np.ndarray:
    """Z̄^(j) = S_L^(j) Y_L^(j) (n × C): this site's share of every point's scores."""
    return influence_cols @ label_matrix(y_labelled, global_counts, balanced)


@dataclass
class Prediction:
    labels: np.ndarray  # (m,) int; −1 for a point that no label reaches
    confidence: np.ndarray  # (m,) float in [0, 1]
    probabilities: np.ndarray  # (m, C) rows of Z clipped and L1-normalised (zero where unreached)


def predict_from_scores(Z: np.ndarray, y_known: np.ndarray | None = None) -> Prediction:
    """Labels and confidences from score rows Z (m × C).

    The maximum used to scale ω is taken over these rows only: a site computes it over its own
    points, since the global maximum would need every site's scores.
    """
    Z = np.clip(np.asarray(Z, dtype=np.float64), 0.0, None)
    C = Z.shape[1]
    total = Z.sum(axis=1, keepdims=True)
    reached = total[:, 0] > 0
    P = np.divide(Z, total, out=np.zeros_like(Z), where=total > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.sum(np.where(P > 0, P * np.log(P), 0.0), axis=1)
    w = np.where(reached, 1.0 - ent / np.log(C), 0.0)
    top = w.max() if w.size else 0.0
    w = w / top if top > 0 else w
    labels = np.where(reached, P.argmax(axis=1), UNLABELLED).astype(np.int64)
    if y_known is not None:
        known = y_known >= 0
        labels[known] = y_known[known]
        w[known] = 1.0
    return Prediction(labels=labels, confidence=w, probabilities=P)


def class_weights(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """c_w[c] = (N / C) / #{labels equal to c} (for training); 0 for a class nobody carries."""
    lab = labels[labels >= 0]
    counts = np.bincount(lab, minlength=n_classes).astype(np.float64)
    return np.divide(lab.size / n_classes, counts, out=np.zeros(n_classes), where=counts > 0)
