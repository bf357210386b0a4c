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
