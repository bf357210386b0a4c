"""The secure pipeline end to end, in process: exact against plaintext, and what the coordinator
receives in the summation phases is uniform noise that reveals the scores only in combination."""

import numpy as np
import pytest
from scipy.stats import chisquare

from crypto.fixedpoint import decode
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.simulation import run_xclp
from xclp.splits import simulate_sites
from xclp.wire import load_array


@pytest.fixture(scope="module")
def ds():
    X, y = load_arrays("digits", limit=180, seed=9)
    return simulate_sites(X, y, 3, "dirichlet:1.0", 0.2, seed=9)


def params(crypto, **kw):
    return JobParams(job_id="sec", n_classes=10, bits=96, k=5, crypto=crypto, key_bits=1024, **kw)


@pytest.mark.parametrize("crypto", ["ot", "paillier", "lattice"])
def test_secure_runs_equal_the_plaintext_run(ds, crypto, small_paillier):  # (1024-bit keys: quick)
    plain = run_xclp(ds, params("plaintext"), seed=5)
    secure = run_xclp(ds, params(crypto), seed=5)
    assert np.array_equal(plain.labels, secure.labels)
    assert np.array_equal(plain.confidence, secure.confidence)
    assert secure.bytes["by_phase"]["hamming"] > plain.bytes["by_phase"]["hamming"]


def coordinator_inputs(ds, seed):
    seen = {}

    def tap(party, phase, data):
        if party != "coordinator" and phase in ("counts", "row_sums"):
            seen[(party, phase)] = data

    res = run_xclp(ds, params("ot"), seed=seed, tap=tap)
    return seen, res


def test_what_the_coordinator_sums_is_uniform_and_fresh(ds):
    seen, _ = coordinator_inputs(ds, 1)
    again, _ = coordinator_inputs(ds, 1)  # same inputs, same seed: new keys, new masks
    top_bytes = []
    for s in ds.sites:
        rows = load_array(seen[(s, "row_sums")], dtype=np.uint64)
        sent = rows[np.any(rows != 0, axis=1)]  # own rows are zeroed, the others carry masked scores
        assert sent.size and not np.array_equal(rows, load_array(again[(s, "row_sums")], dtype=np.uint64))
        top_bytes.append((sent >> np.uint64(56)).astype(np.int64).ravel())
    top = np.concatenate(top_bytes)
    assert chisquare(np.bincount(top, minlength=256)).pvalue > 1e-4
    # The counts total the coordinator computes is masked too (only the sites can unmask it).
    total = sum(load_array(seen[(s, "counts")], dtype=np.uint64) for s in ds.sites)
    assert not np.array_equal(total, np.bincount(ds.y[ds.y >= 0], minlength=10).astype(np.uint64))


def test_masked_rows_reveal_scores_only_in_combination(ds):
    seen, res = coordinator_inputs(ds, 2)
    site = ds.sites[0]
    rows = np.arange(int((ds.site == site).sum()))  # the first site's rows lead the graph's layout
    parts = {s: load_array(seen[(s, "row_sums")], dtype=np.uint64) for s in ds.sites}
    assert not parts[site][rows].any()  # a site never sends its own rows
    # one other site's part alone decodes to noise, far from any probability vector
    alone = decode(parts[ds.sites[1]][rows], 40)
    assert np.abs(alone).max() > 1e3
    # the others' parts summed are still masked by `site`'s own mask: noise too
    summed = decode(sum(parts[s][rows] for s in ds.sites[1:]), 40)
    assert np.abs(summed).max() > 1e3
    # ... while the site itself, adding its kept share, got valid scores: labels for every point
    assert (res.predictions[site].labels >= 0).mean() > 0.9


def test_lattice_labels_equal_plaintext_across_seeds_and_lengths():
    # The default protocol: identical labels and confidences at several L (one site of one point too).
    X, y = load_arrays("digits", limit=150, seed=3)
    lone = simulate_sites(X, y, 3, "dirichlet:0.3", 0.2, seed=3)
    lone.site[np.flatnonzero(lone.site == lone.sites[0])[1:]] = lone.sites[1]  # the first site keeps one point
    for bits, seed in ((16, 1), (300, 2), (1024, 3)):
        p = dict(job_id="lat", n_classes=10, bits=bits, k=5)
        plain = run_xclp(lone, JobParams(crypto="plaintext", **p), seed=seed)
        secure = run_xclp(lone, JobParams(crypto="lattice", **p), seed=seed)
        assert np.array_equal(plain.labels, secure.labels) and np.array_equal(plain.confidence, secure.confidence)
