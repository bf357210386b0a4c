"""bench.scale's exact reference (the all-pairs graph and S Y of one party) is what the jobs compute:
the 60,000-point comparisons of issue 23 (labels identical, recall@10) are only meaningful against it.
It once hashed the raw points while the jobs hash them after federated standardisation, and every
figure measured against it was wrong without any error."""

import numpy as np
import pytest

from xclp.data import FASHION_MNIST_DIR


@pytest.mark.skipif(not FASHION_MNIST_DIR.exists(), reason="Fashion-MNIST not installed (.ci/run installs it)")
def test_the_reference_gives_exact_xclps_labels(tmp_path, monkeypatch):
    import bench.scale as bs
    from xclp.simulation import run_xclp

    monkeypatch.setattr(bs, "CACHE", tmp_path)
    n = 500
    ds = bs.dataset(n, 0)
    ref = bs.reference(n, 0)
    res = run_xclp(ds, bs.params("exact"), seed=0)
    assert np.array_equal(res.labels, ref["labels"])
