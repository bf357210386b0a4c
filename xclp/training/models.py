"""Models for the training loops: torch networks θ = (φ, ψ) and a registry of per-site learners.

- `build_network` makes `MLP` or `SmallCNN` (xclp.training.networks), split into a feature extractor φ
  (`embed(x)`, the d-dimensional embedding that XCLP builds its graph on) and a classifier head ψ
  (`head`); `forward(x) = head(embed(x))`.
- `TorchClassifier` wraps either network in the scikit-learn shape (fit / partial_fit / predict /
  predict_proba) for FedCT, where a site may run any learner.
- `make_learner(name, ...)` builds "tree", "forest", "boosting", "logreg", "mlp" or "cnn";
  `accepts_sample_weight(learner)` says whether its fit takes `sample_weight` (the loops pass the
  XCLP confidences only to those that do).

torch is imported where a network is built, run or trained, not with this module: importing it costs
~2 CPU-s, and every training driver imports this module (through the strategies) while a run of
scikit-learn learners (FedCT's trees) never needs torch — a Flower site runs each message in a process
of its own, which paid that import at every message.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import numpy as np

from xclp.training.options import LEARNERS

if TYPE_CHECKING:
    import torch
    from torch import nn

TORCH_LEARNERS = ("mlp", "cnn")


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run with `n` torch intra-op threads, then restore. Small models on a shared 2-core machine run
    tens of times faster on one thread than on two contended ones."""
    import torch

    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def build_network(arch: str, n_features: int, n_classes: int, seed: int = 0, **kw) -> nn.Module:
    """A freshly initialised network; the seed fixes the initial weights."""
    import torch

    from xclp.training.networks import MLP, SmallCNN

    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed % (1 << 64))  # (torch takes 64 bits; a run's seed × 1000 + site may pass them)
    try:
        if arch == "mlp":
            return MLP(n_features, n_classes, **kw)
        if arch == "cnn":
            return SmallCNN(n_features, n_classes, **kw)
    finally:
        torch.random.set_rng_state(gen_state)
    raise ValueError(f"unknown network {arch!r}; choose 'mlp' or 'cnn'")


def embed_array(model: nn.Module, X: np.ndarray, batch: int = 4096) -> np.ndarray:
    """φ(X) as a float64 array (n × d), in eval mode."""
    import torch

    model.eval()
    with torch.no_grad():
        out = [model.embed(torch.as_tensor(X[s:s + batch], dtype=torch.float32)).numpy()
               for s in range(0, len(X), batch)]
    return np.concatenate(out).astype(np.float64) if out else np.zeros((0, model.embed_dim))


def predict_proba_array(model: nn.Module, X: np.ndarray, batch: int = 4096) -> np.ndarray:
    import torch
    from torch.nn import functional as F

    model.eval()
    with torch.no_grad():
        out = [F.softmax(model(torch.as_tensor(X[s:s + batch], dtype=torch.float32)), dim=1).numpy()
               for s in range(0, len(X), batch)]
    return np.concatenate(out).astype(np.float64) if out else np.zeros((0, model.n_classes))


def weighted_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, point_weights: torch.Tensor,
                           class_weights: torch.Tensor | None = None) -> torch.Tensor:
    """mean_i ω_i · c_w[y_i] · CE(logits_i, y_i)  (the XCLP paper's confidence-weighted loss)."""
    from torch.nn import functional as F

    per = F.cross_entropy(logits, targets, reduction="none") * point_weights
    if class_weights is not None:
        per = per * class_weights[targets]
    return per.mean()


# --- scikit-learn style learners -----------------------------------------------------------------

