"""scikit-learn estimators: XCLP's numerics for one party, and the federated protocol run in one call.

    >>> model = XCLPLabelSpreading(k=10, alpha=0.99).fit(X, y)          # y = −1 for unlabelled
    >>> model.transduction_, model.label_distributions_, model.predict(X_new)
    >>> fed = FederatedXCLP(k=10, crypto="lattice", random_state=0).fit(X, y, groups=site)
    >>> fed.transduction_, fed.site_results_, fed.timings_, fed.bytes_, fed.epsilon_

Both are scikit-learn estimators (BaseEstimator, ClassifierMixin): parameters in __init__, declared once
with their bounds in `_parameter_constraints` (the job's own bounds, xclp.protocol) and validated at fit;
results in attributes with a trailing underscore, as sklearn's LabelSpreading: `transduction_`,
`label_distributions_`, `classes_`. They clone, go into a Pipeline and a GridSearchCV, and pass
`sklearn.utils.estimator_checks.check_estimator` (tests/xclp/test_estimator_sklearn.py). Labels may be
any class values; −1 marks an unlabelled point, as in LabelSpreading (tags: `classifier_tags.semi_supervised`).

New points (`predict`, `predict_proba`, `score`) are labelled inductively, as LabelSpreading does with
its fitted kernel: each new point takes its k most similar fitted points' label distributions, weighted
as the graph weights an edge (cos^power, xclp.graph.edge_weight).

`FederatedXCLP` runs the real protocol in process: the sites' and the coordinator's machines with the
chosen crypto, through xclp.simulation.run_xclp — the function `xclp simulate predict` calls, so that
the same data, sites and seed give the same labels.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.utils import Tags
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils._tags import ClassifierTags
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_consistent_length, check_is_fitted, column_or_1d, validate_data

from crypto.hamming_api import PROTOCOLS as CRYPTO_PROTOCOLS
from crypto.paillier_hamming import MIN_KEY_BITS as PAILLIER_MIN_KEY_BITS
from xclp import graph as graphs
from xclp.baselines import build_graph
from xclp.blocking import DEFAULT_MAX_BUCKET as _MAX_BUCKET
from xclp.blocking import DEFAULT_TABLES as _BLOCKING_TABLES
from xclp.data import UNLABELLED, DataError, make_dataset
from xclp.influence import SOLVERS, propagate
from xclp.job_options import GRAPH_MODES, JOB_DEFAULTS, LSH_MAX_BITS
from xclp.job_params import MIN_K, SIMILARITIES, JobParams
from xclp.lsh import l2_normalise
from xclp.privacy import label_dp
from xclp.propagation import class_counts, label_matrix, predict_from_scores
from xclp.push import DEFAULT_RANK as _INFLUENCE_RANK
from xclp.standardisation import standardisation_stats, standardise

PREDICT_CHUNK = 2048  # new points per block of similarities in predict_proba


@dataclass(slots=True)
class SemiSupervisedClassifierTags(ClassifierTags):
    """sklearn's classifier tags and what makes these estimators semi-supervised: a point whose label
    is `unlabelled` (−1, as LabelSpreading) is not labelled; fit needs at least one labelled point."""

    semi_supervised: bool = True
    unlabelled: int = UNLABELLED


# ------------------------------------------------------------------------------------------------
# shared: labels in, new points out


def _encode_labels(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(classes_, y as indices into classes_ with −1 for unlabelled). Numbers equal to −1 are unlabelled."""
    check_classification_targets(y)
    y = np.asarray(y)
    unlabelled = (y == UNLABELLED) if y.dtype.kind in "iuf" else np.zeros(y.shape, bool)
    if unlabelled.all():
        raise DataError("fit needs at least one labelled point (y ≠ −1)")
    classes = np.unique(y[~unlabelled])
    if classes.size < 2:
        raise DataError(f"fit needs labelled points of at least two classes, got one class: {classes[0]!r}")
    yi = np.full(y.shape, UNLABELLED, dtype=np.int64)
    yi[~unlabelled] = np.searchsorted(classes, y[~unlabelled])
    return classes, yi


