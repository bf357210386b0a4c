"""Attack: whoever can write a FedCT site's saved state — a Flower node's Context.state passes through
the SuperNode, an agent's private state folder may be written by another account — plants a crafted
pickle whose `__reduce__` runs code when it is loaded (here: it creates a marker file). Before, the site
kept its learner as `pickle.dumps({"state": ..., "exchange": ...})` and unpickled whatever it found
there at its next exchange, so the planted code ran at the site. Defence: nothing a site saves is a
pickle (xclp.training.saved_learners: .npz arrays read with allow_pickle=False for torch learners,
skops against an allowlist of types for scikit-learn ones), and a pickle found where a saved state or
a model file should be is refused with one line, never loaded."""

import io
import pathlib
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest

from crypto.errors import ProtocolError
from xclp.training.fedavg import Site
from xclp.training.fedct import FedCTConfig, FedCTStrategy, PublicSet, new_site_state, site_exchange

LEARNERS = ("tree", "forest", "boosting", "logreg", "mlp", "cnn")
SMALL = {"forest": {"n_estimators": 5}, "boosting": {"max_iter": 5}, "mlp": {"hidden": 16, "embed_dim": 8},
         "cnn": {"embed_dim": 8, "width": 4}}


class Payload:
    """A pickle that creates `marker` when it is loaded (the planted code)."""

    def __init__(self, marker):
        self.marker = pathlib.Path(marker)

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _crafted(marker) -> bytes:
    import pickle

    return pickle.dumps({"state": Payload(marker), "exchange": 1})  # shaped like the old saved state


