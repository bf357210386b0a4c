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
