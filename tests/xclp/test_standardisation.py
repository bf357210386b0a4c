"""Federated standardisation (JobParams.standardize): the moments ride on the label-count secure sum,
every site scales its features to ALL sites' mean and variance, exactly as pooled standardisation
would, and the coordinator sees only masked limbs."""

import numpy as np
import pytest

from crypto.fixedpoint import from_limbs, to_limbs
from xclp.announce import decode_roster, encode_roster
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.protocol import SiteSession
from xclp.simulation import run_xclp, split_by_site
from xclp.splits import simulate_sites
from xclp.standardisation import counts_length


def test_wide_fixed_point_sums_exactly_past_64_bits():
    rng = np.random.default_rng(0)
    parts = [rng.normal(0, 1e6, 50) ** 2 for _ in range(5)]  # sums of squares near 2^50 each
    total = sum(to_limbs(p, 32) for p in parts)  # uint64 limb-wise, as the masked sum adds them
    assert np.allclose(from_limbs(total, 32), np.sum(parts, axis=0), rtol=1e-15, atol=2**-30)
    assert from_limbs(to_limbs([-3.25], 32), 32)[0] == -3.25
    with pytest.raises(Exception, match="does not fit"):
        to_limbs([2.0**70], 32)


def sessions(ds, params):
    rows = split_by_site(ds)
    out = {s: SiteSession(params, s, ds.X[rows[s]], ds.y[rows[s]]) for s in ds.sites}
    roster = encode_roster([x.announce() for x in out.values()])
    for x in out.values():
        x.set_roster(decode_roster(roster))
    sent = {s: x.seed_messages() for s, x in out.items()}
    for s, x in out.items():
        x.receive_seed({p: sent[p][s] for p in out if p != s}, participants=ds.sites)
    return out


@pytest.mark.parametrize("crypto", ["plaintext", "lattice"])
def test_federated_standardisation_equals_pooled_and_the_server_sees_only_masks(crypto):
    from crypto.secure_sum import server_sum
    from xclp.wire import load_array

    X, y = load_arrays("digits", limit=240, seed=3)
    X = X * np.linspace(0.5, 40, X.shape[1]) + np.linspace(-100, 100, X.shape[1])  # scales far apart
    ds = simulate_sites(X, y, 3, "dirichlet:0.5", 0.2, seed=3)
    params = JobParams(job_id="std", n_classes=10, bits=64, k=6, crypto=crypto, standardize=True).validate()
    sess = sessions(ds, params)
    parts = {s: x.counts_message(ds.sites) for s, x in sess.items()}
    total = server_sum([load_array(p, dtype=np.uint64) for p in parts.values()])
    from xclp.wire import dump_array

    for x in sess.values():
        x.receive_counts(dump_array(total))
    mean, std = X.mean(axis=0), X.std(axis=0)
    std[std**2 <= 1e-12 * np.maximum(1.0, mean**2)] = 1.0  # a constant feature (both: rounding noise), centred
    rows = split_by_site(ds)
    for s, x in sess.items():
        assert np.allclose(x.feature_mean, mean, rtol=1e-9, atol=1e-9)
        assert np.allclose(x.feature_std, std, rtol=1e-9, atol=1e-9)
        assert np.allclose(x.X, (ds.X[rows[s]] - mean) / std, rtol=1e-9, atol=1e-9)
    assert total.size == counts_length(params, X.shape[1])
    if crypto != "plaintext":  # the coordinator's total is masked by the sites' shared mask
        one = from_limbs(total[10:13], 32)[0]
        assert one != X.shape[0]


def test_a_standardised_job_labels_like_lsh_on_pooled_standardised_features():
    X, y = load_arrays("digits", limit=300, seed=1)
    X = X * np.linspace(0.1, 50, X.shape[1])
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=1)
    on = run_xclp(ds, JobParams(job_id="s", n_classes=10, bits=256, k=8, standardize=True, crypto="plaintext"), seed=2)
    mean, std = X.mean(axis=0), X.std(axis=0)
    std[std**2 <= 1e-12 * np.maximum(1.0, mean**2)] = 1.0
    pooled = ds.__class__(**{**ds.__dict__, "X": (X - mean) / std}) if hasattr(ds, "__dict__") else None
    ref = run_xclp(pooled, JobParams(job_id="s", n_classes=10, bits=256, k=8, crypto="plaintext", standardize=False),
                   seed=2)
    agree = np.mean(np.concatenate([on.predictions[s].labels == ref.predictions[s].labels for s in ds.sites]))
    assert agree > 0.99  # the same hyperplanes over features equal to 1e-9: the same codes but for ties
