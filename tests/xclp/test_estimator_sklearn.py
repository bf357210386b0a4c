"""The estimators as scikit-learn sees them (xclp/estimator.py): sklearn's own checks, clone, Pipeline,
GridSearchCV with the sites kept apart, and FederatedXCLP's labels against `xclp simulate predict`'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sklearn
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, GroupKFold, cross_validate
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils import get_tags
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.estimator_checks import check_classifiers_predictions, check_estimator

from cli.main import build_parser, load_dataset, main
from xclp.estimator import FederatedXCLP, XCLPLabelSpreading, default_sites

ROOT = Path(__file__).resolve().parents[2]

# The one check neither estimator can pass, and why: it fits binary labels [-1, 1], and −1 marks an
# unlabelled point (LabelSpreading's convention; scikit-learn exempts its own LabelSpreading from these
# labels by name, in estimator_checks._choose_check_classifiers_labels). The rest of that check (string
# and object labels) runs below, in test_string_and_object_labels.
EXPECTED_FAILED = {
    "check_classifiers_classes": "its binary labels are [-1, 1], and -1 marks an unlabelled point "
                                 "(semi-supervised, as LabelSpreading, which sklearn exempts by name)",
}
# skipped by scikit-learn itself unless SCIPY_ARRAY_API=1 was set before scipy was imported: run in a
# subprocess with it set (test_array_api_check)
SKIPPED_BY_SKLEARN = {"check_array_api_input"}


@pytest.fixture(scope="module")
def digits_sites():
    """180 digits at 3 named sites (60 each), 30 % labelled."""
    X, y = load_digits(return_X_y=True)
    X, y = X[:180], y[:180]
    y_train = np.where(np.random.default_rng(0).random(180) < 0.3, y, -1)
    groups = np.array(["hospA", "hospB", "hospC"])[np.arange(180) % 3]
    return X, y, y_train, groups


def _run_checks(est) -> list[dict]:
    results = check_estimator(est, expected_failed_checks=EXPECTED_FAILED, on_skip=None, on_fail="raise")
    skipped = {r["check_name"] for r in results if r["status"] == "skipped"}
    xfailed = {r["check_name"] for r in results if r["status"] == "xfail"}
    assert skipped <= SKIPPED_BY_SKLEARN, skipped
    assert xfailed == set(EXPECTED_FAILED)
    assert sum(r["status"] == "passed" for r in results) > 40
    return results


def test_check_estimator_label_spreading():
    _run_checks(XCLPLabelSpreading())


def test_check_estimator_federated():
    _run_checks(FederatedXCLP(bits=256, progress=False))


def test_array_api_check():
    """sklearn's array-API check (NumPy inputs with array API dispatch on) needs SCIPY_ARRAY_API=1 at import."""
    code = ("from sklearn.utils.estimator_checks import check_array_api_input as c\n"
            "from xclp.estimator import FederatedXCLP, XCLPLabelSpreading\n"
            "for e in (XCLPLabelSpreading(), FederatedXCLP(bits=256, progress=False)):\n"
            "    c(type(e).__name__, e, array_namespace='numpy', expect_only_array_outputs=False)\n"
            "print('ok')\n")
    env = {**os.environ, "SCIPY_ARRAY_API": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.parametrize("est", [XCLPLabelSpreading(), FederatedXCLP(bits=256, progress=False)],
                         ids=["one-party", "federated"])
def test_string_and_object_labels(est):
    """check_classifiers_classes less its [-1, 1] labels: class names as strings and objects."""
    rng = np.random.default_rng(7)
    centres = np.array([[3.0, 0.0], [-3.0, 1.0], [0.0, -3.0]])
    cls = np.arange(30) % 3
    X = centres[cls] + 0.1 * rng.standard_normal((30, 2))
    names = np.take(["one", "two", "three"], cls)
    for y in (names, names.astype(object), names[cls < 2]):
        Xy = X if y.shape[0] == 30 else X[cls < 2]
        check_classifiers_predictions(Xy, y, type(est).__name__, est)


def test_tags_parameters_and_clone():
    for est in (XCLPLabelSpreading(), FederatedXCLP()):
        tags = get_tags(est)
        assert tags.classifier_tags.semi_supervised and tags.classifier_tags.unlabelled == -1
        assert tags.estimator_type == "classifier"
        assert clone(est.set_params(k=5)).get_params()["k"] == 5


@pytest.mark.parametrize("cls", [XCLPLabelSpreading, FederatedXCLP])
@pytest.mark.parametrize("bad", [{"k": 0}, {"alpha": 1.0}, {"alpha": 0}, {"bits": 65536}, {"power": -1},
                                 {"solver": "lu"}, {"similarity": "euclid"}])
def test_invalid_parameters_are_refused(cls, bad, digits_sites):
    X, _, y, _ = digits_sites
    with pytest.raises(InvalidParameterError, match=next(iter(bad))):
        cls(**bad).fit(X, y)


def test_federated_refuses_what_the_job_refuses(digits_sites):
    X, _, y, groups = digits_sites
    for bad in ({"crypto": "rot13"}, {"key_bits": 1024}, {"n_sites": 1}, {"label_flip": 1.0},
                {"random_state": -1}, {"graph": "dense"}):
        with pytest.raises(InvalidParameterError, match=next(iter(bad))):
            FederatedXCLP(**bad).fit(X, y, groups=groups)
    # what only the job's own validation knows (JobParams.validate): combinations
    with pytest.raises(ValueError, match="exact"):
        FederatedXCLP(similarity="exact", crypto="lattice").fit(X, y, groups=groups)
    with pytest.raises(ValueError, match="not both"):
        FederatedXCLP(dp_epsilon=1.0, label_flip=0.1).fit(X, y, groups=groups)
    with pytest.raises(ValueError, match="two sites"):
        FederatedXCLP().fit(X, y, groups=np.zeros(180))


def test_pipeline_one_party(digits_sites):
    X, y_true, y, _ = digits_sites
    pipe = make_pipeline(StandardScaler(), XCLPLabelSpreading(k=8)).fit(X, y)
    assert pipe.score(X, y_true) > 0.85
    assert pipe[-1].transduction_.shape == (180,) and pipe[-1].label_distributions_.shape == (180, 10)
    # score counts only labelled points: a semi-supervised y scores on its labels alone
    assert pipe.score(X, y) == pytest.approx(float(np.mean(pipe.predict(X[y >= 0]) == y[y >= 0])))


def test_federated_study_attributes_and_seed(digits_sites):
    X, y_true, y, groups = digits_sites
    a = FederatedXCLP(k=8, bits=256, random_state=5, progress=False).fit(X, y, groups=groups)
    b = FederatedXCLP(k=8, bits=256, random_state=5, progress=False).fit(X, y, groups=groups)
    assert np.array_equal(a.transduction_, b.transduction_) and np.array_equal(a.confidence_, b.confidence_)
    assert a.sites_ == ["hospA", "hospB", "hospC"]
    rows = np.concatenate([r["rows"] for r in a.site_results_.values()])
    assert np.array_equal(np.sort(rows), np.arange(180))
    for s, r in a.site_results_.items():
        assert np.all(groups[r["rows"]] == s) and np.array_equal(r["labels"], a.transduction_[r["rows"]])
    assert a.bytes_["total"] > 0 and set(a.bytes_["by_party"]) >= set(a.sites_)
    assert {"seed", "counts", "hamming", "row_sums", "total"} <= set(a.timings_)
    assert a.epsilon_ is None and a.privacy_["epsilon"] is None
    assert np.mean(a.transduction_[y < 0] == y_true[y < 0]) > 0.8
    assert a.score(X, y_true) > 0.85
    assert np.allclose(a.predict_proba(X[:5]).sum(axis=1), 1.0)


def test_federated_default_sites_and_progress(digits_sites, capsys):
    X, _, y, _ = digits_sites
    assert list(default_sites(7, 3)) == ["site0", "site1", "site2", "site0", "site1", "site2", "site0"]
    m = FederatedXCLP(bits=256, n_sites=4, progress=True).fit(X, y)
    assert m.sites_ == ["site0", "site1", "site2", "site3"]
    assert np.array_equal(m.site_results_["site1"]["rows"], np.arange(1, 180, 4))
    assert "XCLP" in capsys.readouterr().err  # the bar, asked for
    FederatedXCLP(bits=256).fit(X, y)  # "auto": stderr is no terminal here
    assert capsys.readouterr().err == ""


def test_grid_search_keeps_sites_apart(digits_sites):
    X, _, y, groups = digits_sites
    with sklearn.config_context(enable_metadata_routing=True):
        est = FederatedXCLP(bits=256, progress=False).set_fit_request(groups=True)
        gs = GridSearchCV(est, {"k": [5, 10], "alpha": [0.9, 0.99]}, cv=GroupKFold(n_splits=3))
        gs.fit(X, y, groups=groups)
        assert len(gs.cv_results_["params"]) == 4 and np.all(np.isfinite(gs.cv_results_["mean_test_score"]))
        assert gs.best_score_ > 0.7
        assert gs.best_estimator_.sites_ == ["hospA", "hospB", "hospC"]  # the refit got the groups
        # each fold's fit ran over the training sites only: the held-out site is no party to its job
        cv = cross_validate(est, X, y, cv=GroupKFold(n_splits=3), params={"groups": groups}, return_estimator=True,
                            return_indices=True)
        for model, test in zip(cv["estimator"], cv["indices"]["test"]):
            held_out = set(groups[test])
            assert len(held_out) == 1 and held_out.isdisjoint(model.sites_) and len(model.sites_) == 2


@pytest.mark.parametrize("crypto,extra", [("plaintext", ["--dp-epsilon", "4"]), ("ot", [])])
def test_federated_labels_equal_simulate_predicts(tmp_path, crypto, extra):
    """The same data, sites and seed: FederatedXCLP and `xclp simulate predict` give the same labels."""
    argv = ["simulate", "predict", "--dataset", "digits", "--limit", "150", "--sites", "3", "--split",
            "dirichlet:0.5", "--labeled-fraction", "0.2", "--bits", "128", "--k", "8", "--alpha", "0.95",
            "--seed", "3", "--crypto", crypto, "--no-baselines", "--quiet",
            "--json", str(tmp_path / "r.json"), "--predictions", str(tmp_path / "p.npz"), *extra]
    assert main(argv) == 0
    cli = np.load(tmp_path / "p.npz")
    report = json.loads((tmp_path / "r.json").read_text())
    ds, _ = load_dataset(build_parser().parse_args(argv))  # the CLI's own data path
    eps = {"dp_epsilon": 4.0} if extra else {}
    m = FederatedXCLP(k=8, alpha=0.95, bits=128, crypto=crypto, random_state=3, progress=False,
                      **eps).fit(ds.X, ds.y, groups=ds.site)
    assert np.array_equal(m.classes_, np.arange(10))
    assert np.array_equal(m.transduction_, cli["labels"])
    assert np.array_equal(m.confidence_, cli["confidence"])
    assert m.epsilon_ == report["privacy"]["epsilon"]
    if extra:
        assert m.epsilon_ is not None and m.epsilon_ <= 4.0 + 1e-9
