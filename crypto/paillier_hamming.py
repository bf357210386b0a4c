"""SecureHamming, Paillier variant: the paper's protocol and a fast packed version.

(One module of about 1,000 lines because the two protocols share their message formats, key
checks, the masked-result step and their parties' saved state; apart, each would reach into the
other's internals.)

Two protocols implement :class:`crypto.hamming_api.HammingProtocol`:

``PaillierNaiveHamming`` (name ``"paillier-naive"``)
    The paper's protocol exactly as the paper writes it ("SecureHamming, Paillier
    variant"), on top of ``phe``'s own API: A (the encrypted side, holding y) encrypts every bit of
    every vector with ``phe``'s default encryption and sends its public key and the ciphertexts to
    B. For every pair (y, x), B draws r uniform in Z_N and computes
    ``[T] = [r] · Π_{x_l=0}[y_l] · Π_{x_l=1}[y_l]^{-1}`` (T = r + h − |x|), sends [T] to A and
    R = r − |x| mod N to the server; A decrypts T and sends it to the server, which outputs
    h = T − R mod N. This is the slow reference.

``PaillierHamming`` (name ``"paillier"``)
    The same protocol made fast without changing what anyone learns (see below).

Roles and flow (both protocols)::

    a = proto.party_a(bits_a, L, keypair=None)     # A: encrypted side, holds y, owns the key
    b = proto.party_b(bits_b, L)                   # B: plaintext side, holds x
    m1 = a.receive(None).to_peer                   # A -> B: public key + ciphertexts
    o  = b.receive(m1)                             # B -> A: result ciphertexts; B -> server: share
    o2 = a.receive(o.to_peer)                      # A -> server: share (done)
    H  = proto.combine(share_a, share_b, n_a, n_b, L)   # n_a × n_b int32

``keypair`` is a ``(PaillierPublicKey, PaillierPrivateKey)`` tuple from
``phe.generate_paillier_keypair`` so that one site can reuse one key across all pairs of a job (key
generation is slow). Without it, ``party_a`` makes a fresh key of ``key_bits`` bits.

Key sizes: moduli below 2048 bits are refused (constructor, ``keypair`` and incoming public keys)
unless the protocol object is built with ``insecure_test_key_bits=True``; that flag exists only so
that the tests can run with 1024-bit keys, and then allows moduli down to 512 bits. Never set it in
production.

The packed protocol, algebra
----------------------------
Write h(x, y) = |x| + |y| − 2⟨x, y⟩ with ⟨x, y⟩ = Σ_{l: x_l = 1} y_l; 0 ≤ h ≤ L.

* Slots. The slot width is ``w = bit_length(L)`` (so L < 2^w and h is determined by h mod 2^w),
  and ``P = ⌊(|N| − 2 − σ) / w⌋`` slots fit in one plaintext with σ guard bits on top
  (|N| = bit length of N; asserted: wP + σ + 1 ≤ |N| − 1). A packs bit l of a group of up to P of
  its vectors as ``Y_{g,l} = Σ_p y_{gP+p, l} · 2^{w p}`` and also ``S_g = Σ_p |y_p| 2^{w p}``, and
  sends the L + 1 ciphertexts of each group.
* B, for each of its vectors x and each group g (P_g vectors), computes
  ``[Z] = Enc(Σ_p (ρ_p + |x|) 2^{w p} + R 2^{w P_g}) · [S_g] · (Π_{l: x_l=1} [Y_{g,l}])^{-2}``
  with ρ_p uniform in [0, 2^w) (fresh per slot, per x, per group) and R uniform in [0, 2^σ). Its
  plaintext is the INTEGER ``Z = Σ_p (ρ_p + h_p) 2^{w p} + R 2^{w P_g}``: every term is ≥ 0
  (|x| + |y_p| − 2⟨x, y_p⟩ = h_p ≥ 0) and Z < 2^{w P_g + σ + 1} < N, so the reduction mod N is the
  identity even though −2⟨x, y⟩ is computed with a modular inverse.
* A decrypts and sends the server the w-bit fields ``u_p = ⌊Z / 2^{wp}⌋ mod 2^w``; B sends
  ``v_p = ρ_p``. Field p holds ρ_p + h_p plus the carry c_{p−1} ∈ {0, 1} out of field p − 1, so the
  server recovers, slot by slot from p = 0 (c_{−1} = 0):
  ``h_p = (u_p − v_p − c_{p−1}) mod 2^w`` and ``c_p = ⌊(v_p + h_p + c_{p−1}) / 2^w⌋``,
  and checks 0 ≤ h_p ≤ L (anything else is a corrupted share: ProtocolError).
* What each party learns. The server sees v = ρ (uniform, independent of the data) and u, which
  is a function of ρ and h: it learns h and nothing else (perfectly). A sees the fields u: for fixed
  h the map ρ ↦ u is a bijection of [0, 2^w)^{P_g} (field p depends on ρ_p and lower ρ's only,
  through the carry), so u is exactly uniform; the carry out of the top slot lands in R + c with R
  uniform in [0, 2^σ): statistical distance ≤ 2^{−σ}. B sees only ciphertexts under A's key.
  Compared with the spec's variant (w − 1 ≥ ⌈log2(L+1)⌉ + σ, no wrap, u_p = |y_p| − 2t_p,
  v_p = |x| + 2r_p) this needs no σ bits per slot (P = 182 instead of 38 slots at L = 1024 and
  |N| = 2048, so about 4.8× fewer ciphertexts everywhere), its masking of the slots is perfect
  rather than statistical, and it does not leak |x| mod 2 and |y_p| mod 2 to the server through
  the parity of the shares (which u_p = |y_p| − 2t_p, v_p = |x| + 2r_p would). The price is the
  one extra ciphertext S_g per group from A.
* Coalitions (outside the threat model): the server together with either site learns the H block
  (which the server learns anyway) and that site's own data, nothing more: A's fields and B's
  masks only ever combine to h, and B cannot decrypt. Note that H itself reveals much about the
  vectors (e.g. with A's own y's known, H constrains x) — that is the paper's accepted leakage.

The packed protocol, speed and why the fast randomness is secure
----------------------------------------------------------------
* Encryption randomness is the Damgård–Jurik–Nielsen form (DJN: Damgård, Jurik, Nielsen, "A
  generalization of Paillier's public-key system with applications to electronic voting", IJIS
  2010; also e.g. ABY's ``djn.cpp`` and SecretFlow HEU): A draws x ∈ Z_N^*, sets h = −x² mod N,
  h_s = h^N mod N², and publishes h_s with its key. An encryption is ``(1 + mN) · h_s^α mod N²``,
  computed with a fixed-base window table of h_s (one multiplication per window of α).
  - A's encryptions of its own bits use α of ⌈|N|/2⌉ bits, as DJN recommend; semantic security
    against B (who does not know the factorisation) rests on the DJN assumption, as usual.
    A knows p and q, so it computes h_s^α mod p² and mod q² from two half-size tables and joins
    them by CRT (about 1.7× cheaper than one table mod N²).
  - B's re-randomisation must hide, from A who holds the factorisation and knows the randomness of
    its own ciphertexts, WHICH ciphertexts were combined (circuit privacy). B therefore uses a long
    exponent: α uniform in [0, 2^{|N|+σ}). The order of h_s divides λ(N) < N, so h_s^α is within
    statistical distance 2^{−σ} of uniform on the group ⟨h_s⟩; every ciphertext's randomness
    (A's own and B's) lies in ⟨h_s⟩, so the randomness of [Z] is statistically uniform on ⟨h_s⟩
    and independent of the combination, whatever A knows. (A short exponent would NOT be enough
    here: A could run discrete logarithms mod p and q itself. Plain r uniform in Z_N^* mixed with
    A's short-exponent ciphertexts would not be enough either: A could read the Legendre symbols
    mod p and mod q of the product of its own randomness, i.e. linear equations over GF(2) in x.)
    Semi-honest A is assumed to encrypt with h_s as specified, as the threat model says.
* Subset products (B): for each group, the L positions are split into chunks of k bits (k chosen by
  a cost model, up to 8), all 2^k subset products of each chunk are precomputed (one multiplication
  each), and each x then costs ⌈L/k⌉ multiplications ("method of four Russians").
* Decryption with CRT (c^{p−1} mod p², c^{q−1} mod q²), done with gmpy2 on raw integers.
* All big-number work is spread over ``threads`` threads; worker threads set gmpy2's
  ``allow_release_gil`` so that multiplications and powmods run in parallel.
* Randomness: ``secrets`` / ``os.urandom`` only.

Messages
--------
All messages start with ``b"XHAM" | version (1 byte) | protocol id (1) | message type (1)``,
then fixed big-endian fields; ciphertexts are fixed-width big-endian integers of
⌈2|N|/8⌉ bytes, plaintext-sized values ⌈|N|/8⌉ bytes, packed-protocol server shares 8-byte
unsigned integers. Every message is length-checked against the sizes its header declares (and a
``max_message_bytes`` cap) before anything is parsed; every ciphertext must lie in Z_{N²}^* (not 0,
< N², coprime to N). Any violation raises :class:`crypto.errors.ProtocolError`.
"""

