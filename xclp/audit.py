"""`xclp audit`: a membership-inference audit of the model(s) a training run releases.

The attacker holds a released model and a candidate point (x, y) and guesses whether (x, y) was one
of the sites' training examples. Members: every site's labelled training points. Non-members: test
points, from the same distribution, never trained on (as many as there are members, at most all of
the test set). Reported, as the FedCT paper's VUL: the ROC AUC of the attack's scores (0.5: no
leakage), and its TPR at 1 % and 0.1 % FPR (Carlini et al. 2022: the low-FPR regime is what matters).

Two attacks:
- "loss" (Yeom et al. 2018): score = log p_model(y | x), the negative loss: members fit better.
- "lira" (LiRA offline, Carlini et al. 2022, their fixed-variance variant for few shadows): K shadow
  runs of the same algorithm, same settings, on points of the training pool that the target never
  saw (so every candidate is OUT of every shadow); per candidate, φ = logit of the model's
  confidence in y; score = (φ_target − mean of φ over the shadows) / σ, σ pooled over all candidates.
  It calibrates away how easy each point is, which the loss attack cannot.

What is audited (`target`):
- "model" (the default): FedAvg — the global model; FedCT — each site's model, against that site's
  members (the non-members shared), pooled; FedKT — the final model; FREDY — the student.
- "labels": the labels a run shares on public points — FedCT's last consensus on U (every site
  receives it), FedKT's server labels of U2, FREDY's labels of the queries. The attacker rebuilds
  the best model it can from them alone, a k-nearest-neighbour classifier over the labelled public
  points (`LabelProxy`), and attacks that, against every site's labelled points; with LiRA, the
  shadow runs' labels are rebuilt the same way. A proxy is a lower bound on what an optimal attack
  on the labels finds; whatever it finds, the labels do leak.
XCLP's scores stay at the site that owns the points and are not a target: what they reveal about the
other sites' labels is bounded by label-DP (xclp/privacy/label_dp.py), not measured here.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from xclp.data import DataError
from xclp.training.runner import TrainConfig, load_train_test, pool_indices, prepare, train

ATTACKS = ("loss", "lira")
TARGETS = ("model", "labels")
EPS = 1e-12
PROXY_NEIGHBOURS = 5


class LabelProxy:
    """What an attacker rebuilds from released labels alone: k-NN over the labelled public points,
    probabilities over all C classes (a class absent from the labels gets 0)."""

    def __init__(self, X: np.ndarray, labels: np.ndarray, n_classes: int, k: int = PROXY_NEIGHBOURS):
        from sklearn.neighbors import KNeighborsClassifier

        keep = np.asarray(labels) >= 0
        if not keep.any():
            raise DataError("the run released no label on its public points: nothing to audit")
        self.n_classes = n_classes
        self.knn = KNeighborsClassifier(n_neighbors=min(k, int(keep.sum()))).fit(X[keep], labels[keep])

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        out = np.zeros((len(X), self.n_classes))
        out[:, self.knn.classes_.astype(int)] = self.knn.predict_proba(X)
        return out


def proba(model, X: np.ndarray, n_classes: int) -> np.ndarray:
    """(n × C) class probabilities of any released model: a torch network, a TorchClassifier, or a
    scikit-learn learner (whose classes may be a subset of 0..C−1, or a constant)."""
    import torch

    from xclp.training.models import SklearnLearner, predict_proba_array

    if isinstance(model, _Scaled):  # any family's model over standardised points: scaled, then as itself
        return proba(model.net, model.scaling.apply(X), n_classes)
    if isinstance(model, torch.nn.Module):
        return predict_proba_array(model, X)
    if isinstance(model, SklearnLearner):
        out = np.zeros((len(X), n_classes))
        if model.constant_ is not None:
            out[:, model.constant_] = 1.0
            return out
        out[:, model.estimator.classes_.astype(int)] = model.estimator.predict_proba(X)
        return out
    return np.asarray(model.predict_proba(X), dtype=np.float64)


def true_class_confidence(model, X: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    return proba(model, X, n_classes)[np.arange(len(y)), y]


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def roc_summary(scores: np.ndarray, member: np.ndarray) -> dict:
    """AUC and TPR at 1 % / 0.1 % FPR (interpolated on the ROC curve), and the curve itself."""
    from sklearn.metrics import roc_auc_score, roc_curve

    member = np.asarray(member, dtype=bool)
    if member.all() or not member.any():
        raise ValueError("an audit needs members and non-members")
    fpr, tpr, _ = roc_curve(member, scores)
    return {"auc": float(roc_auc_score(member, scores)),
            "tpr_at_1pct_fpr": float(np.interp(0.01, fpr, tpr)),
            "tpr_at_0.1pct_fpr": float(np.interp(0.001, fpr, tpr)),
            "members": int(member.sum()), "non_members": int((~member).sum()),
            "roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()}}


def _released(out: dict, target: str = "model", n_classes: int | None = None) -> list:
    """What the run releases, as models to attack: one (FedAvg, FedKT, FREDY) or one per site (FedCT);
    for target "labels", the one proxy rebuilt from the shared labels."""
    if target == "labels":
        if "released_labels" not in out:
            raise DataError(f"{out['algorithm']} shares no labels on public points: audit its model (--target model)")
        X, labels = out["released_labels"]
        return [LabelProxy(np.asarray(X), np.asarray(labels, dtype=np.int64), n_classes)]
    models = list(out["models"]) if "models" in out else [out["model"]]
    if any(m is None for m in models):
        raise DataError(f"{out['algorithm']} released no model in this run (no query was labelled): nothing to audit")
    if out.get("scaling") is not None:  # the model takes standardised points: attacked as it is used
        models = [_Scaled(m, out["scaling"]) for m in models]
    return models


class _Scaled:
    """A released model (a network, or FedCT's, FedKT's, FREDY's learner) with the run's standardisation
    of its inputs in front (xclp.training.input_scaling); `proba` scores it."""

    def __init__(self, net, scaling):
        self.net, self.scaling = net, scaling


def _candidates(sites, test, models: list, rng: np.random.Generator):
    """Per released model: (X, y, member?) — its members (its site's labelled points, or every
    site's for a global model) and as many test points, drawn once and shared by every model."""
    Xte, yte = test
    groups = []
    for i, _ in enumerate(models):
        owners = [sites[i]] if len(models) > 1 else sites
        Xm = np.concatenate([s.X[s.y >= 0] for s in owners])
        ym = np.concatenate([s.y[s.y >= 0] for s in owners])
        groups.append((Xm, ym))
    n_non = min(len(yte), max(len(g[1]) for g in groups))
    pick = rng.choice(len(yte), n_non, replace=False)
    return [(np.concatenate([Xm, Xte[pick]]), np.concatenate([ym, yte[pick]]),
             np.concatenate([np.ones(len(ym), bool), np.zeros(n_non, bool)])) for Xm, ym in groups]


def run_audit(config: TrainConfig | dict, attack: str = "loss", shadows: int = 4, target: str = "model") -> dict:
    """Train the target run, attack what it releases; {"algorithm", "auc", "tpr_at_1pct_fpr", ...}."""
    cfg = (config if isinstance(config, TrainConfig) else TrainConfig(**config)).validate()
    cfg = replace(cfg, json=None, plot=None, baselines=False)
    if cfg.data is not None:
        raise DataError("the audit draws its members, non-members and shadow runs from a named --dataset: "
                        "it does not take --data")
    if attack not in ATTACKS:
        raise DataError(f"--attack must be one of {ATTACKS}, got {attack!r}")
    if target not in TARGETS:
        raise DataError(f"--target must be one of {TARGETS}, got {target!r}")
    if attack == "lira" and shadows < 2:
        raise DataError("LiRA needs at least 2 shadow runs (--shadows)")
    n_pool = len(load_train_test(cfg.dataset, cfg.seed)[1])
    if attack == "lira" and cfg.train_size is None:
        cfg = replace(cfg, train_size=n_pool // 2)  # the other half is the shadows' population
    target_pool = pool_indices(cfg, n_pool)
    sites, public, test, n_classes = prepare(cfg)
    out = train(cfg, sites, public, test, n_classes)
    models = _released(out, target, n_classes)
    groups = _candidates(sites, test, models, np.random.default_rng([cfg.seed, 7]))
    conf = [true_class_confidence(m, X, y, n_classes) for m, (X, y, _) in zip(models, groups)]
    member = np.concatenate([g[2] for g in groups])
    loss = roc_summary(np.concatenate([np.log(np.clip(c, EPS, 1.0)) for c in conf]), member)
    extra = {}
    if attack == "loss":
        summary = loss
    else:
        outside = np.setdiff1d(np.arange(n_pool), target_pool)
        size = len(target_pool)
        if len(outside) < size:
            raise DataError(f"LiRA's shadows need {size} pool points the target never saw, there are {len(outside)}: "
                            f"use --train-size ≤ {n_pool // 2}")
        phis = []
        for k in range(shadows):
            pool = np.sort(np.random.default_rng([cfg.seed, 1000 + k]).choice(outside, size, replace=False))
            s_sites, s_public, s_test, _ = prepare(cfg, pool=pool)
            s_models = _released(train(cfg, s_sites, s_public, s_test, n_classes), target, n_classes)
            phis.append(np.concatenate([logit(true_class_confidence(m, X, y, n_classes))
                                        for m, (X, y, _) in zip(s_models, groups)]))
        phis = np.stack(phis)
        target_phi = np.concatenate([logit(c) for c in conf])
        mu = phis.mean(axis=0)
        sigma = float(np.sqrt(np.mean(phis.var(axis=0, ddof=1)))) or 1.0
        summary = roc_summary((target_phi - mu) / sigma, member)
        extra = {"loss_attack": {k: v for k, v in loss.items() if k != "roc"}}  # the same target, the simpler attack
    return {"algorithm": cfg.algorithm, "attack": attack, "target": target, "shadows": shadows if attack == "lira" else 0,
            "released_models": len(models), **summary, **extra, "model_test_accuracy": out["final_accuracy"],
            "privacy": out.get("privacy"), "config": {k: v for k, v in vars(cfg).items() if k not in ("json", "plot")}}
