"""The lattice protocol's samplers, tested on exact integers — and the tests tested: every check here
fails on biased, truncated and low-bit-zeroed mutants of its sampler (issue 22 items 6 and 8).

Checks (tests/distributions.py: each with a false-failure budget of 1e-11, below 1e-9 with the χ²
approximation's slack):
  ternary secrets / u      χ² of the exact counts of −1, 0, 1 over 2^23 draws
  CBD(η) errors            χ² against Binomial(2η, 1/2) − η over 2^20 draws
  uniform polynomials      every one of the 108 bits fair, the top and low 8 bits of each word χ²-uniform
  flooding noise           f + 2^F (exact, from its two words): every bit 0 … F fair, the top 4 and
                           low 8 bits χ²-uniform, nothing at or above 2^(F+1)
  A's decrypted noise      the exact noise of a result ciphertext (2,048 coefficients) for y = 1…1 and
                           y = 0: every 4-bit window of noise + 2^F χ²-uniform (bits 0 … F), the two
                           y's χ²-homogeneous in the top 4 bits
  ρ (B's masks)            χ²-uniform on Z_t, every bit fair
  the AES-CTR keystream    every one of the 64 bits fair, the low and top bytes χ²-uniform

The randomness is fixed: rlwe.random_words (the os.urandom-keyed CSPRNG) is monkeypatched to an
AES-CTR keystream under a fixed key, so every test here is deterministic.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from distributions import ALPHA, bits_fair, chi2_fit, chi2_uniform, split_words
from scipy import stats

from crypto import lattice_hamming as lh
from crypto import rlwe, secure_sum
from crypto.secure_sum import prg_uint64

N = rlwe.N_DEFAULT
W = rlwe.WORD
MASK = rlwe.WORD_MASK
F = lh.lattice_params(1024).flood_bits

REAL = {name: getattr(rlwe, name) for name in ("sample_ternary", "sample_cbd", "uniform_poly", "sample_flood")}
REAL_RHO = lh.rho
REAL_PRG = secure_sum.prg_uint64


@pytest.fixture(autouse=True)
def fixed_keystream(monkeypatch):
    streams = itertools.count()
    monkeypatch.setattr(rlwe, "random_words", lambda count: prg_uint64(b"fixed-test-key".ljust(32, b"."), int(count),
                                                                       stream=next(streams)))


# -- the checks ------------------------------------------------------------------------------------


def check_ternary(alpha=ALPHA):
    s = rlwe.sample_ternary((1 << 23,))
    assert s.shape == (1 << 23,) and s.dtype == np.int64
    chi2_fit(s, [-1, 0, 1], [1 / 3] * 3, alpha, "ternary")


def check_cbd(alpha=ALPHA):
    eta = rlwe.ETA
    e = rlwe.sample_cbd((1 << 20,), eta)
    values = np.arange(-eta, eta + 1)
    chi2_fit(e, values, stats.binom.pmf(values + eta, 2 * eta, 0.5), alpha, "CBD")


def check_uniform_poly(alpha=ALPHA):
    a = rlwe.uniform_poly(b"u" * 32, 64, N, stream=5)
    assert a.shape == (2, 64, N)
    for i, word in enumerate(a):
        bits_fair(word, W, alpha / 6, f"uniform word {i}", offset=W * i)
        chi2_uniform(np.bincount((word >> (W - 8)).ravel(), minlength=256), alpha / 6, f"uniform word {i}: top 8 bits")
        chi2_uniform(np.bincount((word & 255).ravel(), minlength=256), alpha / 6, f"uniform word {i}: low 8 bits")


def _flood_offset(f: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """f + 2^bits mod 2^108 as exact words: the low word is unchanged (2^bits is a multiple of 2^54)."""
    return f[0], (f[1] + (1 << (bits - W))) & MASK


def check_flood(alpha=ALPHA, bits=F):
    f = rlwe.sample_flood((1 << 17,), bits)
    assert f.shape == (2, 1 << 17)
    lo, hi = _flood_offset(f, bits)
    top = bits + 1 - W  # bits of the high word in use
    bits_fair(lo, W, alpha / 4, "flooding, low word")
    bits_fair(hi, top, alpha / 4, "flooding, high word", offset=W)  # also: nothing at or above 2^(F+1)
    chi2_uniform(np.bincount(hi >> (top - 4), minlength=16), alpha / 4, "flooding: top 4 bits")
    chi2_uniform(np.bincount(lo & 255, minlength=256), alpha / 4, "flooding: low 8 bits")


def check_rho(alpha=ALPHA):
    log_t = 11
    r = lh.rho(b"r" * 32, 3, 4096, log_t)
    assert r.shape == (lh.SUB_BATCH, 4096)
    chi2_uniform(np.bincount(r.ravel(), minlength=1 << log_t), alpha / 2, "ρ")
    bits_fair(r, log_t, alpha / 2, "ρ")


def check_prg(alpha=ALPHA):
    """The AES-256-CTR keystream every mask and every sampler here reads (secure_sum.prg_uint64)."""
    w = secure_sum.prg_uint64(b"p" * 32, 1 << 18, stream=7).astype(np.uint64)
    assert w.shape == (1 << 18,)
    low, high = (w & np.uint64(0xFFFFFFFF)).astype(np.int64), (w >> np.uint64(32)).astype(np.int64)
    bits_fair(low, 32, alpha / 4, "keystream, low half")
    bits_fair(high, 32, alpha / 4, "keystream, high half", offset=32)
    chi2_uniform(np.bincount(low & 255, minlength=256), alpha / 4, "keystream: low byte")
    chi2_uniform(np.bincount(high >> 24, minlength=256), alpha / 4, "keystream: top byte")


def _packed(rng, n, L):
    return np.packbits(rng.integers(0, 2, (n, L)).astype(np.uint8), axis=1)


def decrypted_noise(L: int, y_row: int, n_a: int = N) -> list[int]:
    """The exact noise A decrypts from one result ciphertext of B (at q, before switching), for
    y = 1…1 or y = 0 against n_a random points of A."""
    rng = np.random.default_rng(11)
    x = _packed(rng, n_a, L)
    y = np.packbits(np.full((1, L), y_row, dtype=np.uint8), axis=1)
    proto = lh.LatticeHamming()
    pa, pb = proto.party_a(x, L), proto.party_b(y, L)
    hello = pa.receive(None).to_peer
    _, body = lh._open(hello, (lh.HELLO,), 1 << 30)
    _, cols = lh._open(pb._hello(body), (lh.COLS,), 1 << 30)
    pb._columns(cols)
    sums = np.unpackbits(y, axis=1, count=L).astype(np.float64) @ pb.matrix
    a, b = pb._finish(sums, np.array([int(y_row) * L]), 0)
    _, noise = proto._key.decrypt_noise(a, b)
    return noise


def nibbles_uniform(lo: np.ndarray, hi: np.ndarray, nbits: int, alpha: float, what: str) -> None:
    """Every window of 4 consecutive bits (0–3, 4–7, …) of the exact values lo + 2^54·hi below 2^nbits
    is χ²-uniform on its 16 values: a joint test, which catches what single bits cannot (bits that
    are each fair but all equal, as the sign extension of a small value is)."""
    windows = range(0, nbits - 3, 4)
    for start in windows:
        if start + 4 <= W:
            v = (lo >> start) & 15
        elif start >= W:
            v = (hi >> (start - W)) & 15
        else:  # straddles the words
            v = ((lo >> start) | (hi << (W - start))) & 15
        chi2_uniform(np.bincount(v, minlength=16), alpha / len(windows), f"{what}: bits {start}–{start + 3}")


def check_decrypted_noise(alpha=ALPHA, L=1024, n_a=2048):
    """Whatever y is, A's exact decrypted noise is the flooding's uniform distribution moved by less
    than 2^(−40) in total: every 4-bit window of noise + 2^F uniform, both y alike in the top bits."""
    bits = lh.lattice_params(L).flood_bits
    tops = []
    for y_row in (1, 0):
        u = [v + (1 << bits) for v in decrypted_noise(L, y_row, n_a)]
        assert min(u) >= 0 and max(u) < 1 << (bits + 2), "noise outside ±(2^F + its bound)"
        lo, hi = split_words(u, W)
        nibbles_uniform(lo, hi, bits + 1, alpha / 4, f"decrypted noise (y = {y_row})")
        tops.append(np.bincount(np.minimum(hi >> (bits + 1 - W - 4), 15), minlength=16))
    table = np.array(tops)
    table = table[:, table.sum(axis=0) > 0]
    p = stats.chi2_contingency(table)[1] if table.shape[1] > 1 else 0.0
    assert p > alpha / 2, f"decrypted noise: y = 1…1 and y = 0 differ (homogeneity p = {p:.3g})"


# -- the samplers pass ------------------------------------------------------------------------------


def test_ternary_secrets_are_uniform():
    check_ternary()
    assert not np.array_equal(rlwe.SecretKey.generate(rlwe.RLWEParams()).s, rlwe.SecretKey.generate(rlwe.RLWEParams()).s)


def test_centred_binomial_errors_have_the_binomial_distribution():
    check_cbd()
    assert np.abs(rlwe.sample_cbd((100_000,))).max() <= rlwe.ETA


def test_uniform_polynomials_are_uniform_and_reproducible_from_their_seed():
    check_uniform_poly()
    a = rlwe.uniform_poly(b"u" * 32, 2, N, stream=5)
    assert np.array_equal(a, rlwe.uniform_poly(b"u" * 32, 2, N, stream=5))
    assert not np.array_equal(a, rlwe.uniform_poly(b"u" * 32, 2, N, stream=6))


def test_flooding_noise_is_uniform_on_its_range():
    check_flood()
    check_flood(bits=lh.lattice_params(8192).flood_bits)


def test_the_masks_rho_are_uniform():
    check_rho()


def test_the_keystream_is_uniform():
    check_prg()


def test_decrypted_noise_does_not_depend_on_y():
    check_decrypted_noise()


# -- the mutants fail ---------------------------------------------------------------------------------


def _every(shape, k: int) -> np.ndarray:
    """A 0/1 pattern that marks one position in k."""
    return (np.arange(int(np.prod(shape))) % k == 0).reshape(shape)


def ternary_no_rejection(shape):
    """The modulo bias the real sampler avoids: bytes reduced mod 3 without rejecting 255."""
    count = int(np.prod(shape))
    raw = rlwe.random_words(count // 8 + 1).view(np.uint8)[:count]
    return ((raw % np.uint8(3)).astype(np.int64) - 1).reshape(shape)


TERNARY_MUTANTS = {
    "no rejection of 255": ternary_no_rejection,
    "biased": lambda shape: np.where(_every(shape, 64), 0, REAL["sample_ternary"](shape)),
    "truncated": lambda shape: np.minimum(REAL["sample_ternary"](shape), 0),
    "low bit zeroed": lambda shape: REAL["sample_ternary"](shape) & ~1,
}
CBD_MUTANTS = {
    "biased": lambda shape, eta=rlwe.ETA: REAL["sample_cbd"](shape, eta) + _every(shape, 16),
    "truncated": lambda shape, eta=rlwe.ETA: np.clip(REAL["sample_cbd"](shape, eta), -8, 8),
    "low bit zeroed": lambda shape, eta=rlwe.ETA: REAL["sample_cbd"](shape, eta) & ~1,
}
UNIFORM_MUTANTS = {
    "low 20 bits zeroed": lambda *a, **k: REAL["uniform_poly"](*a, **k) & ~((1 << 20) - 1),
    "truncated": lambda *a, **k: REAL["uniform_poly"](*a, **k) % (3 << (W - 2)),
    "biased": lambda *a, **k: (lambda x: x | ((x >> 7) & 1))(REAL["uniform_poly"](*a, **k)),
    "low bit zeroed": lambda *a, **k: REAL["uniform_poly"](*a, **k) & ~1,
}


def _flood_low_word_zeroed(shape, bits, key=None):
    f = REAL["sample_flood"](shape, bits, key)
    f[0] = 0
    return f


def _flood_low_bits_zeroed(shape, bits, key=None):
    f = REAL["sample_flood"](shape, bits, key)
    f[0] &= ~((1 << 20) - 1)
    return f


def _flood_biased(shape, bits, key=None):
    f = REAL["sample_flood"](shape, bits, key)
    f[1] |= 1  # bit 54 always set
    return f


FLOOD_MUTANTS = {
    "low word zeroed": _flood_low_word_zeroed,
    "truncated": lambda shape, bits, key=None: REAL["sample_flood"](shape, bits - 1, key),
    "biased": _flood_biased,
    "low 20 bits zeroed": _flood_low_bits_zeroed,
    "none": lambda shape, bits, key=None: np.zeros((2, *tuple(np.atleast_1d(shape))), dtype=np.int64),
}
RHO_MUTANTS = {
    "biased": lambda *a: REAL_RHO(*a) | _every((lh.SUB_BATCH, a[2]), 8),
    "truncated": lambda *a: REAL_RHO(*a) % ((1 << a[3]) - (1 << (a[3] - 2))),
    "low bit zeroed": lambda *a: REAL_RHO(*a) & ~1,
}


PRG_MUTANTS = {
    "low 20 bits zeroed": lambda *a, **k: REAL_PRG(*a, **k) & ~np.uint64((1 << 20) - 1),
    "truncated": lambda *a, **k: REAL_PRG(*a, **k) % np.uint64(3 << 62),
    "biased": lambda *a, **k: (lambda x: x | ((x >> np.uint64(7)) & np.uint64(1)))(REAL_PRG(*a, **k)),
}


@pytest.mark.parametrize("name", PRG_MUTANTS)
def test_the_keystream_check_catches(name, monkeypatch):
    monkeypatch.setattr(secure_sum, "prg_uint64", PRG_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_prg()


@pytest.mark.parametrize("name", TERNARY_MUTANTS)
def test_the_ternary_check_catches(name, monkeypatch):
    monkeypatch.setattr(rlwe, "sample_ternary", TERNARY_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_ternary()


@pytest.mark.parametrize("name", CBD_MUTANTS)
def test_the_cbd_check_catches(name, monkeypatch):
    monkeypatch.setattr(rlwe, "sample_cbd", CBD_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_cbd()


@pytest.mark.parametrize("name", UNIFORM_MUTANTS)
def test_the_uniform_polynomial_check_catches(name, monkeypatch):
    monkeypatch.setattr(rlwe, "uniform_poly", UNIFORM_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_uniform_poly()


@pytest.mark.parametrize("name", FLOOD_MUTANTS)
def test_the_flooding_check_catches(name, monkeypatch):
    monkeypatch.setattr(rlwe, "sample_flood", FLOOD_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_flood()


@pytest.mark.parametrize("name", RHO_MUTANTS)
def test_the_rho_check_catches(name, monkeypatch):
    monkeypatch.setattr(lh, "rho", RHO_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_rho()


@pytest.mark.parametrize("name", ["none", "low word zeroed", "truncated", "low 20 bits zeroed"])
def test_the_decrypted_noise_check_catches(name, monkeypatch):
    # The low word zeroed leaves noise ≡ (the y-dependent part) mod 2^54, which the old test — float64
    # values of about 2^68, top 5 bits binned — could not see.
    monkeypatch.setattr(rlwe, "sample_flood", FLOOD_MUTANTS[name])
    with pytest.raises(AssertionError):
        check_decrypted_noise()
