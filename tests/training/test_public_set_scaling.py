"""FedCT, FedKT and FREDY on raw-scale features (issue 34, part 2): every family's models take the run's
pooled standardisation — the site's own points AND the public set U, the same μ, σ at every site (else
the sites' predictions on U would be of different sets) — and so does the model they release.

The table has grams (~4,000) and years (~2008) whose per-site means differ, so a site-local μ, σ would
differ from the pooled one; what each strategy's site hook sees is recorded, in process (seconds)."""

import numpy as np
import pytest

from xclp.training import fedkt, fredy
from xclp.training.fedavg import Site
from xclp.training.fedct import FedCTConfig, FedCTStrategy
from xclp.training.fedkt import FedKTConfig, FedKTStrategy
from xclp.training.fredy import FREDYConfig, FREDYStrategy
from xclp.training.simulation import run_fedct, run_fedkt, run_fredy

SIZES = {"a": 30, "b": 45, "c": 25}
SHIFT = {"a": -300.0, "b": 0.0, "c": 400.0}  # each site's grams around its own mean: local μ ≠ pooled μ


def table(rng, n: int, shift: float = 0.0):
    """(X, y): body mass in grams, the year, and a bill length that tells the two classes apart."""
    y = rng.integers(0, 2, n)
    X = np.column_stack([rng.normal(4000 + shift + 600 * y, 300), rng.integers(2007, 2010, n).astype(float),
                         rng.normal(40 + 8 * y, 2.0)]).astype(np.float32)
    return X, y.astype(np.int64)


def sites_and_public(seed: int = 0):
    rng = np.random.default_rng(seed)
    sites = []
    for name, n in SIZES.items():
        X, y = table(rng, n, SHIFT[name])
        lab = y.copy()
        lab[n // 2:] = -1  # half unlabelled
        sites.append(Site(name, X, lab, y))
    U, _ = table(rng, 40)
    test = table(rng, 30)
    return sites, U, test


def pooled(sites):
    X = np.concatenate([s.X for s in sites]).astype(np.float64)
    return X.mean(axis=0), X.std(axis=0)


@pytest.fixture
def seen(monkeypatch):
    """Every site hook's inputs: (strategy family, site, its points, U) as the family's local round saw them."""
    got = []
    for cls in (FedCTStrategy, FedKTStrategy, FREDYStrategy):
        real = cls.local_round

        def spy(self, env, t, plan, real=real):
            got.append((self.family, env.site.name, np.array(env.site.X), np.array(env.public.X)))
            return real(self, env, t, plan)

        monkeypatch.setattr(cls, "local_round", spy)
    return got


def check_inputs(seen, sites, U, family: str):
    """Each site's points and U as its hook saw them: (x − μ)/σ by the POOLED μ, σ of all sites' points."""
    mu, sd = pooled(sites)
    rows = [r for r in seen if r[0] == family]
    assert {r[1] for r in rows} == set(SIZES)
    by_site = {s.name: s for s in sites}
    for _, name, X, public in rows:
        assert np.allclose(X, (by_site[name].X - mu) / sd, atol=1e-4), name
        assert np.allclose(public, (U - mu) / sd, atol=1e-4), name  # the same U at every site
    every = np.concatenate([X for _, name, X, _ in {r[1]: r for r in rows}.values()])
    assert np.allclose(every.mean(axis=0), 0, atol=1e-4) and np.allclose(every.std(axis=0), 1, atol=1e-3)


def test_fedct_learners_take_the_pooled_standardisation_of_their_points_and_of_u(seen):
    sites, U, test = sites_and_public()
    out = run_fedct(sites, U, test, 2, FedCTConfig(rounds=2, learners="logreg", seed=1))
    check_inputs(seen, sites, U, "fedct")
    mu, sd = pooled(sites)
    assert np.allclose(out["scaling"].mean, mu, atol=1e-3) and np.allclose(out["scaling"].std, sd, atol=1e-3)
    assert out["final_accuracy"] > 0.8  # scored on the test set scaled as the learners take points


def spy_fits(monkeypatch, module, name: str):
    """The points every learner `module.name` makes is fitted on."""
    fits = []
    real = getattr(module, name)

    def make(*a, **k):
        learner = real(*a, **k)
        fit = learner.fit
        learner.fit = lambda X, y, *aa, **kk: (fits.append(np.array(X)), fit(X, y, *aa, **kk))[1]
        return learner

    monkeypatch.setattr(module, name, make)
    return fits


def test_fedkt_teachers_students_and_the_released_model_take_the_pooled_standardisation(seen, monkeypatch):
    sites, U, test = sites_and_public(1)
    fits = spy_fits(monkeypatch, fedkt, "make_learner")
    out = run_fedkt(sites, U, test, 2, FedKTConfig(teacher="tree", student="tree", partitions=1, teachers=2, seed=3))
    check_inputs(seen, sites, U, "fedkt")
    mu, sd = pooled(sites)
    s = FedKTStrategy(FedKTConfig(partitions=1, teachers=2), 2, len(U))
    u2 = ((U - mu) / sd)[s.u2]
    # the released model (the last fit): on U2 scaled as the sites' students saw it, never on raw U
    assert len(fits[-1]) and all(np.isclose(u2, row, atol=1e-4).all(axis=1).any() for row in fits[-1])
    assert out["scaling"] is not None and np.allclose(out["scaling"].mean, mu, atol=1e-3)


def test_fredy_fedavg_rounds_teachers_and_student_take_the_pooled_standardisation(seen, monkeypatch):
    sites, U, test = sites_and_public(2)
    fits = spy_fits(monkeypatch, fredy, "make_learner")
    cfg = FREDYConfig(rounds=1, sites_per_round=3, local_epochs=1, model="mlp", student="tree", seed=2)
    out = run_fredy(sites, U, test, 2, cfg)
    check_inputs(seen, sites, U, "fredy")
    mu, sd = pooled(sites)
    (student_X,) = fits  # the student, on the labelled queries scaled as the teachers saw them
    queries = (U - mu) / sd
    assert all(np.isclose(queries, row, atol=1e-4).all(axis=1).any() for row in student_X)
    assert np.allclose(out["scaling"].std, sd, atol=1e-3)
