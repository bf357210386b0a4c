"""Ring-LWE encryption, additive only (BFV-style), with coefficient packing: the minimal scheme that
the lattice Hamming protocol (crypto.lattice_hamming) needs, and nothing more.

(About 500 lines: key generation, encryption, decryption and their saved keys kept beside the noise
bounds they share, so that every parameter the security argument names is defined in one place.)

No library on the package registries exposes the ciphertext coefficients as arrays that a dense
matrix product can work on (tenseal hides them behind per-ciphertext calls; openfhe's wheels do not
import on CPython 3.11), so the scheme is written here, kept to key generation, encryption,
re-randomisation, modulus switching and decryption. Every formula below is the textbook one
(Lyubashevsky–Peikert–Regev 2010; Brakerski 2012 / Fan–Vercauteren 2012 for the scaling by Δ).

The ring and the plaintext
--------------------------
    R = Z[X] / (X^N + 1),  R_q = R / qR,  N = 4096,  q = 2^108,  t = 2^w (w = bit length of L, so t > L)
    Δ = q / t (exact: q and t are powers of two)

A plaintext m ∈ R_t is a vector of N values in Z_t, one per coefficient ("coefficient packing"):
adding ciphertexts adds the messages coefficient by coefficient, which is all the protocol needs.

Keys and encryption
-------------------
    secret key   s ← {−1, 0, 1}^N uniform (ternary)
    symmetric    a ← R_q uniform (expanded from a public seed),  e ← χ,  ct = (a, b = −a·s + e + Δ·m)
    public key   p1 ← R_q uniform (from the seed),  p0 = −p1·s + e_pk,  pk = (p0, p1)
    Enc_pk(0)    u ← {−1, 0, 1}^N,  e1, e2 ← χ,  ct = (a = p1·u + e2, b = p0·u + e1)
    decrypt      v = b + a·s = Δ·m + noise (mod q),  m = ⌊t·v / q⌉ mod t,  correct while |noise| < Δ/2
    mod switch   q → q' = 2^k':  c ↦ ⌊c · q'/q⌉ (both parts); the noise becomes noise·q'/q plus a
                 rounding term |ε_b + ε_a·s| ≤ 1/2 + N/2 (ternary s), and Δ' = q'/t stays exact.

χ is the centred binomial distribution CBD(η) = Σ_{i<η} (b_i − b'_i) over fair bits, η = 21:
σ = √(η/2) ≈ 3.24, at least the σ = 8/√(2π) ≈ 3.19 that the standard's tables assume, and bounded
by η, which the flooding bound of the protocol needs. (Kyber samples its errors the same way.)

Security: the HomomorphicEncryption.org security standard (Albrecht et al., "Homomorphic Encryption
Security Standard", 2018, Table 1, ternary secrets, σ ≈ 3.2, classical 128-bit security) allows
log2 q ≤ 27, 54, 109, 218, 438, 881 for N = 1024 … 32768. N = 4096 with log2 q = 108 ≤ 109 is
within it; :func:`check_security` refuses anything outside the table (any N not in it, a larger q,
a smaller η). The standard's estimates depend on the size of q, not its factorisation: a
power-of-two q (as TFHE, NTRU and Saber use) is covered, and lets Δ, mod switching and the
arithmetic below be exact shifts and masks.

Randomness: secrets, errors, u and flooding noise come from AES-256-CTR keyed with os.urandom
(crypto.secure_sum.prg_uint64), never from numpy's generator — or keyed with a key the caller drew
once from os.urandom and keeps (`key=` / `noise_key=`), so that a party saved as its key redraws
them byte for byte after a restore. The uniform polynomials a and p1 are
public and expanded from a 32-byte seed with the same PRG, so they travel as the seed alone.

Arithmetic
----------
An element of R_q is two int64 arrays of 54-bit words, ``x = lo + 2^54 · hi`` (a :class:`Poly`
array has shape (2, ..., N)). q = 2^108 (not 2^86 as before) because the protocol's flooding noise
must cover the re-randomisation noise and every ciphertext of a job (crypto.lattice_hamming,
:func:`~crypto.lattice_hamming.lattice_params`), which needs F ≈ 91 bits of noise below Δ/2.
Dense products with a 0/1 matrix (the protocol's sums) cut each element into three 36-bit parts, so
that sums of up to 8192 terms stay below 2^49 < 2^53 (exact in float64). Products with ternary
polynomials (s, u) use a negacyclic FFT: x is cut into four sub-words of 27 bits, so every output of
the exact integer product is below N · 2^27 = 2^39 and float64 rounding stays far below 1/2 (checked
on every product: an imprecise product raises rather than returning a wrong ciphertext).
Everything here is single-threaded (BLAS aside); the protocol runs batches on several threads.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from crypto.errors import ProtocolError
from crypto.secure_sum import prg_uint64

WORD = 54
WORD_MASK = (1 << WORD) - 1
LOG_Q = 2 * WORD  # q = 2^108: two 54-bit words
N_DEFAULT = 4096
ETA = 21
# HomomorphicEncryption.org standard (2018), Table 1: ternary secret, σ ≈ 3.2, classical 128 bits.
MAX_LOG_Q_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
STANDARD_SIGMA = 8 / math.sqrt(2 * math.pi)  # ≈ 3.19
MAX_FFT_ERROR = 0.25  # an FFT product further than this from an integer is refused
CHECK_STRIDE = 7  # one output in 7 of every FFT product is checked against that bound


def check_security(n: int, log_q: int, eta: int) -> None:
    """Refuse parameters below 128-bit classical security by the HE standard's table."""
    if n not in MAX_LOG_Q_128:
        raise ProtocolError(f"ring dimension N = {n} is not in the HE security standard's table {sorted(MAX_LOG_Q_128)}")
    if not 1 <= log_q <= MAX_LOG_Q_128[n]:
        raise ProtocolError(f"log2 q = {log_q} exceeds {MAX_LOG_Q_128[n]}, the HE security standard's bound for "
                            f"128-bit security at N = {n}")
    if math.sqrt(eta / 2) < STANDARD_SIGMA:
        raise ProtocolError(f"error parameter η = {eta} gives σ = {math.sqrt(eta / 2):.2f} < {STANDARD_SIGMA:.2f}, "
                            "the standard deviation the HE security standard assumes")


