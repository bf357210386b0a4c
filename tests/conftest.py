import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def digits():
    from xclp.data import load_arrays

    return load_arrays("digits")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
