"""What a Flower site's message imports. Flower's deployment runtime starts a ClientApp process for every
message, and each one imports the ClientApp's modules afresh: torch (~2 CPU-s) and dp_accounting with the
SciPy it loads (~2 CPU-s) are imported where a network is built or an event accounted, never by the
modules themselves (xclp.training.models, xclp.privacy.ledger), and scipy.sparse (~0.2 CPU-s) where a
matrix is made (xclp.graph, xclp.push). A prediction message needs none of them until its site builds
its graph, nor does a training run's hello, its statistics or a run without DP noise."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "dp_accounting", "scipy.stats", "scipy.optimize", "scipy.sparse")

# a fresh interpreter: this one has imported them long ago (the other tests)
PROBE = f"""
import sys
import xclp_flower.client_app, xclp_flower.training_site, xclp.training_job, xclp.training.algorithms
from xclp.privacy.ledger import PrivacyLedger
from xclp.training.algorithms import strategy_for
from xclp.training.models import make_learner

assert PrivacyLedger(1e-5).epsilon() is None  # nothing spent: nothing to account
strategy_for("fedct", {{"learners": "tree", "rounds": 2}}, 10, 3, n_public=100)
strategy_for("fedavg", {{"model": "mlp", "rounds": 2}}, 10, 3, n_features=64)  # (its network is built lazily)
print(" ".join(m for m in {HEAVY!r} if m in sys.modules))
make_learner("tree", 64, 10)  # scikit-learn: SciPy's statistics come with it, torch must not
print(" ".join(m for m in ("torch", "dp_accounting") if m in sys.modules))
"""


def test_a_flower_sites_modules_import_neither_torch_nor_the_privacy_accountant():
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    modules, learner = (r.stdout + "\n").split("\n")[:2]
    assert modules.split() == [], f"imported with the ClientApp's modules: {modules}"
    assert learner.split() == [], f"imported with a tree learner: {learner}"
