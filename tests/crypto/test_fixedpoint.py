"""Fixed-point encoding in Z_{2^64} (crypto.fixedpoint)."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.fixedpoint import check_bound, choose_frac_bits, decode, encode, precision


@pytest.mark.parametrize("f", [0, 8, 20, 32, 40])
def test_round_trip_within_precision(f):
    rng = np.random.default_rng(f)
    z = rng.normal(scale=1000.0, size=(50, 7))
    u = encode(z, f)
    assert u.dtype == np.uint64 and u.shape == z.shape
    assert np.max(np.abs(decode(u, f) - z)) <= 2.0 ** -(f + 1)


def test_negative_is_twos_complement():
    u = encode(np.array([-1.0, 1.0, -0.5]), 4)
    assert u.tolist() == [2**64 - 16, 16, 2**64 - 8]
    assert decode(u, 4).tolist() == [-1.0, 1.0, -0.5]


def test_sums_wrap_correctly():
    rng = np.random.default_rng(1)
    f = 30
    terms = rng.uniform(-100, 100, size=(10, 1000))
    check_bound(100.0, f, 10)
    total = np.zeros(1000, dtype=np.uint64)
    for t in terms:
        total += encode(t, f)
    assert np.max(np.abs(decode(total, f) - terms.sum(axis=0))) <= 10 * 2.0**-f


def test_rejects_nan_inf_and_large():
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ProtocolError):
            encode(np.array([1.0, bad]), 10)
    with pytest.raises(ProtocolError):
        encode(np.array([2.0**53]), 10)  # 2^63
    encode(np.array([2.0**52]), 10)  # 2^62 fits
    with pytest.raises(ProtocolError):
        decode(np.array([1, 2], dtype=np.int64), 10)
    with pytest.raises(ProtocolError):
        encode(np.array([1.0]), 63)
    with pytest.raises(ProtocolError):
        encode(np.array(["a"]), 10)


def test_check_bound_detects_overflow():
    check_bound(1.0, 40, 2**22)  # 2^62 < 2^63
    with pytest.raises(ProtocolError, match="wrap"):
        check_bound(1.0, 40, 2**23)  # exactly 2^63
    with pytest.raises(ProtocolError):
        check_bound(1000.0, 53, 2)
    # the overflow it guards against is real
    f, n = 40, 2**23
    total = np.zeros(1, dtype=np.uint64)
    one = encode(np.array([1.0]), f)
    total += one * np.uint64(n)
    assert decode(total, f)[0] < 0  # wrapped
    for bad in (dict(max_abs_total=np.nan), dict(max_abs_total=-1.0), dict(n_terms=0)):
        args = dict(max_abs_total=1.0, frac_bits=10, n_terms=3)
        args.update(bad)
        with pytest.raises(ProtocolError):
            check_bound(**args)


def test_choose_frac_bits():
    f = choose_frac_bits(1.0, 4)
    assert f == 52
    f = choose_frac_bits(1000.0, 100, max_frac_bits=62)
    check_bound(1000.0, f, 100)
    with pytest.raises(ProtocolError):
        check_bound(1000.0, f + 1, 100)
    with pytest.raises(ProtocolError):
        choose_frac_bits(2.0**62, 4)
    with pytest.raises(ProtocolError):
        choose_frac_bits(1e6, 1000, min_frac_bits=50)
    assert precision(10, 4) == 4 * 2.0**-11