from __future__ import annotations

import os
import secrets
import struct
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import gmpy2
import numpy as np
from phe import paillier

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, check_bits
from crypto.state import State, pack

__all__ = ["PaillierNaiveHamming", "PaillierHamming", "MIN_KEY_BITS", "MIN_TEST_KEY_BITS"]

MAGIC = b"XHAM"
VERSION = 1
PROTO_NAIVE = 1
PROTO_PACKED = 2
MSG_KEYS = 1  # A -> B
MSG_RESULT = 2  # B -> A
MSG_SHARE_A = 3  # A -> server
MSG_SHARE_B = 4  # B -> server

MIN_KEY_BITS = 2048
MIN_TEST_KEY_BITS = 512
DEFAULT_MAX_MESSAGE_BYTES = 1 << 32
MAX_VECTORS = 1 << 24
MAX_BITS = 1 << 20

_HDR = struct.Struct(">4sBBB")
# session id, key bits, L, n_a, sigma, w, slots P, n_groups
_KEYS = struct.Struct(">16sHIIBBHI")
# session id, L, n_a, n_b, n_groups
_RESULT = struct.Struct(">16sIIII")
# session id, L, n_a, n_b, key bits, w, value width, slots per plaintext
_SHARE = struct.Struct(">16sIIIHBHH")


# --------------------------------------------------------------------------------------------
# helpers


def _header(proto: int, msg_type: int) -> bytes:
    return _HDR.pack(MAGIC, VERSION, proto, msg_type)


def _parse_header(message, proto: int, msg_type: int, what: str, max_bytes: int) -> memoryview:
    if not isinstance(message, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"{what}: expected bytes, got {type(message).__name__}")
    if len(message) > max_bytes:
        raise ProtocolError(f"{what}: message of {len(message)} bytes exceeds the {max_bytes}-byte cap")
    if len(message) < _HDR.size:
        raise ProtocolError(f"{what}: truncated message ({len(message)} bytes, header needs {_HDR.size})")
    magic, version, p, t = _HDR.unpack_from(message, 0)
    if magic != MAGIC:
        raise ProtocolError(f"{what}: bad magic {bytes(magic)!r}, not a Paillier Hamming message")
    if version != VERSION:
        raise ProtocolError(f"{what}: unsupported version {version} (this code speaks {VERSION})")
    if p != proto:
        raise ProtocolError(f"{what}: message is for protocol id {p}, expected {proto}")
    if t != msg_type:
        raise ProtocolError(f"{what}: message type {t}, expected {msg_type}")
    return memoryview(bytes(message))


def _check_len(buf, expected: int, what: str) -> None:
    if len(buf) < expected:
        raise ProtocolError(f"{what}: truncated message ({len(buf)} bytes, declared sizes need {expected})")
    if len(buf) > expected:
        raise ProtocolError(f"{what}: oversized message ({len(buf)} bytes, declared sizes allow {expected})")


def _ct_width(key_bits: int) -> int:
    return (2 * key_bits + 7) // 8


def _pt_width(key_bits: int) -> int:
    return (key_bits + 7) // 8


