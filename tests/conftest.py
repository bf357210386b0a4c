import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):  # the project, and tests/svc.py (helpers shared by service tests)
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def digits():
    from xclp.data import load_arrays

    return load_arrays("digits")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def small_paillier(monkeypatch):
    """1024-bit Paillier keys (the protocol refuses them outside tests unless asked): key generation in a
    second instead of several."""
    import crypto.paillier_hamming as ph

    init = ph.PaillierHamming.__init__

    def patched(self, key_bits=2048, *a, **kw):
        kw["insecure_test_key_bits"] = True
        return init(self, 1024, *a, **kw)

    monkeypatch.setattr(ph.PaillierHamming, "__init__", patched)


# The modules that take a minute or more (serial, idle machine), long first: they start first on the
# workers (see pytest_collection_modifyitems and pytest_configure). Each worker takes two modules at
# once (xdist's loadscope gives a worker its next module while it has ≤ 2 tests left: worker i gets the
# i-th and (i+3)-th), so the three Flower deployment modules stand 1st, 5th and 9th: on three workers,
# and not all three deployments at t = 0 (runs at once on 2 cores came near their timeout under load).
LONG_MODULES = ("tests/flower/test_flower_deployment.py", "tests/service/test_training_e2e_public.py",
                "tests/service/test_training_e2e_votes.py", "tests/service/test_train_demo.py",
                "tests/flower/test_flower_deployment_fedavg.py", "tests/service/test_training_e2e.py",
                "tests/service/test_e2e.py", "tests/flower/test_flower_training.py",
                "tests/flower/test_flower_deployment_fedct.py",
                # (unmeasured here: its previous-release in-flight test runs on PostgreSQL too again, four
                # process clusters in all — the 116 s one among them — where it used to start with the rest)
                "tests/service/test_migrations.py", "tests/service/test_demo.py",
                "tests/service/test_dashboard_browser.py", "tests/training/test_fredy.py",
                "tests/service/test_site_ledger_e2e.py", "tests/service/test_cli_e2e.py",
                "tests/service/test_readme_commands.py", "tests/training/test_fedkt.py")


def pytest_configure(config):
    """xdist (≥ 3.6) hands out loadscope's modules by their number of tests, most first
    (`--loadscope-reorder`, on by default), not in collection order: the long modules ordered first
    below, most of which hold one to four tests, went out late — the Flower deployment's ~11 minutes
    81st of 133 modules, test_train_demo's 119th — and the suite ended on them. Collection order it is
    (what --no-loadscope-reorder asks for), whatever the command line."""
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """`make test` runs the suite on pytest-xdist workers (`-n 3 --dist loadscope`: the suite waits on
    processes much of the time, and a module's tests stay on one worker so that what the module builds
    once for all of them — a Flower deployment, a fitted pipeline, keys — is built once). xdist's
    scheduler keys tests by node id, so tests that share one would run only once: schemathesis gives
    every operation of test_openapi the test's id (the operation is only in the item's name). Such
    tests get their name as their id."""
    from collections import Counter

    # The long modules first: xdist hands out modules in collection order (pytest_configure sees to it),
    # so the suite does not end waiting on a long module begun late. loadscope keeps a module on one
    # worker: long tests that share no module fixture live in modules of their own (test_training_e2e /
    # _public / _votes, test_demo / test_train_demo) so that the workers can take them at once; the
    # Flower deployment's runs too, each module starting a deployment of its own (tests/flower_cluster.py).
    first = {m: i for i, m in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: first.get(item.nodeid.partition("::")[0], len(first)))  # stable
    ids = Counter(item.nodeid for item in items)
    for item in items:
        if ids[item.nodeid] > 1:
            if hasattr(item, "_id"):  # pytest ≥ 9.2 keeps the id as a structured NodeId
                item._id = item.parent.id.child(item.name)
            else:
                item._nodeid = f"{item.parent.nodeid}::{item.name}"