def _decode(classes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Class values of label indices; an unreached point (−1) stays −1 (numeric classes) or None."""
    out = classes[np.maximum(labels, 0)]
    if (labels < 0).any():
        out = out.astype(object) if classes.dtype.kind not in "iuf" else out
        out[labels < 0] = UNLABELLED if classes.dtype.kind in "iuf" else None
    return out


def _one_hot_labelled(dist: np.ndarray, yi: np.ndarray) -> np.ndarray:
    """A labelled point's distribution is its own label (as LabelSpreading's at α → 0 for the seeds)."""
    lab = yi >= 0
    dist = np.array(dist, dtype=np.float64)
    dist[lab] = np.eye(dist.shape[1])[yi[lab]]
    return dist


def inductive_proba(Xn_new: np.ndarray, Xn_fit: np.ndarray, distributions: np.ndarray, k: int,
                    power: float) -> np.ndarray:
    """New points (L2-normalised): their k most similar fitted points' distributions, weighted like
    graph edges (cos^power); a point with no positive weight gets the uniform distribution."""
    k = min(int(k), Xn_fit.shape[0])
    C = distributions.shape[1]
    out = np.empty((Xn_new.shape[0], C))
    for s in range(0, Xn_new.shape[0], PREDICT_CHUNK):
        sim = Xn_new[s:s + PREDICT_CHUNK] @ Xn_fit.T
        nn = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        w = np.clip(graphs.edge_weight(np.take_along_axis(sim, nn, axis=1), power), 0, None)
        P = np.einsum("ik,ikc->ic", w, distributions[nn])
        total = P.sum(axis=1, keepdims=True)
        out[s:s + PREDICT_CHUNK] = np.divide(P, total, out=np.full_like(P, 1.0 / C), where=total > 0)
    return out


class _InductiveMixin:
    """predict_proba / predict (score: ClassifierMixin's accuracy) from `X_` and `label_distributions_`."""

    def _embed(self, X: np.ndarray) -> np.ndarray:
        return l2_normalise(X)

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities of new points (columns in the order of `classes_`)."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False)
        return inductive_proba(self._embed(X), self.X_, self.label_distributions_, self.k, self.power)

    def predict(self, X) -> np.ndarray:
        """The most probable class of each new point."""
        proba = self.predict_proba(X)  # raises NotFittedError before fit
        return self.classes_[proba.argmax(axis=1)]

    def score(self, X, y, sample_weight=None) -> float:
        """Accuracy on the points that have a label (y ≠ −1; a semi-supervised y, as fit takes, scores
        on its labelled points): what a GridSearchCV's held-out sites are scored by."""
        from sklearn.metrics import accuracy_score

        y = column_or_1d(y)
        keep = (y != UNLABELLED) if y.dtype.kind in "iuf" else np.ones(y.shape, bool)
        if not keep.any():
            raise ValueError("score needs at least one labelled point (y ≠ −1)")
        X = X[keep] if hasattr(X, "shape") else [x for x, k in zip(X, keep) if k]
        w = None if sample_weight is None else np.asarray(sample_weight)[keep]
        return float(accuracy_score(y[keep], self.predict(X), sample_weight=w))

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.classifier_tags = SemiSupervisedClassifierTags()
        return tags


# ------------------------------------------------------------------------------------------------
# one party


_COMMON_CONSTRAINTS = {
    "k": [Interval(Integral, MIN_K, None, closed="left")],
    "alpha": [Interval(Real, 0, 1, closed="neither")],
    "power": [Interval(Real, 0, None, closed="neither")],
    "similarity": [StrOptions(set(SIMILARITIES))],
    "bits": [Interval(Integral, 1, LSH_MAX_BITS, closed="both")],
    "balanced": ["boolean"],
    "solver": [StrOptions(set(SOLVERS))],
    "tol": [Interval(Real, 0, None, closed="neither")],
}


class XCLPLabelSpreading(_InductiveMixin, ClassifierMixin, BaseEstimator):
    """Label spreading on one party's points with XCLP's numerics (kNN graph of cosine similarities
    weighted cos^power, symmetric normalisation, class-balanced label matrix, Z = (I − α𝒲)^{-1} Y).

    Parameters
    ----------
    k : int ≥ 1 — neighbours of each point in the graph (capped at n − 1).
    alpha : float in (0, 1) — how far labels spread (LabelSpreading's α).
    power : float > 0 — edge weight cos^power.
    similarity : "exact" (true cosine) or "lsh" (the Hamming distance of `bits`-bit SimHash codes).
    bits : int — the LSH length (similarity="lsh").
    seed : int ≥ 0 — the LSH hyperplanes.
    balanced : bool — class-balanced label matrix.
    solver, tol : the influence solver (xclp.influence.SOLVERS) and its tolerance.

    Attributes
    ----------
    classes_, transduction_ (−1 where no label reached a point), label_distributions_, confidence_,
    solver_, X_ (the fitted points, L2-normalised), n_features_in_.
    """

    _parameter_constraints: dict = {**_COMMON_CONSTRAINTS, "seed": [Interval(Integral, 0, None, closed="left")]}

    def __init__(self, k: int = JOB_DEFAULTS["k"], alpha: float = JOB_DEFAULTS["alpha"], power: float = JOB_DEFAULTS["power"], similarity: str = "exact",
                 bits: int = 4096, seed: int = 0, balanced: bool = True, solver: str = "auto", tol: float = 1e-8):
        self.k = k
        self.alpha = alpha
        self.power = power
        self.similarity = similarity
        self.bits = bits
        self.seed = seed
        self.balanced = balanced
        self.solver = solver
        self.tol = tol

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y) -> XCLPLabelSpreading:
        """Fit on X with labels y (−1: unlabelled); every point gets a label in `transduction_`."""
        X, y = validate_data(self, X, y, ensure_min_samples=2)
        self.classes_, yi = _encode_labels(y)
        labelled = yi >= 0
        C = self.classes_.size
        n = X.shape[0]
        W = build_graph(X, min(int(self.k), n - 1), self.power, self.similarity, self.bits,
                        np.random.default_rng(self.seed).bytes(32))
        Y = np.zeros((n, C))
        Y[labelled] = label_matrix(yi[labelled], class_counts(yi, C), self.balanced)
        Z, info = propagate(W, Y, self.alpha, self.solver, self.tol)
        pred = predict_from_scores(Z, yi)
        self.X_ = self._embed(X)
        self.label_distributions_ = _one_hot_labelled(pred.probabilities, yi)
        self.transduction_ = _decode(self.classes_, pred.labels)
        self.confidence_ = pred.confidence
        self.solver_ = info.method
        return self