def _to_bytes(values, width: int) -> bytes:
    return b"".join(int(v).to_bytes(width, "big") for v in values)


def _parse_ciphertexts(buf, offset: int, count: int, width: int, n, n2, what: str) -> list:
    """Parse `count` fixed-width ciphertexts and check each lies in Z_{N²}^*."""
    out = []
    mpz, gcd = gmpy2.mpz, gmpy2.gcd
    raw = bytes(buf[offset : offset + count * width])
    for i in range(count):
        c = mpz(int.from_bytes(raw[i * width : (i + 1) * width], "big"))
        if c <= 0 or c >= n2:
            raise ProtocolError(f"{what}: ciphertext {i} is outside Z_(N^2) (0 < c < N^2 required)")
        if gcd(c, n) != 1:
            raise ProtocolError(f"{what}: ciphertext {i} is not coprime to N")
        out.append(c)
    return out


def _check_key_bits(bits: int, allow_insecure: bool, what: str) -> None:
    floor = MIN_TEST_KEY_BITS if allow_insecure else MIN_KEY_BITS
    if bits < floor:
        hint = "" if allow_insecure else " (insecure_test_key_bits=True allows smaller keys, for tests only)"
        raise ProtocolError(f"{what}: Paillier modulus of {bits} bits is below the minimum of {floor}{hint}")


def _check_keypair(keypair, allow_insecure: bool):
    try:
        pub, priv = keypair
        n = int(pub.n)
        p, q = int(priv.p), int(priv.q)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError("keypair must be a (PaillierPublicKey, PaillierPrivateKey) tuple from phe") from exc
    if p * q != n:
        raise ProtocolError("keypair: private key does not match the public key")
    _check_key_bits(n.bit_length(), allow_insecure, "keypair")
    return pub, priv


def keypair_from_primes(p: int, q: int):
    """A phe key pair from its saved primes (a site saves p and q, never a pickled key object)."""
    if not (isinstance(p, int) and isinstance(q, int) and p > 2 and q > 2 and p != q):
        raise ProtocolError("a saved Paillier key is two distinct primes")
    pub = paillier.PaillierPublicKey(p * q)
    return pub, paillier.PaillierPrivateKey(pub, p, q)


class _Saved:
    """A party's saved state (crypto.state): A its key's primes, the session id and its stage; B its
    stage alone — B answers A's one message at once and keeps nothing after it."""

    def state(self) -> bytes:
        fields = {"role": "a" if hasattr(self, "priv") else "b", "stage": self.stage}
        if hasattr(self, "priv"):
            fields.update(p=int(self.priv.p), q=int(self.priv.q), session=self.session)
        return pack(fields)


def _restore_party(proto, bits: np.ndarray, n_bits: int, data: bytes):
    s = State(data, f"{proto.name} party")
    if s.str("role") == "a":
        party = proto.party_a(bits, n_bits, keypair=keypair_from_primes(s.int("p"), s.int("q")))
        party.session = s.bytes("session", 16)
    else:
        party = proto.party_b(bits, n_bits)
    party.stage = s.int("stage", 0, 2)
    return party


def _popcounts(bits: np.ndarray) -> np.ndarray:
    return np.bitwise_count(bits).sum(axis=1, dtype=np.int64)


def _unpack(bits: np.ndarray, n_bits: int) -> np.ndarray:
    return np.unpackbits(bits, axis=1, count=n_bits)


def _check_n(value, what: str, lo: int = 1, hi: int = MAX_VECTORS) -> int:
    if not lo <= value <= hi:
        raise ProtocolError(f"{what} = {value} outside [{lo}, {hi}]")
    return int(value)


def _new_session() -> bytes:
    return secrets.token_bytes(16)


def _release_gil_context() -> None:
    ctx = gmpy2.get_context()
    if not ctx.allow_release_gil:
        ctx.allow_release_gil = True


class _Pool:
    """Split a list of work items over `threads` threads (inline when threads == 1)."""

    def __init__(self, threads: int):
        self.threads = max(1, int(threads))

    def map_chunks(self, fn, items: list) -> list:
        n = len(items)
        if self.threads == 1 or n < 2:
            return fn(items)
        parts = min(self.threads, n)
        bounds = [n * i // parts for i in range(parts + 1)]
        chunks = [items[bounds[i] : bounds[i + 1]] for i in range(parts)]

        def run(chunk):
            _release_gil_context()
            return fn(chunk)

        with ThreadPoolExecutor(parts) as ex:
            results = list(ex.map(run, chunks))
        out = []
        for r in results:
            out.extend(r)
        return out


# --------------------------------------------------------------------------------------------
# Paillier arithmetic on raw integers (packed protocol)


class _FixedBase:
    """Fixed-base window table: base^e mod m as one multiplication per `window`-bit digit of e."""

    def __init__(self, base, mod, exp_bits: int, window: int, pool: _Pool):
        self.mod = gmpy2.mpz(mod)
        self.window = window
        self.exp_bits = exp_bits
        self.n_windows = (exp_bits + window - 1) // window
        size = 1 << window
        bases = [gmpy2.mpz(base) % self.mod]
        for _ in range(1, self.n_windows):
            bases.append(gmpy2.powmod(bases[-1], size, self.mod))
        m = self.mod

        def build(idx):
            rows = []
            for i in idx:
                b = bases[i]
                row = [gmpy2.mpz(1), b]
                acc = b
                for _ in range(2, size):
                    acc = acc * b % m
                    row.append(acc)
                rows.append(row)
            return rows

        self.rows = pool.map_chunks(build, list(range(self.n_windows)))

    def pow_random(self, a=None):
        """base^α for α uniform in [0, 2^(n_windows·window)) drawn from `secrets` (or the given α)."""
        if a is None:
            a = secrets.randbits(self.n_windows * self.window)
        mask = (1 << self.window) - 1
        w = self.window
        m = self.mod
        acc = None
        for row in self.rows:
            d = a & mask
            a >>= w
            if d:
                acc = row[d] if acc is None else acc * row[d] % m
        return gmpy2.mpz(1) if acc is None else acc


def _choose_window(exp_bits: int, count: int) -> int:
    best, best_cost = 1, None
    for w in range(1, 9):
        nw = (exp_bits + w - 1) // w
        cost = nw * ((1 << w) - 2) + count * nw
        if best_cost is None or cost < best_cost:
            best, best_cost = w, cost
    return best


@dataclass
class _DJNKey:
    n: object
    n2: object
    hs: object


class _TableCache:
    """Small LRU of fixed-base tables keyed by (N, h_s, exponent bits, window)."""

    def __init__(self, size: int = 2):
        self.size = size
        self.items: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key, make):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = make()
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


