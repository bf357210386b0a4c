"""crypto.rlwe: known answers, exact arithmetic, the parameter check, and the samplers' distributions."""


import numpy as np
import pytest

from crypto import rlwe
from crypto.errors import ProtocolError

N = rlwe.N_DEFAULT
Q = 1 << rlwe.LOG_Q


def as_ints(x: np.ndarray) -> list[int]:
    return [int(lo) + (int(hi) << rlwe.WORD) for lo, hi in zip(x[0].ravel(), x[1].ravel())]


def schoolbook(x: list[int], s: list[int]) -> list[int]:
    """x · s in Z_q[X]/(X^N + 1), exactly, with Python integers (object arrays)."""
    full = np.convolve(np.array(x, dtype=object), np.array(s, dtype=object))
    return [(full[i] - (full[i + N] if i + N < len(full) else 0)) % Q for i in range(N)]


def test_negacyclic_product_is_exact_against_schoolbook():
    x = rlwe.uniform_poly(bytes(range(32)), 1, N)[:, 0]
    s = rlwe.sample_ternary((N,))
    got = rlwe.mul_ternary(x, rlwe.ternary_spectrum(s))
    assert as_ints(got) == schoolbook(as_ints(x), s.tolist())


def test_negacyclic_product_is_exact_at_the_largest_inputs():
    # Every coefficient q − 1 and s all ones: every sub-word product at its maximum N · (2^29 − 1).
    x = np.full((2, N), rlwe.WORD_MASK, dtype=np.int64)
    s = np.ones(N, dtype=np.int64)
    got = rlwe.mul_ternary(x, rlwe.ternary_spectrum(s))
    assert as_ints(got) == schoolbook(as_ints(x), s.tolist())


def test_arithmetic_mod_q_and_words_round_trip():
    rng = np.random.default_rng(0)
    a = rlwe.uniform_poly(b"a" * 32, 3, 16)
    b = rlwe.uniform_poly(b"b" * 32, 3, 16)
    assert as_ints(rlwe.add(a, b)) == [(u + v) % Q for u, v in zip(as_ints(a), as_ints(b))]
    small = rng.integers(-(2**40), 2**40, 48)
    assert as_ints(rlwe.from_int(small)) == [int(v) % Q for v in small]
    data = rlwe.words_to_bytes(a)
    assert len(data) == a[0].size * rlwe.COEFF_BYTES
    assert np.array_equal(rlwe.words_from_bytes(data, a[0].size).reshape(a.shape), a)
    bad = bytearray(data)
    bad[13] |= 0x10  # bit 108: a value ≥ q
    with pytest.raises(ProtocolError, match="2\\^108"):
        rlwe.words_from_bytes(bytes(bad), a[0].size)
    with pytest.raises(ProtocolError, match="bytes"):
        rlwe.words_from_bytes(data[:-1], a[0].size)


@pytest.mark.parametrize("log_t", [7, 11, 13])
def test_symmetric_encryption_known_answer_and_noise_bound(log_t):
    params = rlwe.RLWEParams(log_t=log_t)
    key = rlwe.SecretKey.generate(params)
    rng = np.random.default_rng(log_t)
    m = rng.integers(0, 1 << log_t, (2, N))
    a = rlwe.uniform_poly(b"s" * 32, 2, N)
    b = key.encrypt(a, m)
    got, noise = key.decrypt_noise(a, b)
    assert np.array_equal(got, m)
    assert max(abs(e) for e in noise) <= params.eta  # the fresh noise is e itself
    with pytest.raises(ProtocolError, match="\\[0, t\\)"):
        key.encrypt(a[:, :1], np.full((1, N), 1 << log_t))


def test_public_key_encryptions_of_zero_and_modulus_switching():
    params = rlwe.RLWEParams(log_t=11)
    key = rlwe.SecretKey.generate(params)
    pk = key.public_key(b"p" * 32, stream=3)
    a, b = pk.encrypt_zero(3)
    m, noise = key.decrypt_noise(a, b)
    assert not m.any()
    assert max(abs(e) for e in noise) <= 2 * N * params.eta + params.eta  # e_pk·u + e2·s + e1
    # Δ·m added to b survives switching to 2^24 and decrypts there.
    msg = np.random.default_rng(1).integers(0, 1 << 11, (3, N))
    b = rlwe.normalise(b[0], b[1] + (msg << (params.delta_shift - rlwe.WORD)))
    got, small_noise = key.decrypt_switched(rlwe.mod_switch(a, 24), rlwe.mod_switch(b, 24), 24)
    assert np.array_equal(got, msg)
    assert np.abs(small_noise).max() <= (N + 1) // 2 + 1


def test_parameters_below_the_security_standard_are_refused():
    rlwe.check_security(4096, 108, 21)
    with pytest.raises(ProtocolError, match="exceeds 54"):
        rlwe.RLWEParams(n=2048)  # q = 2^108 needs N ≥ 4096 for 128 bits
    with pytest.raises(ProtocolError, match="not in the HE security standard"):
        rlwe.RLWEParams(n=3000)
    with pytest.raises(ProtocolError, match="σ"):
        rlwe.RLWEParams(eta=4)
    with pytest.raises(ProtocolError, match="exceeds 109"):
        rlwe.check_security(4096, 110, 21)
    assert rlwe.MAX_LOG_Q_128[4096] == 109


# The samplers' distributions (ternary, CBD, uniform, flooding), on exact integers and with mutants
# that the checks must catch: tests/crypto/test_sampler_distributions.py.


def test_flooding_bits_are_range_checked():
    with pytest.raises(ProtocolError):
        rlwe.sample_flood((4,), 107)
    with pytest.raises(ProtocolError):
        rlwe.sample_flood((4,), rlwe.WORD)