def _world(n_features: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.array([0, 1, 2] * 20 + [-1] * 40)
    site = Site("site0", rng.normal(size=(100, n_features)).astype(np.float32), y)
    public = PublicSet.create(rng.normal(size=(50, n_features)).astype(np.float32))
    return site, public


def _env(site, public, store) -> SimpleNamespace:
    """What FedCT's site hooks read of a driver's env: the site, the roster, U and the store."""
    return SimpleNamespace(site=site, sites=[site.name, "site1"], public=public, store=store)


def _strategy(learner: str) -> FedCTStrategy:
    cfg = FedCTConfig(learners=learner, rounds=3, period=3, batch_size=16, learner_kw={learner: SMALL.get(learner, {})})
    return FedCTStrategy(cfg.validate(2), 3, 50)


def _no_pickle_inside(body: bytes) -> None:
    """Not a pickle, and nothing inside it is one: every member is an .npy read with allow_pickle=False,
    a skops file (whose arrays are again .npy) or JSON."""
    assert body[:1] != b"\x80"
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        for name in z.namelist():
            member = z.read(name)
            assert member[:1] != b"\x80", name
            if name.endswith(".npy"):
                a = np.load(io.BytesIO(member), allow_pickle=False)
                if a.dtype == np.uint8 and a.ndim == 1 and a[:2].tobytes() == b"PK":
                    _no_pickle_inside(a.tobytes())  # a learner inside a site's state
            else:
                assert name == "schema.json", name


# --- the planted pickle ----------------------------------------------------------------------------

def test_a_planted_pickle_in_a_sites_saved_fedct_state_is_refused_and_never_run(tmp_path):
    site, public = _world()
    marker = tmp_path / "planted-code-ran"
    env = _env(site, public, {"learner": _crafted(marker)})
    try:
        _strategy("tree").site_state(env)
        err = None
    except Exception as exc:  # noqa: BLE001 — whatever it raised, the planted code must not have run
        err = exc
    assert not marker.exists(), "the planted pickle ran at the site"
    assert isinstance(err, ProtocolError) and "never loaded" in str(err) and "re-run the job" in str(err), err


def test_a_planted_pickle_in_an_agents_store_or_a_flower_nodes_context_is_refused(tmp_path):
    from flwr.app import ConfigRecord

    from clients.trainer import OLD_STORE_FILES, STORE_FILES, _FileKeep
    from xclp.job_files import job_file
    from xclp_flower.training_site import RecordMap

    site, public = _world()
    marker = tmp_path / "planted-code-ran"
    s = _strategy("tree")
    agent = _FileKeep(tmp_path, "job1", ".store-", named=STORE_FILES, old=OLD_STORE_FILES)
    flower = RecordMap(ConfigRecord({}))
    for store in (agent, flower):
        store["learner"] = _crafted(marker)
        with pytest.raises(ProtocolError, match="never loaded"):
            s.site_state(_env(site, public, store))
    # the file an agent of an older release kept (.learner.pkl): one line, neither loaded nor started afresh
    job_file(tmp_path, "job2", OLD_STORE_FILES["learner"]).write_bytes(_crafted(marker))
    with pytest.raises(ProtocolError, match="never loaded.*re-run the job"):
        s.site_state(_env(site, public, _FileKeep(tmp_path, "job2", ".store-", named=STORE_FILES,
                                                  old=OLD_STORE_FILES)))
    assert not marker.exists()


def test_a_planted_pickle_as_a_model_file_is_refused(tmp_path):
    from xclp.training.saved_learners import load_learner, load_model_file

    marker = tmp_path / "planted-code-ran"
    for name in ("job.model.pkl", "job.model.skops", "job.model.npz"):
        (tmp_path / name).write_bytes(_crafted(marker))
        with pytest.raises(ProtocolError, match="never loaded"):
            load_model_file(tmp_path / name)
    buf = io.BytesIO()  # a pickled object array as a bundle's member: np.load(allow_pickle=False) refuses it
    np.savez(buf, __meta__=np.array([Payload(marker)], dtype=object))
    with pytest.raises(ProtocolError, match="not a valid bundle"):
        load_learner(buf.getvalue())
    assert not marker.exists()


class Foreign:
    """A type outside the learners' allowlist; loading it would run its __setstate__."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __setstate__(self, state):
        pathlib.Path(state["marker"]).touch()


def test_a_skops_file_naming_a_type_outside_the_allowlist_is_refused_before_it_is_loaded(tmp_path):
    import skops.io as sio

    from xclp.training.models import make_learner
    from xclp.training.saved_learners import dump_site_state, load_learner

    site, public = _world()
    marker = tmp_path / "foreign-type-built"
    learner = make_learner("logreg", 16, 3)
    learner.fit(site.X[site.y >= 0], site.y[site.y >= 0])
    learner.estimator.extra_ = Foreign(marker)  # a learner carrying an object of a foreign type
    with pytest.raises(ProtocolError, match="allowlist.*Foreign"):
        load_learner(sio.dumps(learner))
    state = new_site_state(site, "logreg", 0, 3, public.digest, FedCTConfig())
    state.learner = learner
    with pytest.raises(ProtocolError, match="allowlist"):
        _strategy("logreg").site_state(_env(site, public, {"learner": dump_site_state(state, 1)}))
    with pytest.raises(ProtocolError, match="not a learner"):  # an allowlisted type that is not a learner
        load_learner(sio.dumps(make_learner("tree", 16, 3).estimator))
    assert not marker.exists()


# --- what a site saves: no pickle, and the same learner back -----------------------------------------

@pytest.mark.parametrize("learner", LEARNERS)
def test_every_learners_saved_state_and_model_file_hold_no_pickle_and_restore_exactly(learner, tmp_path):
    from xclp.training.saved_learners import load_model_file, model_file

    site, public = _world()
    s = _strategy(learner)
    env = _env(site, public, {})
    state, done = s.site_state(env)
    assert done == 0
    state.xclp_labels, state.xclp_weights = np.where(site.y >= 0, site.y, 1), np.full(len(site.y), 0.5)
    votes1, _ = site_exchange(state, public, None, s.cfg, 1)
    s.keep_site_state(env, state, 1)
    _no_pickle_inside(env.store["learner"])

    back, done = s.site_state(env)  # the same learner, its exchange, digest and XCLP labels
    assert done == 1 and back.pinned == state.pinned and back.site is site
    assert np.array_equal(back.xclp_labels, state.xclp_labels) and np.array_equal(back.xclp_weights, state.xclp_weights)
    assert np.array_equal(back.learner.predict(public.X), votes1)
    assert np.array_equal(back.learner.predict(site.X), state.learner.predict(site.X))
    # the next exchange from the restored learner is the one the kept learner makes (torch: the optimizer's
    # moments and the sampling generator came back too), so a restarted site repeats it bit for bit
    P = votes1
    a, _ = site_exchange(state, public, P, s.cfg, 2)
    b, _ = site_exchange(back, public, P, s.cfg, 2)
    assert np.array_equal(a, b)
    if learner in ("mlp", "cnn"):
        assert np.array_equal(state.learner.predict_proba(site.X), back.learner.predict_proba(site.X))

    suffix, body = model_file(back.learner)
    assert suffix == (".model.npz" if learner in ("mlp", "cnn") else ".model.skops")
    _no_pickle_inside(body)
    (tmp_path / f"job{suffix}").write_bytes(body)
    model = load_model_file(tmp_path / f"job{suffix}")
    assert np.array_equal(model.predict(site.X), back.learner.predict(site.X))


def test_a_single_class_site_and_an_untrained_network_restore_too():
    from xclp.training.models import make_learner
    from xclp.training.saved_learners import dump_learner, load_learner

    site, _ = _world()
    for name in ("tree", "logreg", "boosting"):
        one = make_learner(name, 16, 3).fit(site.X[:5], np.full(5, 2))
        assert np.array_equal(load_learner(dump_learner(one)).predict(site.X), np.full(len(site.X), 2))
    net = make_learner("mlp", 16, 3, seed=7, hidden=16, embed_dim=8)
    back = load_learner(dump_learner(net))
    assert back.model_ is None
    for h in (net, back):
        h.fit(site.X[:60], site.y[:60])
    assert np.array_equal(net.predict_proba(site.X), back.predict_proba(site.X))


def test_a_tampered_network_is_refused():
    from xclp.training.models import make_learner
    from xclp.training.saved_learners import dump_learner, load_learner
    from xclp.wire import dump_bundle, load_bundle

    site, _ = _world()
    net = make_learner("mlp", 16, 3, hidden=16, embed_dim=8).fit(site.X[:60], site.y[:60])
    b = load_bundle(dump_learner(net), ())
    bad = dict(b, **{"head.weight": np.zeros((2, 2), np.float32)})
    with pytest.raises(ProtocolError, match="head.weight"):
        load_learner(dump_bundle(bad))
    bad = dict(b, **{"head.bias": np.full(3, np.nan, np.float32)})
    with pytest.raises(ProtocolError, match="NaN"):
        load_learner(dump_bundle(bad))
    with pytest.raises(ProtocolError, match="unexpected"):
        load_learner(dump_bundle(dict(b, extra=np.zeros(1))))