@dataclass(frozen=True)
class RLWEParams:
    """N, q = 2^108 and t = 2^log_t. Constructing one checks it against the security standard."""

    n: int = N_DEFAULT
    log_t: int = 11
    eta: int = ETA
    log_q: int = LOG_Q

    def __post_init__(self):
        if self.log_q != LOG_Q:
            raise ProtocolError(f"this implementation works modulo q = 2^{LOG_Q}, got log2 q = {self.log_q}")
        check_security(self.n, self.log_q, self.eta)
        if not 1 <= self.log_t <= 30:
            raise ProtocolError(f"log2 t must be in 1..30, got {self.log_t}")

    @property
    def delta_shift(self) -> int:
        return self.log_q - self.log_t  # Δ = 2^delta_shift


# -- randomness ----------------------------------------------------------------------------------


def random_words(count: int) -> np.ndarray:
    """`count` uint64 words of AES-256-CTR keystream under a fresh os.urandom key (a CSPRNG)."""
    return prg_uint64(os.urandom(32), int(count))


def _words(count: int, key: bytes | None, stream: int = 0) -> np.ndarray:
    """random_words, or the keystream under an injected 32-byte `key` (its `stream`): a party that
    keys its draws can be saved as its key and redraw them byte for byte after a restore
    (crypto.lattice_hamming)."""
    return random_words(count) if key is None else prg_uint64(key, int(count), stream=stream)


def subkey(key: bytes, *label) -> bytes:
    """An independent 32-byte key for one use of `key` (SHA-256 of a domain tag, the key and the
    length-prefixed label parts): every draw of a keyed party has its own."""
    h = hashlib.sha256(b"xclp/rlwe/subkey/v1" + bytes(key))
    for part in label:
        b = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(b).to_bytes(4, "big") + b)
    return h.digest()