class TorchClassifier:
    """A torch network as a scikit-learn style learner (FedCT's iterative local learner).

    `fit` trains `epochs` passes from the current weights when `warm_start` (FedCT: iterative
    learners continue), else from a fresh initialisation; `partial_fit(..., steps=b)` runs b
    optimiser steps. Parameters follow FedCT: Adam, lr 1e-3, batch 64.
    """

    def __init__(self, arch: str = "mlp", n_features: int = 784, n_classes: int = 10, lr: float = 1e-3,
                 batch_size: int = 64, epochs: int = 1, weight_decay: float = 0.0, warm_start: bool = True,
                 seed: int = 0, **net_kw):
        self.arch, self.n_features, self.n_classes = arch, n_features, n_classes
        self.lr, self.batch_size, self.epochs, self.weight_decay = lr, batch_size, epochs, weight_decay
        self.warm_start, self.seed, self.net_kw = warm_start, seed, net_kw
        self.model_ = None
        self.optimizer_ = None
        self.rng_ = np.random.default_rng(seed)
        self.classes_ = np.arange(n_classes)

    def _init(self) -> None:
        import torch

        self.model_ = build_network(self.arch, self.n_features, self.n_classes, self.seed, **self.net_kw)
        self.optimizer_ = torch.optim.Adam(self.model_.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def partial_fit(self, X, y, sample_weight=None, steps: int = 1) -> TorchClassifier:
        import torch

        if self.model_ is None:
            self._init()
        X = np.asarray(X, dtype=np.float32)
        y = np.asarray(y, dtype=np.int64)
        w = np.ones(len(y), dtype=np.float32) if sample_weight is None else np.asarray(sample_weight, dtype=np.float32)
        if len(y) == 0:
            return self
        self.model_.train()
        for _ in range(steps):
            idx = self.rng_.choice(len(y), size=min(self.batch_size, len(y)), replace=False)
            loss = weighted_cross_entropy(self.model_(torch.from_numpy(X[idx])), torch.from_numpy(y[idx]),
                                          torch.from_numpy(w[idx]))
            self.optimizer_.zero_grad()
            loss.backward()
            self.optimizer_.step()
        return self

    def partial_fit_mixed(self, private, pseudo, steps: int, private_batch: int, pseudo_batch: int) -> TorchClassifier:
        """`steps` optimiser steps, each on one private batch plus one pseudo-labelled batch.

        `private` and `pseudo` are (X, y, sample_weight) triples; FedCT's authors use 64 + 64.
        """
        import torch

        if self.model_ is None:
            self._init()
        parts = [(np.asarray(X, dtype=np.float32), np.asarray(y, dtype=np.int64), np.asarray(w, dtype=np.float32), b)
                 for (X, y, w), b in ((private, private_batch), (pseudo, pseudo_batch)) if len(y) and b > 0]
        if not parts:
            return self
        self.model_.train()
        for _ in range(steps):
            xs, ys, ws = [], [], []
            for X, y, w, b in parts:
                idx = self.rng_.choice(len(y), size=min(b, len(y)), replace=False)
                xs.append(X[idx]), ys.append(y[idx]), ws.append(w[idx])
            loss = weighted_cross_entropy(self.model_(torch.from_numpy(np.concatenate(xs))),
                                          torch.from_numpy(np.concatenate(ys)), torch.from_numpy(np.concatenate(ws)))
            self.optimizer_.zero_grad()
            loss.backward()
            self.optimizer_.step()
        return self

    def fit(self, X, y, sample_weight=None) -> TorchClassifier:
        if self.model_ is None or not self.warm_start:
            self._init()
        steps = self.epochs * max(1, math.ceil(len(y) / self.batch_size))
        return self.partial_fit(X, y, sample_weight, steps)

    def predict_proba(self, X) -> np.ndarray:
        if self.model_ is None:
            raise RuntimeError("predict before fit")
        return predict_proba_array(self.model_, np.asarray(X, dtype=np.float32))

    def predict(self, X) -> np.ndarray:
        return self.predict_proba(X).argmax(axis=1)

    def n_parameters(self) -> int:
        if self.model_ is None:
            self._init()
        return sum(p.numel() for p in self.model_.parameters())


class SklearnLearner:
    """A scikit-learn classifier that also copes with a training set of a single class.

    (LogisticRegression and gradient boosting refuse one class; a site with few labels can have one.)
    """

    def __init__(self, estimator):
        self.estimator = estimator
        self.constant_ = None

    def fit(self, X, y, sample_weight=None) -> SklearnLearner:
        y = np.asarray(y)
        if np.unique(y).size < 2:
            self.constant_ = int(y[0]) if y.size else 0
            return self
        self.constant_ = None
        if sample_weight is not None and accepts_sample_weight(self.estimator):
            self.estimator.fit(X, y, sample_weight=sample_weight)
        else:
            self.estimator.fit(X, y)
        return self

    def predict(self, X) -> np.ndarray:
        if self.constant_ is not None:
            return np.full(len(X), self.constant_, dtype=np.int64)
        return self.estimator.predict(X).astype(np.int64)


def accepts_sample_weight(learner) -> bool:
    """Whether the learner's fit takes per-sample weights (the XCLP confidences)."""
    from sklearn.utils.validation import has_fit_parameter

    if isinstance(learner, (TorchClassifier,)):
        return True
    if isinstance(learner, SklearnLearner):
        return accepts_sample_weight(learner.estimator)
    return has_fit_parameter(learner, "sample_weight")


def make_learner(name: str, n_features: int, n_classes: int, seed: int = 0, **kw):
    """A fresh learner by name: tree, forest, boosting, logreg (scikit-learn), mlp, cnn (torch)."""
    if name in TORCH_LEARNERS:
        return TorchClassifier(name, n_features, n_classes, seed=seed, **kw)
    seed %= 1 << 32  # scikit-learn's random_state is 32 bits; smaller seeds are unchanged
    if name == "tree":
        from sklearn.tree import DecisionTreeClassifier

        return SklearnLearner(DecisionTreeClassifier(random_state=seed, **kw))
    if name == "forest":
        from sklearn.ensemble import RandomForestClassifier

        return SklearnLearner(RandomForestClassifier(n_estimators=kw.pop("n_estimators", 100), random_state=seed,
                                                     n_jobs=kw.pop("n_jobs", 1), **kw))
    if name == "boosting":
        from sklearn.ensemble import HistGradientBoostingClassifier

        return SklearnLearner(HistGradientBoostingClassifier(max_iter=kw.pop("max_iter", 100), random_state=seed, **kw))
    if name == "logreg":
        from sklearn.linear_model import LogisticRegression

        return SklearnLearner(LogisticRegression(max_iter=kw.pop("max_iter", 200), **kw))
    raise ValueError(f"unknown learner {name!r}; choose one of {LEARNERS}")
