"""FedCT's loop: the pseudo-labelled public set is replaced each exchange, never accumulated."""

import json

import numpy as np
import pytest

import xclp.training.fedct as fedct
import xclp.training.saved_learners as saved_learners
from xclp.training.fedavg import Site
from xclp.training.fedct import FedCTConfig, PublicSet, local_training_set
from xclp.training.simulation import run_fedct


class SpyLearner:
    """Records the size of every training set; on U, all sites agree on the first 10·t points after
    fit t and split three ways (a tie → abstain) on the rest."""

    def __init__(self, site_index: int):
        self.i, self.fits, self.sizes, self.weighted = site_index, 0, [], []

    def fit(self, X, y, sample_weight=None):
        self.fits += 1
        self.sizes.append(len(y))
        self.weighted.append(sample_weight is not None)
        return self

    def predict(self, X):
        out = np.full(len(X), self.i % 3)
        out[: 10 * self.fits] = 0
        return out


def test_public_pseudo_labels_replace_the_previous_ones(monkeypatch):
    spies = []

    def fake_make_learner(name, n_features, n_classes, seed=0, **kw):
        spies.append(SpyLearner(len(spies)))
        return spies[-1]

    monkeypatch.setattr(fedct, "make_learner", fake_make_learner)
    # the site keeps its learner between exchanges (saved_learners: no pickle); the spy's record as JSON
    dump, load = saved_learners.dump_learner, saved_learners.load_learner
    monkeypatch.setattr(saved_learners, "dump_learner", lambda learner, training=True: json.dumps(vars(learner)).encode()
                        if isinstance(learner, SpyLearner) else dump(learner, training))

    def load_spy(body, what="saved learner"):
        if not body.startswith(b"{"):
            return load(body, what)
        spy = SpyLearner(0)
        vars(spy).update(json.loads(body))
        return spy

    monkeypatch.setattr(saved_learners, "load_learner", load_spy)
    rng = np.random.default_rng(0)
    sites = [Site(f"site{j}", rng.normal(size=(20, 4)), np.array([0, 1, 2] + [-1] * 17)) for j in range(3)]
    U = rng.normal(size=(100, 4))
    test = (rng.normal(size=(5, 4)), np.zeros(5, dtype=np.int64))
    out = run_fedct(sites, U, test, 3, FedCTConfig(rounds=4, tie="abstain"), public_y=np.zeros(100, dtype=np.int64))
    # fit t sees its 3 labels plus exactly the 10·(t−1) points labelled at the previous exchange
    # (site0's learner as the site kept it: the simulated site stores it between exchanges, as an agent does)
    assert out["models"][0].sizes == [3, 13, 23, 33]
    assert [h["public_coverage"] for h in out["history"]] == [0.1, 0.2, 0.3, 0.4]
    assert out["communication_bytes"]["labels_up"] == 4 * 3 * 25  # 100 labels × 2 bits (3 classes), 3 sites, 4 exchanges


def test_mix_and_weights_of_the_local_training_set():
    rng = np.random.default_rng(0)
    y = np.array([0, 1, -1, -1, -1, -1])
    site = Site("s", rng.normal(size=(6, 2)), y)
    pub = PublicSet.create(rng.normal(size=(4, 2)))
    P = np.array([1, -1, 0, 2])
    xl = np.array([0, 1, 2, -1, 1, 0])
    xw = np.array([1.0, 1.0, 0.7, 0.0, 0.4, 0.0])
    private, pseudo = local_training_set(site, pub, P, xl, xw, None, rng)
    assert private[1].tolist() == [0, 1]
    # U's three labelled points (weight 1), then the XCLP points with ω > 0 (rows 2 and 4)
    assert pseudo[1].tolist() == [1, 0, 2, 2, 1]
    assert pseudo[2].tolist() == [1.0, 1.0, 1.0, 0.7, 0.4]


def test_fedct_config_is_validated():
    with pytest.raises(ValueError, match="one learner per site"):
        FedCTConfig(learners=["tree", "forest"]).validate(3)
    with pytest.raises(ValueError, match="tie"):
        FedCTConfig(tie="max").validate(3)