def sample_ternary(shape, key: bytes | None = None) -> np.ndarray:
    """Uniform in {−1, 0, 1} (int64): bytes below 255 reduced mod 3 (255 = 3 · 85, so no bias)."""
    count = int(np.prod(shape))
    parts, have, draw = [], 0, 0
    while have < count:
        more = (count - have) // 8 + 64
        raw = _words(more, key, draw).view(np.uint8)  # 255 is rejected: 1 byte in 256
        draw += 1
        raw = raw[raw < 255][: count - have]
        parts.append(raw)
        have += raw.size
    out = (np.concatenate(parts) if len(parts) > 1 else parts[0]) % np.uint8(3)
    return (out.astype(np.int64) - 1).reshape(shape)


def sample_cbd(shape, eta: int = ETA, key: bytes | None = None) -> np.ndarray:
    """Centred binomial CBD(η): popcount of η fair bits minus popcount of η others (int64)."""
    if not 1 <= eta <= 32:
        raise ProtocolError(f"η must be in 1..32, got {eta}")
    count = int(np.prod(shape))
    w = _words(count, key)
    mask = np.uint64((1 << eta) - 1)
    pos = np.bitwise_count(w & mask).astype(np.int64)
    neg = np.bitwise_count((w >> np.uint64(32)) & mask).astype(np.int64)
    return (pos - neg).reshape(shape)


def uniform_poly(seed: bytes, count: int, n: int, stream: int = 0) -> np.ndarray:
    """`count` uniform elements of R_q expanded from a public 32-byte seed: shape (2, count, n)."""
    w = prg_uint64(seed, 2 * count * n, stream=stream).reshape(2, count, n)
    return (w >> np.uint64(64 - WORD)).astype(np.int64)


def sample_flood(shape, bits: int, key: bytes | None = None) -> np.ndarray:
    """Uniform integers in [−2^bits, 2^bits) as words (2, *shape) of an element of R_q (mod 2^108)."""
    if not WORD < bits < LOG_Q - 1:
        raise ProtocolError(f"flooding bits must be in {WORD + 1}..{LOG_Q - 2}, got {bits}")
    count = int(np.prod(shape))
    w = _words(2 * count, key).reshape(2, count)
    lo = (w[0] >> np.uint64(64 - WORD)).astype(np.int64)
    hi = (w[1] >> np.uint64(64 - (bits + 1 - WORD))).astype(np.int64) - (1 << (bits - WORD))
    return normalise(lo, hi).reshape((2, *tuple(np.atleast_1d(shape))))


# -- arithmetic modulo 2^108 in two 54-bit words ---------------------------------------------------