def _slot_params(n_bits: int, sigma: int, key_bits: int) -> tuple[int, int]:
    """Slot width w (h ∈ [0, L] must be unique mod 2^w) and slots P per plaintext.

    The packed plaintext is Σ_p (ρ_p + h_p) 2^{wp} + R 2^{w P_g} with ρ_p < 2^w, h_p ≤ L < 2^w and
    R < 2^σ; it is < 2^{wP + σ + 1}, which must stay below 2^{|N|-1} < N (no reduction mod N).
    """
    w = max(1, int(n_bits).bit_length())
    assert n_bits < 1 << w  # h mod 2^w determines h
    if w > 63:
        raise ProtocolError(f"slot width {w} bits exceeds 63 (L = {n_bits})")
    slots = (key_bits - 2 - sigma) // w
    if slots < 1:
        raise ProtocolError(f"a {key_bits}-bit modulus cannot hold one {w}-bit slot and {sigma} guard bits")
    assert w * slots + sigma + 1 <= key_bits - 1
    return w, slots


# --------------------------------------------------------------------------------------------
# shares and combine (shared by both protocols)


def _make_share(proto: int, msg_type: int, session: bytes, n_bits: int, n_a: int, n_b: int,
                key_bits: int, w: int, value_width: int, n_bytes: bytes, payload: bytes, slots: int = 1) -> bytes:
    head = _header(proto, msg_type) + _SHARE.pack(session, n_bits, n_a, n_b, key_bits, w, value_width, slots)
    return head + n_bytes + payload


def _parse_share(share, proto: int, msg_type: int, who: str, n_a: int, n_b: int, n_bits: int,
                 max_bytes: int):
    what = f"server share from {who}"
    buf = _parse_header(share, proto, msg_type, what, max_bytes)
    if len(buf) < _HDR.size + _SHARE.size:
        raise ProtocolError(f"{what}: truncated header")
    session, L, na, nb, key_bits, w, vw, slots = _SHARE.unpack_from(buf, _HDR.size)
    if L != n_bits:
        raise ProtocolError(f"{what}: declares L = {L}, the coordinator expects {n_bits}")
    if na != n_a or nb != n_b:
        raise ProtocolError(f"{what}: declares {na} × {nb} vectors, the coordinator expects {n_a} × {n_b}")
    nlen = _pt_width(key_bits) if proto == PROTO_NAIVE else 0
    expected = _HDR.size + _SHARE.size + nlen + na * nb * vw
    _check_len(buf, expected, what)
    off = _HDR.size + _SHARE.size
    n_val = int.from_bytes(buf[off : off + nlen], "big") if nlen else None
    return session, key_bits, w, vw, n_val, buf[off + nlen :], slots


# --------------------------------------------------------------------------------------------
# The paper's protocol on phe


