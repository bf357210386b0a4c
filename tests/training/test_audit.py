"""The membership-inference audit (xclp/audit.py): chance on a model that saw none of the members,
clearly above it on one that memorised them, and the command's JSON contract."""

import json

import numpy as np
import pytest

from cli.main import main
from xclp.audit import LabelProxy, roc_summary, run_audit, true_class_confidence
from xclp.data import load_arrays
from xclp.training.models import make_learner


def test_roc_summary_knows_perfect_and_random_scores():
    member = np.r_[np.ones(500, bool), np.zeros(500, bool)]
    perfect = roc_summary(np.r_[np.ones(500), np.zeros(500)], member)
    assert perfect["auc"] == 1.0 and perfect["tpr_at_1pct_fpr"] == 1.0
    noise = roc_summary(np.random.default_rng(0).random(1000), member)
    assert abs(noise["auc"] - 0.5) < 0.06 and noise["tpr_at_1pct_fpr"] < 0.1
    with pytest.raises(ValueError, match="members and non-members"):
        roc_summary(np.ones(3), np.ones(3, bool))


def test_the_loss_attack_sees_memorised_members_and_nothing_in_a_model_that_never_saw_them():
    X, y = load_arrays("digits")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, len(y))  # random labels: only memorising fits the members (a full-depth tree does)
    idx = rng.permutation(len(y))
    members, non_members, other = idx[:400], idx[400:800], idx[800:1200]
    cand = np.r_[members, non_members]
    is_member = np.r_[np.ones(400, bool), np.zeros(400, bool)]
    memorised = make_learner("tree", X.shape[1], 10, seed=0).fit(X[members], y[members])
    unseen = make_learner("tree", X.shape[1], 10, seed=0).fit(X[other], y[other])
    scores = {name: np.log(np.clip(true_class_confidence(m, X[cand], y[cand], 10), 1e-12, 1))
              for name, m in (("memorised", memorised), ("unseen", unseen))}
    assert roc_summary(scores["memorised"], is_member)["auc"] > 0.8
    assert abs(roc_summary(scores["unseen"], is_member)["auc"] - 0.5) < 0.07


def test_audit_runs_and_keeps_its_json_contract(tmp_path):
    res = run_audit({"algorithm": "fedkt", "dataset": "digits", "sites": 3, "labels": 500, "public_size": 200,
                     "teachers": 3, "quiet": True}, attack="lira", shadows=2)
    assert res["attack"] == "lira" and res["shadows"] == 2 and res["released_models"] == 1
    assert 0 <= res["auc"] <= 1 and res["members"] == 500 and res["non_members"] > 0
    out, png = tmp_path / "audit.json", tmp_path / "roc.png"
    assert main(["audit", "--algorithm", "fedavg", "--dataset", "digits", "--sites", "3", "--labels", "300", "--rounds",
                 "2", "--attack", "loss", "--quiet", "--json", str(out), "--plot", str(png)]) == 0
    got = json.loads(out.read_text())
    assert {"algorithm", "auc", "tpr_at_1pct_fpr", "tpr_at_0.1pct_fpr", "attack", "target"} <= set(got)
    assert got["target"] == "model" and got["algorithm"] == "fedavg" and png.stat().st_size > 1000
    assert main(["audit", "--algorithm", "fedavg", "--shadows", "1", "--quiet"]) == 2  # LiRA needs two


def test_labels_that_copy_the_members_leak_and_labels_of_unseen_points_do_not():
    # The proxy an attacker rebuilds from released labels: released labels that ARE the members'
    # (random) labels put them at the members' own points, and the loss attack sees it; labels of other
    # points say nothing about the members.
    X, y = load_arrays("digits")
    rng = np.random.default_rng(1)
    y = rng.integers(0, 10, len(y))
    idx = rng.permutation(len(y))
    members, non_members, other = idx[:400], idx[400:800], idx[800:1200]
    cand, is_member = np.r_[members, non_members], np.r_[np.ones(400, bool), np.zeros(400, bool)]
    leaky, clean = LabelProxy(X[members], y[members], 10, k=1), LabelProxy(X[other], y[other], 10, k=1)
    for proxy, bound in ((leaky, lambda auc: auc > 0.8), (clean, lambda auc: abs(auc - 0.5) < 0.07)):
        conf = true_class_confidence(proxy, X[cand], y[cand], 10)
        assert bound(roc_summary(np.log(np.clip(conf, 1e-12, 1)), is_member)["auc"])


def test_the_labels_a_run_shares_are_audited_through_their_proxy(tmp_path):
    out = tmp_path / "labels.json"
    assert main(["audit", "--algorithm", "fedkt", "--dataset", "digits", "--sites", "3", "--labels", "500",
                 "--public-size", "200", "--teachers", "3", "--attack", "lira", "--shadows", "2", "--target", "labels",
                 "--quiet", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["target"] == "labels" and got["released_models"] == 1 and 0 <= got["auc"] <= 1
    assert got["members"] == 500
    assert main(["audit", "--algorithm", "fedavg", "--rounds", "1", "--attack", "loss", "--target", "labels",
                 "--quiet"]) == 2  # FedAvg shares no labels: a clear error