def normalise(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Words (lo + 2^54 hi) with any int64 lo, hi (|lo| < 2^62) reduced to [0, 2^54) each, mod 2^108."""
    lo, hi = np.broadcast_arrays(lo, hi)
    out = np.empty((2, *lo.shape), dtype=np.int64)
    np.right_shift(lo, WORD, out=out[1])  # the carry: floor division, right for negative lo too
    out[1] += hi
    out[1] &= WORD_MASK
    np.bitwise_and(lo, WORD_MASK, out=out[0])
    return out


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return normalise(x[0] + y[0], x[1] + y[1])


def from_int(values: np.ndarray) -> np.ndarray:
    """Small signed integers (|v| < 2^62) as elements of R_q."""
    v = np.asarray(values, dtype=np.int64)
    return normalise(v, np.zeros_like(v))


def to_signed(x: np.ndarray) -> list[int]:
    """Exact centred representatives in (−q/2, q/2] as Python ints (for tests and small arrays)."""
    q = 1 << LOG_Q
    out = []
    for lo, hi in zip(x[0].ravel().tolist(), x[1].ravel().tolist()):
        v = lo + (hi << WORD)
        out.append(v - q if v > q // 2 else v)
    return out


def mod_switch(x: np.ndarray, log_q_out: int) -> np.ndarray:
    """⌊x · 2^k / 2^108⌉ mod 2^k for k = log_q_out ≤ 53 (int64). Only the high word matters: the low
    word adds less than one unit below the rounding position, which cannot cross it."""
    if not 1 <= log_q_out <= WORD - 1:
        raise ProtocolError(f"switching target must be 1..{WORD - 1} bits, got {log_q_out}")
    d = LOG_Q - log_q_out - WORD  # ≥ 1
    return ((x[1] + (1 << (d - 1))) >> d) & ((1 << log_q_out) - 1)


PART = 36  # for dense 0/1 products: an element of R_q as three parts of 36 bits (sums of 8192 stay < 2^49)
MAX_PART_TERMS = 1 << (53 - PART)  # 2^17 terms of a 0/1 product are exact in float64


def to_parts(x: np.ndarray) -> np.ndarray:
    """Words (2, ...) → three 36-bit parts (3, ...) as float64: bits 0–35, 36–71, 72–107."""
    mask, half = (1 << PART) - 1, (1 << (PART - WORD // 3)) - 1  # half: the 18 low bits of hi
    out = np.empty((3, *x.shape[1:]), dtype=np.float64)
    out[0] = x[0] & mask
    out[1] = (x[0] >> PART) | ((x[1] & half) << (WORD - PART))
    out[2] = x[1] >> (2 * PART - WORD)
    return out


def from_part_sums(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """Exact sums of parts (int64, 0 ≤ s < 2^53) → words mod 2^108: s0 + 2^36 s1 + 2^72 s2."""
    low = 2 * PART - WORD  # 18: the bits of s1 that stay in the low word
    lo = s0 + ((s1 & ((1 << low) - 1)) << PART)
    hi = (s1 >> low) + ((s2 & ((1 << PART) - 1)) << low)
    return normalise(lo, hi)


# -- negacyclic products with ternary polynomials (FFT) ------------------------------------------


@lru_cache(maxsize=8)
def _twist(n: int) -> tuple[np.ndarray, np.ndarray]:
    w = np.exp(1j * np.pi * np.arange(n // 2) / n)
    return w, np.conj(w)


def _spectrum(x: np.ndarray) -> np.ndarray:
    """Evaluate real polynomials (..., N) at N/2 roots of X^N + 1 (the other half are conjugates):
    fold x_j + i·x_{j+N/2}, twist by ω^j (ω = e^{iπ/N}), unnormalised inverse DFT of size N/2."""
    n = x.shape[-1]
    h = n // 2
    folded = np.empty(x.shape[:-1] + (h,), dtype=np.complex128)
    folded.real = x[..., :h]
    folded.imag = x[..., h:]
    folded *= _twist(n)[0]
    import scipy.fft  # here, not at the top: ~0.3 s of imports (scipy.special) that every Flower message's
    # fresh ClientApp process paid, lattice job or not (xclp.prediction_job imports this module)

    return scipy.fft.ifft(folded, axis=-1, norm="forward", overwrite_x=True)


def _from_spectrum(spec: np.ndarray, n: int, natural: bool = True) -> np.ndarray:
    """Inverse of :func:`_spectrum`, rounded to the exact integers (int64); refuses imprecise results.
    `spec` is overwritten. With natural=False the coefficients stay in the folded order
    (0, N/2, 1, N/2 + 1, …): element-wise work can run on them before :func:`unfold`."""
    import scipy.fft  # (see _spectrum)

    folded = scipy.fft.fft(spec, axis=-1, norm="forward", overwrite_x=True)
    folded *= _twist(n)[1]
    pairs = folded.view(np.float64)  # (..., N): re_0, im_0, re_1, im_1, ...
    rounded = np.rint(pairs)
    # The bound on the inputs keeps the error below 2^−8 (the largest inputs are tested); a sample
    # of every product is checked all the same, so that a violated bound raises instead of erring.
    probe = pairs[..., ::CHECK_STRIDE] - rounded[..., ::CHECK_STRIDE]
    err = float(np.abs(probe).max(initial=0.0))
    if err > MAX_FFT_ERROR:
        raise ProtocolError(f"negacyclic FFT product is off by {err:.3f}: inputs too large for float64")
    out = rounded.astype(np.int64)
    return unfold(out) if natural else out


def unfold(x: np.ndarray) -> np.ndarray:
    """Folded order (0, N/2, 1, N/2 + 1, …) → natural order, along the last axis."""
    h = x.shape[-1] // 2
    return np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1) if h else x




SUB = 27  # an element of R_q as four sub-words of 27 bits (a word is two)


def _subwords(x: np.ndarray) -> np.ndarray:
    """Words (2, ..., N) → four sub-words (4, ..., N) as float64: bits 0–26, 27–53, 54–80, 81–107."""
    out = np.empty((4, *x.shape[1:]), dtype=np.float64)
    mask = (1 << SUB) - 1
    out[0] = x[0] & mask
    out[1] = x[0] >> SUB
    out[2] = x[1] & mask
    out[3] = x[1] >> SUB
    return out


def _join(p: np.ndarray, plus: np.ndarray | None = None) -> np.ndarray:
    """Exact products of the four sub-words (4, ..., N) (int64, |p| < 2^40) → words mod 2^108:
    p0 + 2^27 p1 + 2^54 p2 + 2^81 p3, with 2^27 p1 split at the word boundary (p1 mod 2^27 stays
    low, the rest carries) and p3 taken mod 2^27 (2^81 · 2^27 = q). `plus` (small integers,
    |plus| < 2^40) is added on the way, in the same pass."""
    mask = (1 << SUB) - 1
    lo = p[0] + ((p[1] & mask) << SUB)
    if plus is not None:
        lo += plus
    return normalise(lo, (p[1] >> SUB) + p[2] + ((p[3] & mask) << SUB))


def ternary_spectrum(s: np.ndarray) -> np.ndarray:
    return _spectrum(np.asarray(s, dtype=np.float64))


def poly_spectra(x: np.ndarray) -> np.ndarray:
    """Spectra of the four sub-words of fixed elements of R_q: (4, ..., N/2), reused across products."""
    return _spectrum(_subwords(x))


def mul_ternary(x: np.ndarray, s_spec: np.ndarray) -> np.ndarray:
    """x · s in R_q for words x (2, ..., N) and a ternary s given by its spectrum (broadcasts)."""
    n = x.shape[-1]
    return unfold(_join(_from_spectrum(poly_spectra(x) * s_spec, n, natural=False)))


def mul_spectra(x_spec: np.ndarray, s_spec: np.ndarray, n: int, plus: np.ndarray | None = None) -> np.ndarray:
    """x · s from x's sub-word spectra (4, ..., N/2) and ternary spectra s_spec (..., N/2), plus small
    integers `plus` given in the folded coefficient order (an i.i.d. error may be drawn in any order)."""
    return unfold(_join(_from_spectrum(x_spec * s_spec, n, natural=False), plus))


def mul_small_mod(x: np.ndarray, s_spec: np.ndarray, log_mod: int) -> np.ndarray:
    """x · s mod 2^log_mod for x with entries in [0, 2^log_mod), log_mod ≤ 42, ternary s (spectrum)."""
    n = x.shape[-1]
    if log_mod <= SUB:  # one part: products below N · 2^27 = 2^39, as for the sub-words
        return _from_spectrum(_spectrum(x.astype(np.float64)) * s_spec, n) & ((1 << log_mod) - 1)
    half = (log_mod + 1) // 2
    parts = np.stack([x & ((1 << half) - 1), x >> half]).astype(np.float64)
    p = _from_spectrum(_spectrum(parts) * s_spec, n)
    return (p[0] + (p[1] << half)) & ((1 << log_mod) - 1)


# -- keys, encryption, decryption ----------------------------------------------------------------


@dataclass
class SecretKey:
    params: RLWEParams
    s: np.ndarray  # ternary, int64 (N,)

    @classmethod
    def generate(cls, params: RLWEParams, key: bytes | None = None) -> SecretKey:
        return cls(params, sample_ternary((params.n,), key))

    @property
    def spectrum(self) -> np.ndarray:
        if not hasattr(self, "_spec"):
            self._spec = ternary_spectrum(self.s)
        return self._spec

    def public_key(self, seed: bytes, stream: int, noise_key: bytes | None = None) -> PublicKey:
        p1 = uniform_poly(seed, 1, self.params.n, stream=stream)[:, 0]
        e = sample_cbd((self.params.n,), self.params.eta, noise_key)
        p0 = add(_neg(mul_ternary(p1, self.spectrum)), from_int(e))
        return PublicKey(self.params, p0, p1)

    def encrypt(self, a: np.ndarray, messages: np.ndarray, noise_key: bytes | None = None) -> np.ndarray:
        """b = −a·s + e + Δ·m for each row: a is (2, k, N) words, messages (k, N) ints in [0, t).
        Only b is returned: a is public (expanded from its seed by both sides)."""
        p = self.params
        m = np.asarray(messages, dtype=np.int64)
        if m.min(initial=0) < 0 or m.max(initial=0) >= 1 << p.log_t:
            raise ProtocolError("plaintext values must lie in [0, t)")
        e = sample_cbd(m.shape, p.eta, noise_key)
        shift = p.delta_shift - WORD  # Δ·m lands in the high word
        neg_as = _neg(mul_ternary(a, self.spectrum))
        return normalise(neg_as[0] + e, neg_as[1] + (m << shift))

    def decrypt_switched(self, a: np.ndarray, b: np.ndarray, log_q_out: int, noise: bool = True):
        """Decrypt ciphertexts already switched to q' = 2^log_q_out: a (k, N), b (k, m ≤ N) int64.
        Returns (messages mod t, centred noise) for the first m coefficients; noise=False: the
        messages only."""
        p = self.params
        v = (b + mul_small_mod(a, self.spectrum, log_q_out)[..., : b.shape[-1]]) & ((1 << log_q_out) - 1)
        shift = log_q_out - p.log_t
        m = ((v + (1 << (shift - 1))) >> shift) & ((1 << p.log_t) - 1)
        if not noise:
            return m
        noise = (v - (m << shift)) & ((1 << log_q_out) - 1)
        noise = np.where(noise >= 1 << (log_q_out - 1), noise - (1 << log_q_out), noise)
        return m, noise

    def decrypt_switched_at(self, a: np.ndarray, b: np.ndarray, rows: np.ndarray, positions: np.ndarray,
                            log_q_out: int) -> np.ndarray:
        """Decrypt switched ciphertexts (a: (k, N)) at chosen coefficients only: b[i] is the b part of
        ciphertext rows[i] at coefficient positions[i] (crypto.lattice_blocks: B returns b only where
        a candidate pair sits). Returns the messages mod t, one per given b."""
        p = self.params
        v = (b + mul_small_mod(a, self.spectrum, log_q_out)[rows, positions]) & ((1 << log_q_out) - 1)
        shift = log_q_out - p.log_t
        return ((v + (1 << (shift - 1))) >> shift) & ((1 << p.log_t) - 1)

    def decrypt_noise(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Decrypt at q (tests): messages (k, m) and the exact centred noise as Python ints."""
        p = self.params
        v = add(b, mul_ternary(a, self.spectrum)[..., : b.shape[-1]])
        half = 1 << (p.delta_shift - 1)
        q = 1 << LOG_Q
        msgs, noise = [], []
        for x in to_signed(v):
            xm = x % q
            mm = ((xm + half) >> p.delta_shift) % (1 << p.log_t)
            r = (xm - (mm << p.delta_shift)) % q
            noise.append(r - q if r > q // 2 else r)
            msgs.append(mm)
        return np.array(msgs, dtype=np.int64).reshape(v.shape[1:]), noise


def _neg(x: np.ndarray) -> np.ndarray:
    return normalise(-x[0], -x[1])


@dataclass
class PublicKey:
    params: RLWEParams
    p0: np.ndarray  # words (2, N)
    p1: np.ndarray

    @property
    def spectra(self) -> np.ndarray:
        """Sub-word spectra of p0 and p1: (4, 2, N/2)."""
        if not hasattr(self, "_spec"):
            self._spec = poly_spectra(np.stack([self.p0, self.p1], axis=1))
        return self._spec

    def encrypt_zero(self, count: int, key: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`count` fresh encryptions of zero: (a, b) words, each (2, count, N) (their u and errors
        keyed by `key` if given: see _words)."""
        n, eta = self.params.n, self.params.eta
        u_spec = ternary_spectrum(sample_ternary((count, n), None if key is None else subkey(key, "u")))  # (count, N/2)
        errors = sample_cbd((2, count, n), eta, None if key is None else subkey(key, "e"))  # e1, e2: i.i.d., so added in the FFT's folded order
        prod = mul_spectra(self.spectra[:, :, None, :], u_spec[None, None], n, plus=errors)  # (2, 2, count, N)
        return prod[:, 1], prod[:, 0]  # a = p1·u + e2, b = p0·u + e1


# -- wire formats --------------------------------------------------------------------------------

COEFF_BYTES = 14  # 108 bits in 14 bytes


def words_to_bytes(x: np.ndarray) -> bytes:
    """Words (2, ...) → 14 little-endian bytes per coefficient (value < 2^108)."""
    lo = x[0].reshape(-1).astype(np.uint64)
    hi = x[1].reshape(-1).astype(np.uint64)
    out = np.empty((lo.size, COEFF_BYTES), dtype=np.uint8)
    out[:, :8] = (lo | (hi << np.uint64(WORD))).view(np.uint8).reshape(-1, 8)
    out[:, 8:] = (hi >> np.uint64(64 - WORD)).view(np.uint8).reshape(-1, 8)[:, :6]
    return out.tobytes()


def words_from_bytes(data, count: int, what: str = "coefficients") -> np.ndarray:
    """Inverse of :func:`words_to_bytes`; refuses a wrong length or a value ≥ 2^108."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size != count * COEFF_BYTES:
        raise ProtocolError(f"{what}: {raw.size} bytes, expected {count * COEFF_BYTES}")
    raw = raw.reshape(count, COEFF_BYTES)
    if np.any(raw[:, 13] >> 4):
        raise ProtocolError(f"{what}: a coefficient is ≥ 2^{LOG_Q}")
    w0 = np.ascontiguousarray(raw[:, :8]).view("<u8").reshape(-1)
    top = np.zeros((count, 8), dtype=np.uint8)
    top[:, :6] = raw[:, 8:]
    w1 = top.view("<u8").reshape(-1)
    lo = (w0 & np.uint64(WORD_MASK)).astype(np.int64)
    hi = ((w0 >> np.uint64(WORD)) | (w1 << np.uint64(64 - WORD))).astype(np.int64) & WORD_MASK
    return np.stack([lo, hi])


def small_to_bytes(x: np.ndarray, bits: int) -> bytes:
    """Values in [0, 2^bits), bits a multiple of 8 up to 32, as little-endian bits/8 bytes each."""
    width = bits // 8
    v = np.ascontiguousarray(np.asarray(x).reshape(-1).astype("<u4"))
    return v.view(np.uint8).reshape(-1, 4)[:, :width].tobytes()


def small_from_bytes(data, count: int, bits: int, what: str = "values") -> np.ndarray:
    width = bits // 8
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size != count * width:
        raise ProtocolError(f"{what}: {raw.size} bytes, expected {count * width}")
    full = np.zeros((count, 4), dtype=np.uint8)
    full[:, :width] = raw.reshape(count, width)
    return full.view("<u4").reshape(-1).astype(np.int64)