class PaillierNaiveHamming:
    """The paper's Paillier SecureHamming protocol, verbatim, on phe's EncryptedNumber API (slow)."""

    name = "paillier-naive"
    proto_id = PROTO_NAIVE

    def __init__(self, key_bits: int = 2048, *, insecure_test_key_bits: bool = False,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        _check_key_bits(int(key_bits), insecure_test_key_bits, "key_bits")
        self.key_bits = int(key_bits)
        self.insecure_test_key_bits = bool(insecure_test_key_bits)
        self.max_message_bytes = int(max_message_bytes)

    def party_a(self, bits: np.ndarray, n_bits: int, keypair=None) -> _NaiveA:
        return _NaiveA(self, check_bits(bits, n_bits, "bits_a"), int(n_bits), keypair)

    def party_b(self, bits: np.ndarray, n_bits: int) -> _NaiveB:
        return _NaiveB(self, check_bits(bits, n_bits, "bits_b"), int(n_bits))

    def restore_party(self, bits: np.ndarray, n_bits: int, data: bytes) -> _NaiveA | _NaiveB:
        return _restore_party(self, bits, n_bits, data)

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray:
        sa = _parse_share(share_a, PROTO_NAIVE, MSG_SHARE_A, "A", n_a, n_b, n_bits, self.max_message_bytes)
        sb = _parse_share(share_b, PROTO_NAIVE, MSG_SHARE_B, "B", n_a, n_b, n_bits, self.max_message_bytes)
        if sa[0] != sb[0]:
            raise ProtocolError("server shares come from different protocol runs (session ids differ)")
        if sa[1] != sb[1] or sa[4] != sb[4]:
            raise ProtocolError("server shares disagree on the Paillier modulus")
        n = sa[4]
        kb = _pt_width(sa[1])
        if sa[3] != kb or sb[3] != kb or n.bit_length() != sa[1]:
            raise ProtocolError("server share: value width does not match the key size")
        ta, rb = sa[5], sb[5]
        out = np.empty(n_a * n_b, dtype=np.int32)
        for i in range(n_a * n_b):
            t = int.from_bytes(ta[i * kb : (i + 1) * kb], "big")
            r = int.from_bytes(rb[i * kb : (i + 1) * kb], "big")
            if t >= n or r >= n:
                raise ProtocolError(f"server share value {i} is not reduced mod N")
            h = (t - r) % n
            if h > n_bits:
                raise ProtocolError(f"pair {i}: recovered distance {h} exceeds L = {n_bits} (corrupted share)")
            out[i] = h
        return out.reshape(n_a, n_b)


class _NaiveA(_Saved):
    def __init__(self, proto: PaillierNaiveHamming, bits, n_bits, keypair):
        self.proto = proto
        self.bits = bits
        self.n_bits = n_bits
        if keypair is not None:
            self.pub, self.priv = _check_keypair(keypair, proto.insecure_test_key_bits)
        else:
            self.pub, self.priv = paillier.generate_paillier_keypair(n_length=proto.key_bits)
        self.stage = 0
        self.session = _new_session()

    def receive(self, message):
        if self.stage == 0:
            if message is not None:
                raise ProtocolError("party A speaks first: its first receive() takes None")
            self.stage = 1
            return Outgoing(to_peer=self._keys_message())
        if self.stage == 1:
            self.stage = 2
            return Outgoing(to_server=self._decrypt(message), done=True)
        raise ProtocolError("party A is already done")

    def _keys_message(self) -> bytes:
        pub = self.pub
        n = pub.n
        key_bits = n.bit_length()
        n_a = self.bits.shape[0]
        y = _unpack(self.bits, self.n_bits)
        cts = []
        for i in range(n_a):
            for l in range(self.n_bits):
                enc = pub.encrypt(int(y[i, l]))  # phe default: fresh r^N per ciphertext
                cts.append(enc.ciphertext(be_secure=True))
        head = _header(PROTO_NAIVE, MSG_KEYS) + _KEYS.pack(
            self.session, key_bits, self.n_bits, n_a, 0, 0, 1, n_a)
        return head + n.to_bytes(_pt_width(key_bits), "big") + _to_bytes(cts, _ct_width(key_bits))

    def _decrypt(self, message) -> bytes:
        what = "result message from B"
        buf = _parse_header(message, PROTO_NAIVE, MSG_RESULT, what, self.proto.max_message_bytes)
        if len(buf) < _HDR.size + _RESULT.size:
            raise ProtocolError(f"{what}: truncated header")
        session, L, n_a, n_b, n_groups = _RESULT.unpack_from(buf, _HDR.size)
        if session != self.session:
            raise ProtocolError(f"{what}: session id does not match this run")
        if L != self.n_bits:
            raise ProtocolError(f"{what}: declares L = {L}, A has L = {self.n_bits}")
        if n_a != self.bits.shape[0] or n_groups != n_a:
            raise ProtocolError(f"{what}: declares {n_a} vectors for A, A has {self.bits.shape[0]}")
        _check_n(n_b, f"{what}: n_b")
        n = self.pub.n
        key_bits = n.bit_length()
        cw = _ct_width(key_bits)
        _check_len(buf, _HDR.size + _RESULT.size + n_a * n_b * cw, what)
        cts = _parse_ciphertexts(buf, _HDR.size + _RESULT.size, n_a * n_b, cw, n, n * n, what)
        kb = _pt_width(key_bits)
        payload = b"".join(self.priv.raw_decrypt(int(c)).to_bytes(kb, "big") for c in cts)
        return _make_share(PROTO_NAIVE, MSG_SHARE_A, self.session, self.n_bits, n_a, n_b, key_bits, 0, kb,
                           n.to_bytes(kb, "big"), payload)


def _parse_keys(proto, message, n_bits: int, proto_id: int):
    """Validate A's first message; return header fields, N, and the buffer."""
    what = "key message from A"
    buf = _parse_header(message, proto_id, MSG_KEYS, what, proto.max_message_bytes)
    if len(buf) < _HDR.size + _KEYS.size:
        raise ProtocolError(f"{what}: truncated header")
    session, key_bits, L, n_a, sigma, w, slots, n_groups = _KEYS.unpack_from(buf, _HDR.size)
    if L != n_bits:
        raise ProtocolError(f"{what}: declares L = {L}, B has L = {n_bits} (mismatched L between parties)")
    _check_key_bits(key_bits, proto.insecure_test_key_bits, what)
    if key_bits > 16384:
        raise ProtocolError(f"{what}: key of {key_bits} bits is larger than supported")
    _check_n(n_a, f"{what}: n_a")
    _check_n(n_groups, f"{what}: number of ciphertext groups")
    off = _HDR.size + _KEYS.size
    kb = _pt_width(key_bits)
    if len(buf) < off + kb:
        raise ProtocolError(f"{what}: truncated before the public key")
    n = int.from_bytes(buf[off : off + kb], "big")
    if n.bit_length() != key_bits or n % 2 == 0 or n < 3:
        raise ProtocolError(f"{what}: public modulus is not an odd {key_bits}-bit integer")
    return session, key_bits, L, n_a, sigma, w, slots, n_groups, n, buf, off + kb


class _NaiveB(_Saved):
    def __init__(self, proto: PaillierNaiveHamming, bits, n_bits):
        self.proto = proto
        self.bits = bits
        self.n_bits = n_bits
        self.stage = 0

    def receive(self, message):
        if self.stage != 0:
            raise ProtocolError("party B is already done")
        if message is None:
            raise ProtocolError("party B expected A's key message, got None")
        self.stage = 1
        what = "key message from A"
        session, key_bits, L, n_a, sigma, w, slots, n_groups, n, buf, off = _parse_keys(
            self.proto, message, self.n_bits, PROTO_NAIVE)
        if n_groups != n_a or slots != 1 or w != 0 or sigma != 0:
            raise ProtocolError(f"{what}: packing fields are not those of the naive protocol")
        cw = _ct_width(key_bits)
        _check_len(buf, off + n_a * L * cw, what)
        raw = _parse_ciphertexts(buf, off, n_a * L, cw, n, n * n, what)
        pub = paillier.PaillierPublicKey(n)
        enc_y = [paillier.EncryptedNumber(pub, int(c), 0) for c in raw]
        x = _unpack(self.bits, self.n_bits)
        n_b = x.shape[0]
        wx = _popcounts(self.bits)
        kb = _pt_width(key_bits)
        cts = []
        shares = []
        for i in range(n_a):
            ys = enc_y[i * L : (i + 1) * L]
            neg = {}
            for j in range(n_b):
                r = secrets.randbelow(n)
                t = paillier.EncryptedNumber(pub, pub.raw_encrypt(r), 0)  # [r], fresh r'^N
                for l in range(L):
                    if x[j, l]:
                        if l not in neg:
                            neg[l] = ys[l] * -1  # [y_l]^{-1}
                        t = t + neg[l]
                    else:
                        t = t + ys[l]
                cts.append(t.ciphertext(be_secure=False))
                shares.append((r - int(wx[j])) % n)
        msg = _header(PROTO_NAIVE, MSG_RESULT) + _RESULT.pack(session, L, n_a, n_b, n_a) + _to_bytes(cts, cw)
        share = _make_share(PROTO_NAIVE, MSG_SHARE_B, session, L, n_a, n_b, key_bits, 0, kb,
                            n.to_bytes(kb, "big"), _to_bytes(shares, kb))
        return Outgoing(to_peer=msg, to_server=share, done=True)


# --------------------------------------------------------------------------------------------
# The packed, fast protocol


class PaillierHamming:
    """Packed Paillier SecureHamming with DJN randomness, subset-product tables, CRT and threads."""

    name = "paillier"
    proto_id = PROTO_PACKED

    def __init__(self, key_bits: int = 2048, sigma: int = 40, threads: int = 2, *,
                 insecure_test_key_bits: bool = False, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_chunk_bits: int = 8):
        _check_key_bits(int(key_bits), insecure_test_key_bits, "key_bits")
        if not 40 <= int(sigma) <= 60:
            raise ProtocolError(f"sigma = {sigma}: the statistical parameter must be in [40, 60]")
        if int(threads) < 1:
            raise ProtocolError("threads must be >= 1")
        self.key_bits = int(key_bits)
        self.sigma = int(sigma)
        self.threads = int(threads)
        self.insecure_test_key_bits = bool(insecure_test_key_bits)
        self.max_message_bytes = int(max_message_bytes)
        self.max_chunk_bits = max(1, min(8, int(max_chunk_bits)))
        self._djn_keys: dict = {}  # N -> _DJNKey (A's h_s for its own key)
        self._djn_lock = threading.Lock()
        self._tables = _TableCache(3)

    # -- public API
    def party_a(self, bits: np.ndarray, n_bits: int, keypair=None) -> _PackedA:
        return _PackedA(self, check_bits(bits, n_bits, "bits_a"), int(n_bits), keypair)

    def party_b(self, bits: np.ndarray, n_bits: int) -> _PackedB:
        return _PackedB(self, check_bits(bits, n_bits, "bits_b"), int(n_bits))

    def restore_party(self, bits: np.ndarray, n_bits: int, data: bytes) -> _PackedA | _PackedB:
        return _restore_party(self, bits, n_bits, data)

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray:
        sa = _parse_share(share_a, PROTO_PACKED, MSG_SHARE_A, "A", n_a, n_b, n_bits, self.max_message_bytes)
        sb = _parse_share(share_b, PROTO_PACKED, MSG_SHARE_B, "B", n_a, n_b, n_bits, self.max_message_bytes)
        if sa[0] != sb[0]:
            raise ProtocolError("server shares come from different protocol runs (session ids differ)")
        if sa[1] != sb[1] or sa[2] != sb[2]:
            raise ProtocolError("server shares disagree on key size or slot width")
        if sa[3] != 8 or sb[3] != 8:
            raise ProtocolError("server share: values must be 8-byte integers")
        w, slots = sa[2], sa[6]
        if sb[6] != slots:
            raise ProtocolError("server shares disagree on the number of slots")
        try:
            my_w, my_slots = _slot_params(n_bits, self.sigma, sa[1])
        except AssertionError as exc:  # pragma: no cover - _slot_params raises ProtocolError first
            raise ProtocolError(str(exc)) from exc
        if (w, slots) != (my_w, my_slots):
            raise ProtocolError(f"server shares declare w = {w}, P = {slots}; expected {my_w}, {my_slots}")
        mod = 1 << w
        u = np.frombuffer(sa[5], dtype=">u8").astype(np.uint64).reshape(n_a, n_b)
        v = np.frombuffer(sb[5], dtype=">u8").astype(np.uint64).reshape(n_a, n_b)
        if np.any(u >= mod) or np.any(v >= mod):
            raise ProtocolError(f"server share values out of range (must be < 2^{w})")
        u = u.astype(np.int64)
        v = v.astype(np.int64)
        h = np.empty((n_a, n_b), dtype=np.int64)
        # Slot p of a group holds ρ_p + h_p + carry_{p-1}; A's share is that field mod 2^w, B's is ρ_p.
        for g0 in range(0, n_a, slots):
            carry = np.zeros(n_b, dtype=np.int64)
            for i in range(g0, min(n_a, g0 + slots)):
                hi = (u[i] - v[i] - carry) % mod
                if np.any(hi > n_bits):
                    j = int(np.flatnonzero(hi > n_bits)[0])
                    raise ProtocolError(f"pair ({i}, {j}): recovered distance {int(hi[j])} outside [0, {n_bits}] "
                                        "(corrupted share)")
                h[i] = hi
                carry = (v[i] + hi + carry) >> w
        return h.astype(np.int32)

    # -- internals
    def _pool(self) -> _Pool:
        return _Pool(self.threads)

    def _djn_for(self, pub) -> _DJNKey:
        n = gmpy2.mpz(pub.n)
        with self._djn_lock:
            key = self._djn_keys.get(int(n))
        if key is None:
            n2 = n * n
            while True:
                xr = gmpy2.mpz(secrets.randbelow(int(n) - 2) + 2)
                if gmpy2.gcd(xr, n) == 1:
                    break
            h = (-xr * xr) % n
            key = _DJNKey(n=n, n2=n2, hs=gmpy2.powmod(h, n, n2))
            with self._djn_lock:
                key = self._djn_keys.setdefault(int(n), key)
        return key

    def _table(self, hs, n2, exp_bits: int, count: int) -> _FixedBase:
        window = _choose_window(exp_bits, count)
        if window < 8 and count > 64:
            window = _choose_window(exp_bits, 1 << 20)  # will be reused: build the big table
        key = (int(n2), int(hs), exp_bits, window)
        return self._tables.get(key, lambda: _FixedBase(hs, n2, exp_bits, window, self._pool()))


class _PackedA(_Saved):
    def __init__(self, proto: PaillierHamming, bits, n_bits, keypair):
        self.proto = proto
        self.bits = bits
        self.n_bits = n_bits
        if keypair is not None:
            self.pub, self.priv = _check_keypair(keypair, proto.insecure_test_key_bits)
        else:
            self.pub, self.priv = paillier.generate_paillier_keypair(n_length=proto.key_bits)
        self.key_bits = int(self.pub.n).bit_length()
        self.w, self.slots = _slot_params(n_bits, proto.sigma, self.key_bits)
        self.stage = 0
        self.session = _new_session()

    def receive(self, message):
        if self.stage == 0:
            if message is not None:
                raise ProtocolError("party A speaks first: its first receive() takes None")
            self.stage = 1
            return Outgoing(to_peer=self._keys_message())
        if self.stage == 1:
            self.stage = 2
            return Outgoing(to_server=self._decrypt(message), done=True)
        raise ProtocolError("party A is already done")

    def _packed_plaintexts(self) -> list[int]:
        """Y_{g,l} = Σ_p y_{gP+p,l} 2^{wp}, as a list of n_groups × L Python ints (group-major)."""
        y = _unpack(self.bits, self.n_bits)
        n_a, L = y.shape
        P, w = self.slots, self.w
        out = []
        for g0 in range(0, n_a, P):
            block = y[g0 : g0 + P]  # (P_g, L)
            pg = block.shape[0]
            lay = np.zeros((L, pg * w), dtype=np.uint8)
            lay[:, np.arange(pg) * w] = block.T
            packed = np.packbits(lay, axis=1, bitorder="little")
            out.extend(int.from_bytes(row.tobytes(), "little") for row in packed)
            weights = block.sum(axis=1, dtype=np.int64).tolist()  # |y_p|
            s_g = 0
            for wt in reversed(weights):
                s_g = (s_g << w) | int(wt)
            out.append(s_g)  # S_g = Σ_p |y_p| 2^{wp}
        return out

    def _keys_message(self) -> bytes:
        proto = self.proto
        djn = proto._djn_for(self.pub)
        n, n2 = djn.n, djn.n2
        plain = self._packed_plaintexts()
        exp_bits = (self.key_bits + 1) // 2  # DJN: ⌈k/2⌉-bit exponent for A's own encryptions
        # A knows p and q: compute h_s^α mod p² and mod q² from two half-size tables, then CRT.
        p, q = gmpy2.mpz(self.priv.p), gmpy2.mpz(self.priv.q)
        p2, q2 = p * p, q * q
        tp = proto._table(djn.hs % p2, p2, exp_bits, len(plain))
        tq = proto._table(djn.hs % q2, q2, exp_bits, len(plain))
        p2inv = gmpy2.invert(p2, q2)
        nbits = tp.n_windows * tp.window

        def enc(ms):
            out = []
            for m in ms:
                a = secrets.randbits(nbits)
                rp, rq = tp.pow_random(a), tq.pow_random(a)
                r = rp + p2 * ((rq - rp) * p2inv % q2)  # = h_s^α mod N²
                out.append((1 + m * n) * r % n2)
            return out

        cts = proto._pool().map_chunks(enc, plain)
        n_a = self.bits.shape[0]
        n_groups = -(-n_a // self.slots)
        kb = _pt_width(self.key_bits)
        cw = _ct_width(self.key_bits)
        head = _header(PROTO_PACKED, MSG_KEYS) + _KEYS.pack(
            self.session, self.key_bits, self.n_bits, n_a, proto.sigma, self.w, self.slots, n_groups)
        return head + int(n).to_bytes(kb, "big") + int(djn.hs).to_bytes(cw, "big") + _to_bytes(cts, cw)

    def _decrypt(self, message) -> bytes:
        what = "result message from B"
        proto = self.proto
        buf = _parse_header(message, PROTO_PACKED, MSG_RESULT, what, proto.max_message_bytes)
        if len(buf) < _HDR.size + _RESULT.size:
            raise ProtocolError(f"{what}: truncated header")
        session, L, n_a, n_b, n_groups = _RESULT.unpack_from(buf, _HDR.size)
        if session != self.session:
            raise ProtocolError(f"{what}: session id does not match this run")
        if L != self.n_bits:
            raise ProtocolError(f"{what}: declares L = {L}, A has L = {self.n_bits}")
        my_na = self.bits.shape[0]
        my_groups = -(-my_na // self.slots)
        if n_a != my_na or n_groups != my_groups:
            raise ProtocolError(f"{what}: declares {n_a} vectors in {n_groups} groups, A has {my_na} in {my_groups}")
        _check_n(n_b, f"{what}: n_b")
        n = gmpy2.mpz(self.pub.n)
        n2 = n * n
        cw = _ct_width(self.key_bits)
        _check_len(buf, _HDR.size + _RESULT.size + n_groups * n_b * cw, what)
        cts = _parse_ciphertexts(buf, _HDR.size + _RESULT.size, n_groups * n_b, cw, n, n2, what)

        p, q = gmpy2.mpz(self.priv.p), gmpy2.mpz(self.priv.q)
        p2, q2 = p * p, q * q
        hp = gmpy2.invert((-q) % p, p)  # L_p((1+N)^(p-1) mod p²)^{-1} = (−q)^{-1} mod p
        hq = gmpy2.invert((-p) % q, q)
        pinv = gmpy2.invert(p, q)
        pm1, qm1 = p - 1, q - 1

        def dec(cs):
            out = []
            for c in cs:
                mp = (gmpy2.powmod(c % p2, pm1, p2) - 1) // p * hp % p
                mq = (gmpy2.powmod(c % q2, qm1, q2) - 1) // q * hq % q
                out.append(mp + p * ((mq - mp) * pinv % q))
            return out

        plains = proto._pool().map_chunks(dec, cts)
        P, w = self.slots, self.w
        u = np.empty((n_a, n_b), dtype=np.uint64)
        mask = (1 << w) - 1
        guard = proto.sigma + 1
        for g in range(n_groups):
            pg = min(P, n_a - g * P)
            top = w * pg
            for j in range(n_b):
                m = int(plains[g * n_b + j])
                if m >> (top + guard):
                    raise ProtocolError(f"{what}: result ({g}, {j}) has bits above its {pg} slots (tampered or buggy)")
                b = m.to_bytes((top + 7) // 8 + 8, "little")
                for p_ in range(pg):
                    s = w * p_
                    t = (int.from_bytes(b[s >> 3 : (s >> 3) + 9], "little") >> (s & 7)) & mask
                    u[g * P + p_, j] = t
        return _make_share(PROTO_PACKED, MSG_SHARE_A, self.session, self.n_bits, n_a, n_b, self.key_bits,
                           self.w, 8, b"", u.astype(">u8").tobytes(), slots=self.slots)


class _PackedB(_Saved):
    def __init__(self, proto: PaillierHamming, bits, n_bits):
        self.proto = proto
        self.bits = bits
        self.n_bits = n_bits
        self.stage = 0

    def receive(self, message):
        if self.stage != 0:
            raise ProtocolError("party B is already done")
        if message is None:
            raise ProtocolError("party B expected A's key message, got None")
        self.stage = 1
        return self._respond(message)

    def _chunk_bits(self, L: int, n_b: int) -> int:
        best, best_cost = 1, None
        for k in range(1, self.proto.max_chunk_bits + 1):
            nch = -(-L // k)
            cost = nch * ((1 << k) - 1 - k) + n_b * nch * (1 - 0.5**k)
            if best_cost is None or cost < best_cost:
                best, best_cost = k, cost
        return best

    def _respond(self, message) -> Outgoing:
        proto = self.proto
        what = "key message from A"
        session, key_bits, L, n_a, sigma, w, slots, n_groups, n_int, buf, off = _parse_keys(
            proto, message, self.n_bits, PROTO_PACKED)
        if sigma != proto.sigma:
            raise ProtocolError(f"{what}: sigma = {sigma}, B requires {proto.sigma}")
        my_w, my_slots = _slot_params(L, proto.sigma, key_bits)
        if w != my_w or slots != my_slots:
            raise ProtocolError(f"{what}: packing w = {w}, P = {slots} differs from B's w = {my_w}, P = {my_slots}")
        if n_groups != -(-n_a // slots):
            raise ProtocolError(f"{what}: {n_groups} groups cannot hold {n_a} vectors in {slots} slots")
        cw = _ct_width(key_bits)
        n = gmpy2.mpz(n_int)
        n2 = n * n
        G = L + 1  # ciphertexts per group: L packed bit positions, then S_g = Σ_p |y_p| 2^{wp}
        _check_len(buf, off + cw + n_groups * G * cw, what)
        hs = _parse_ciphertexts(buf, off, 1, cw, n, n2, what + " (h_s)")[0]
        ys = _parse_ciphertexts(buf, off + cw, n_groups * G, cw, n, n2, what)

        x = _unpack(self.bits, self.n_bits)
        n_b = x.shape[0]
        wx = _popcounts(self.bits)
        pool = proto._pool()

        # --- masks: ρ uniform in [0, 2^w) per slot (B's server share), from os.urandom
        sizes = [min(slots, n_a - g * slots) for g in range(n_groups)]
        c_mask = np.frombuffer(os.urandom(8 * n_a * n_b), dtype="<u8").reshape(n_a, n_b) & np.uint64((1 << w) - 1)
        sigma = proto.sigma

        # --- subset products: Π_{l: x_l=1} Y_{g,l}, by chunk tables
        k = self._chunk_bits(L, n_b)
        nch = -(-L // k)
        pad = nch * k - L
        xp = np.pad(x, ((0, 0), (0, pad))) if pad else x
        idx = (xp.reshape(n_b, nch, k).astype(np.int64) << np.arange(k, dtype=np.int64)).sum(axis=2)
        idx_rows = [row.tolist() for row in idx]
        prods = [[None] * n_b for _ in range(n_groups)]
        for g in range(n_groups):
            cg = ys[g * G : g * G + L]

            def build(chunks, cg=cg):
                tabs = []
                for ch in chunks:
                    base = cg[ch * k : min(L, ch * k + k)]
                    t = [None] * (1 << len(base))
                    for s in range(1, 1 << len(base)):
                        low = s & -s
                        i = low.bit_length() - 1
                        t[s] = base[i] if s == low else t[s ^ low] * base[i] % n2
                    tabs.append(t)
                return tabs

            tabs = pool.map_chunks(build, list(range(nch))) if k > 1 else [[None, c] for c in cg]

            def online(js, tabs=tabs):
                res = []
                for j in js:
                    acc = None
                    for t, s in zip(tabs, idx_rows[j]):
                        if s:
                            acc = t[s] if acc is None else acc * t[s] % n2
                    res.append(acc)
                return res

            prods[g] = pool.map_chunks(online, list(range(n_b)))
            del tabs

        # --- fresh encryption of the packed masks, times the product^{-2}
        exp_bits = key_bits + proto.sigma  # statistical re-randomisation (see module docstring)
        table = proto._table(hs, n2, exp_bits, n_groups * n_b)
        wx_list = [int(v) for v in wx]
        c_list = c_mask.tolist()

        def finish(items):
            out = []
            for g, j in items:
                pg = sizes[g]
                base = g * slots
                xw = wx_list[j]
                m = secrets.randbits(sigma)  # guard above the top slot: hides its carry-out
                for p_ in range(pg - 1, -1, -1):
                    m = (m << w) + c_list[base + p_][j] + xw
                e = (1 + m * n) * table.pow_random() % n2 * ys[g * G + L] % n2
                pr = prods[g][j]
                if pr is not None:
                    e = e * gmpy2.invert(pr * pr % n2, n2) % n2
                out.append(e)
            return out

        cts = pool.map_chunks(finish, [(g, j) for g in range(n_groups) for j in range(n_b)])
        msg = _header(PROTO_PACKED, MSG_RESULT) + _RESULT.pack(session, L, n_a, n_b, n_groups) + _to_bytes(cts, cw)
        share = _make_share(PROTO_PACKED, MSG_SHARE_B, session, L, n_a, n_b, key_bits, w, 8, b"",
                            c_mask.astype(">u8").tobytes(), slots=slots)
        return Outgoing(to_peer=msg, to_server=share, done=True)