# ------------------------------------------------------------------------------------------------
# the federation, in process


def default_sites(n: int, n_sites: int) -> np.ndarray:
    """The sites of fit(X, y) without `groups`: row i goes to site{i mod n_sites} (round robin in row
    order; with fewer rows than sites, as many sites as rows)."""
    return np.array([f"site{i}" for i in range(n_sites)])[np.arange(n) % n_sites]


class FederatedXCLP(_InductiveMixin, ClassifierMixin, BaseEstimator):
    """XCLP over several sites, run in process with the real protocol: `fit(X, y, groups=site)`.

    `groups[i]` names the site that holds row i (any values; a site's name is `str(value)`). Each site
    and the coordinator run their machines (xclp.prediction_job) with the chosen `crypto`, every message
    serialised and counted — xclp.simulation.run_xclp, the function of `xclp simulate predict`: for the
    same data, sites, parameters and `random_state` (the CLI's --seed) the labels are the same.

    Without `groups` the rows are dealt round robin to `n_sites` sites (row i → site{i mod n_sites});
    this default exists so that the estimator works wherever sklearn calls fit(X, y) (check_estimator, a
    Pipeline), and is no model of real sites: give `groups` for a study. In a GridSearchCV keep the sites
    apart in the folds (GroupKFold) and route the groups into fit (sklearn's metadata routing:
    ``sklearn.set_config(enable_metadata_routing=True)`` and ``FederatedXCLP(...).set_fit_request(groups=True)``).

    Parameters (the job's, xclp.job_params.JobParams, with its bounds)
    ----------
    k, alpha, power, bits, similarity ("lsh"; "exact" with crypto="plaintext" only), crypto (one of
    crypto.hamming_api.PROTOCOLS; "plaintext" is the reference with no security), key_bits (Paillier),
    standardize (federated standardisation), balanced, solver, tol; graph ("exact", "blocked", "auto")
    with blocking_tables, max_bucket, descent_rounds, influence_rank for a blocked graph.
    Label-DP, as the CLI's flags: label_flip (rr's p), dp_noise (gaussian's z), dp_clip, or a budget
    dp_epsilon at dp_delta that calibrates the mechanism label_dp ("rr" or "gaussian").
    n_sites : int ≥ 2 — the default split's sites, when fit gets no `groups`.
    random_state : int ≥ 0 — the simulation's seed: the sites' seed contributions and noise secrets,
        hence the LSH hyperplanes (the CLI's --seed).
    progress : "auto" (a bar on stderr when it is a terminal), True or False.

    Attributes
    ----------
    classes_, transduction_ (−1 where no label reached a point or its site dropped), confidence_,
    label_distributions_ (the sites' released class probabilities; a labelled point's own label);
    sites_ (the roster, in order), site_results_ ({site: {"rows", "labels", "confidence"}});
    timings_ (seconds per phase, "total" included), bytes_ ({"total", "by_phase", "by_party"}), solver_;
    privacy_ (the privacy ledger, JSON) and epsilon_ (its ε; None without label-DP); params_ (JobParams);
    X_ (the fitted points as predict compares them: standardised by all points' moments when
    `standardize`, then L2-normalised), feature_mean_, feature_scale_.

    predict/predict_proba/score label new points from all fitted points (the pooled view an in-process
    study has, not one site's: in a deployment new points join a new job).
    """

    _parameter_constraints: dict = {
        **_COMMON_CONSTRAINTS,
        "crypto": [StrOptions(set(CRYPTO_PROTOCOLS))],
        "key_bits": [Interval(Integral, PAILLIER_MIN_KEY_BITS, None, closed="left")],
        "standardize": ["boolean"],
        "graph": [StrOptions(set(GRAPH_MODES))],
        "blocking_tables": [Interval(Integral, 1, LSH_MAX_BITS, closed="both")],
        "max_bucket": [Interval(Integral, 2, None, closed="left")],
        "descent_rounds": [Interval(Integral, 0, None, closed="left")],
        "influence_rank": [Interval(Integral, 0, None, closed="left")],
        "label_flip": [Interval(Real, 0, 1, closed="left"), None],
        "dp_noise": [Interval(Real, 0, None, closed="left"), None],
        "dp_clip": [Interval(Real, 0, None, closed="neither"), None],
        "dp_epsilon": [Interval(Real, 0, None, closed="neither"), None],
        "dp_delta": [Interval(Real, 0, 1, closed="neither")],
        "label_dp": [StrOptions(set(label_dp.MECHANISMS))],
        "n_sites": [Interval(Integral, 2, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "progress": [StrOptions({"auto"}), "boolean"],
    }

    def __init__(self, k: int = JOB_DEFAULTS["k"], alpha: float = JOB_DEFAULTS["alpha"], power: float = JOB_DEFAULTS["power"], bits: int = JOB_DEFAULTS["bits"],
                 similarity: str = "lsh", crypto: str = "plaintext", key_bits: int = JOB_DEFAULTS["key_bits"], standardize: bool = True,
                 balanced: bool = True, solver: str = "auto", tol: float = 1e-8, graph: str = "exact",
                 blocking_tables: int = _BLOCKING_TABLES, max_bucket: int = _MAX_BUCKET, descent_rounds: int = 2,
                 influence_rank: int = _INFLUENCE_RANK, label_flip: float | None = None,
                 dp_noise: float | None = None, dp_clip: float | None = None, dp_epsilon: float | None = None,
                 dp_delta: float = 1e-5, label_dp: str = "rr", n_sites: int = 3, random_state: int = 0,
                 progress: str | bool = "auto"):
        self.k = k
        self.alpha = alpha
        self.power = power
        self.bits = bits
        self.similarity = similarity
        self.crypto = crypto
        self.key_bits = key_bits
        self.standardize = standardize
        self.balanced = balanced
        self.solver = solver
        self.tol = tol
        self.graph = graph
        self.blocking_tables = blocking_tables
        self.max_bucket = max_bucket
        self.descent_rounds = descent_rounds
        self.influence_rank = influence_rank
        self.label_flip = label_flip
        self.dp_noise = dp_noise
        self.dp_clip = dp_clip
        self.dp_epsilon = dp_epsilon
        self.dp_delta = dp_delta
        self.label_dp = label_dp
        self.n_sites = n_sites
        self.random_state = random_state
        self.progress = progress

    def job_params(self, n_classes: int) -> JobParams:
        """The job these parameters make (validated by the job's own checks: JobParams.validate)."""
        dp = label_dp.job_fields(n_classes, epsilon=self.dp_epsilon, delta=self.dp_delta, mechanism=self.label_dp,
                                 flip=self.label_flip, noise=self.dp_noise, clip=self.dp_clip)
        return JobParams(job_id=f"sim-{self.random_state}", n_classes=n_classes, bits=self.bits, k=self.k,
                         alpha=self.alpha, power=self.power, similarity=self.similarity, crypto=self.crypto,
                         solver=self.solver, tol=self.tol, key_bits=self.key_bits, standardize=self.standardize,
                         balanced=self.balanced, graph=self.graph, blocking_tables=self.blocking_tables,
                         max_bucket=self.max_bucket, descent_rounds=self.descent_rounds,
                         influence_rank=self.influence_rank, dp_delta=self.dp_delta, **dp).validate()

    def _sites(self, n: int, groups) -> np.ndarray:
        if groups is None:
            return default_sites(n, self.n_sites)
        groups = column_or_1d(groups)
        check_consistent_length(np.empty(n), groups)
        return np.asarray(groups).astype(str)

    def _embed(self, X: np.ndarray) -> np.ndarray:
        return l2_normalise((X - self.feature_mean_) / self.feature_scale_)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, groups=None) -> FederatedXCLP:
        """Run one XCLP job over the sites: row i at site `groups[i]` (default: `default_sites`)."""
        from xclp.privacy.ledger import PrivacyLedger, no_privacy
        from xclp.simulation import run_xclp

        X, y = validate_data(self, X, y, ensure_min_samples=2)
        self.classes_, yi = _encode_labels(y)
        site = self._sites(X.shape[0], groups)
        if np.unique(site).size < 2:
            raise ValueError(f"FederatedXCLP needs at least two sites (groups), got {np.unique(site).tolist()}; "
                             "for one party use XCLPLabelSpreading")
        ds = make_dataset(X, yi, site, n_classes=self.classes_.size)
        params = self.job_params(ds.n_classes)
        privacy = no_privacy()
        if params.label_flip > 0 or params.dp_noise > 0:  # as `xclp simulate predict`: spent before the run
            ledger = PrivacyLedger(self.dp_delta, self.dp_epsilon, neighbouring=label_dp.LABEL_LEVEL)
            label_dp.spend(ledger, params)
            privacy = ledger.to_json()
        with _ProgressBar(self.progress) as say:
            res = run_xclp(ds, params, seed=int(self.random_state), progress=say)

        rows = {s: np.flatnonzero(ds.site == s) for s in ds.sites}
        dist = np.zeros((ds.n, ds.n_classes))
        for s, idx in rows.items():
            dist[idx] = res.predictions[s].probabilities
        self.params_ = params
        self.sites_ = list(ds.sites)
        self.transduction_ = _decode(self.classes_, res.labels)
        self.confidence_ = res.confidence
        self.label_distributions_ = _one_hot_labelled(dist, yi)
        self.site_results_ = {s: {"rows": idx, "labels": self.transduction_[idx], "confidence": res.confidence[idx]}
                              for s, idx in rows.items()}
        self.timings_ = dict(res.timings)
        self.bytes_ = res.bytes
        self.solver_ = res.solver
        self.privacy_ = privacy
        self.epsilon_ = privacy["epsilon"]
        if self.standardize:
            _, self.feature_mean_, self.feature_scale_ = standardise(X, standardisation_stats(X))
        else:
            self.feature_mean_, self.feature_scale_ = np.zeros(X.shape[1]), np.ones(X.shape[1])
        self.X_ = self._embed(X)
        return self


class _ProgressBar:
    """A bar over the job's phases on stderr (tqdm, as the CLI's `job wait`): progress="auto" draws it
    only when stderr is a terminal and once a fit has run for a second; True always, False never."""

    def __init__(self, progress: str | bool):
        self.show = sys.stderr.isatty() if progress == "auto" else bool(progress)
        self.delay = 1.0 if progress == "auto" else 0.0
        self.bar = None

    def __enter__(self):
        if not self.show:
            return None
        from tqdm import tqdm

        from xclp.job_kinds import job_kind

        self.steps = len(job_kind("predict").phases) - 1  # setup .. row_sums ("done" is where it ends)
        self.bar = tqdm(total=self.steps, desc="XCLP", unit="phase", file=sys.stderr, delay=self.delay,
                        leave=False)
        self.said = 0
        return self.say

    def say(self, message: str) -> None:
        """run_xclp says one line as the job enters each phase: the bar counts the phases behind it."""
        self.bar.n = min(self.said, self.steps)
        self.said += 1
        self.bar.set_postfix_str(str(message), refresh=True)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.n = self.bar.total
            self.bar.close()
