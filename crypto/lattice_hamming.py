"""SecureHamming, lattice variant: additively homomorphic Ring-LWE (crypto.rlwe) with the sums done
as dense matrix products. Implements :class:`crypto.hamming_api.HammingProtocol` (name ``"lattice"``).
(About 650 lines: the protocol's messages, both parties, their saved state and the coordinator's
step, read together with the security argument below, which every one of them relies on.)

A holds bit vectors x_1..x_{n_a}, B holds y_1..y_{n_b}, all of L bits; the coordinator ends with
H[p, b] = h(x_p, y_b) and nothing else. With h = |x| + |y| − 2⟨x, y⟩:

1. A (the key owner) packs its points into blocks of N = 4096 (coefficient p of a plaintext is
   point p of the block) and encrypts, per block of w points, the L bit columns m_l = Σ_p x_{p,l} X^p
   and the weights m_S = Σ_p |x_p| X^p under its secret key, r = ⌊N / w⌋ columns to a ciphertext
   (column l = k·r + j in slot j of ciphertext k: coefficients j·w … j·w + w − 1), so a site of
   500 points encrypts 129 polynomials, not 1,025. ct_k = (a_k, b_k), a_k expanded from a public
   seed, so only the b parts travel (and only the r·w coefficients of real slots). B brings column
   l to slot 0 as X^(−j·w)·ct_k (a negacyclic shift of a_k; b_k's slot j): the sums below see one
   ciphertext per column, exactly as if each were encrypted alone, and the other slots of the
   shifted ciphertexts are never decrypted (B returns b only on slot 0). A also sends its public
   key (p0; p1 from the seed).
2. B, for each of its vectors y (a chunk of them at a time), computes

       ct_y = ct_S − 2·Σ_l y_l ct_l + (0, Δ·(|y| + ρ_y)) + Enc_pk(0) + (0, f_y)

   which encrypts h(x_p, y) + ρ_{p,y} mod t in coefficient p. The sum over l for ALL of B's
   vectors at once is one dense product Y (c × L, 0/1) · [a-parts | b-parts] (L × 3(N + n_blk)) in
   float64 BLAS, exact because every part is below 2^36 and at most 8192 terms are summed (< 2^53).
   ρ_{p,y} is uniform in Z_t (t = 2^w > L), from a key only B and the coordinator know.
   Enc_pk(0) (fresh u, e1, e2) re-randomises the ciphertext: without it A, who knows every a_l,
   would read y off the a part. f_y is flooding noise, uniform in [−2^F, 2^F) on every coefficient
   A decrypts. What A decrypts besides f is −2 Σ_l y_l e_l (|·| ≤ 2Lη, depends on y) plus the
   re-randomisation noise e_pk·u + e2·s + e1 (|·| ≤ (2N + 1)η), which is NOT independent of y
   given the a part A sees (a = a_y + p1·u + e2, and A knows e_pk and s), so the flooding covers
   both: two y's move the noise by at most shift = 4Lη + 2(2N + 1)η per coefficient, which moves
   uniform flooding by at most shift/2^(F+1) in statistical distance. A job returns at most
   C = MAX_CIPHERTEXTS = 2^20 ciphertexts under A's key (A counts and refuses more), each of at most
   N decrypted coefficients, so with 2^F ≥ 2^σ · C · N · shift (σ = 40) A's whole view of a job
   moves by at most 2^−41 (F = 91 at L ≤ 1024, 92 at L = 4096 and 8192; :func:`flood_bits`).
   B then switches both parts down to q' = 2^k (k = 24 at L = 1024) and sends them.
3. A decrypts u_{p,y} = h + ρ mod t and sends all u to the coordinator; B sends its 32-byte ρ key.
   The coordinator expands ρ and outputs h = (u − ρ) mod t, refusing anything above L.

What each party sees. The coordinator: ρ (uniform, independent of the data) and u = h + ρ: h and
nothing else, perfectly. A: ciphertexts whose a part is pseudorandom (RLWE with B's secret u),
whose decrypted noise is, over the whole job, within 2^−40 of a distribution independent of y, and
messages u that are uniform in Z_t for any h: nothing about y. B: RLWE ciphertexts under A's key (128-bit by the HE
standard): nothing about x. A coalition of the coordinator with either site learns H (which the
coordinator has anyway) and that site's own data. Semi-honest parties, as the threat model says:
A is trusted to sample its errors from CBD(η) as specified; B's flooding bound relies on it.

Parameters (:func:`lattice_params`): N = 4096, q = 2^108 (≤ 109 bits: HE standard, 128-bit),
ternary secrets, CBD(21) errors, t = 2^(bit length of L), F from the flooding bound above, and k
the smallest multiple of 8 with E·2^(k−108) + (N + 1)/2 < 2^(k−w−1), where E bounds the noise at q
(flooding + (2L + 1)η + (2N + 1)η) and (N + 1)/2 the rounding of the switch with a ternary s
(k = 16 for small L, 24 at L = 1024, 32 from L = 2048 to 8192). q was 2^86 until the flooding bound
above was corrected: at 2^86 the noise budget leaves F ≤ 73, which covers fewer than five result
ciphertexts at σ = 40. Both sides check the parameters; a HELLO with parameters below the standard is refused.

Randomness and saved state. Each side draws one 32-byte key from os.urandom and expands every random
value from it (AES-256-CTR, crypto.rlwe, one subkey per use): A's master key gives s, its public
keys' errors and its columns' errors (per bit set, block and rows), B's secret gives ρ's key and the
re-randomisation and flooding of each (block, group of vectors). So a party saves as its key and its
progress (``state()``, ``LatticeHamming.restore_party``) and a restored party makes the very bytes
the saved one would have; and nothing is ever drawn twice for the same value — a fresh error for
A's columns under the same a (for another peer, or after a restore) would give two samples of one
a·s, and a fresh flooding of the same result two floodings to average.

Messages (``b"XLAT" | version | type``, then fixed little-endian fields; lengths are checked against
the header before anything is parsed; any violation raises ProtocolError):

    A→B  HELLO  L n_a N log_q log_t eta blocks seed[32] p0[N·14]  ‖ COLS of block 0
    A→B  COLS   block n_blk  b-words[⌈(L+1)/r⌉ · r · n_blk · 14]       (columns, then the weights)
    B→A  RES    block first count n_b  a'[count · N · k/8]  b'[count · n_blk · k/8]
    A→B  ACK    block next                                           (A is ready for the next chunk)
    A→S  SHARE_A  n_a n_b log_t  u[n_a · n_b] (u16)
    B→S  SHARE_B  n_a n_b log_t  key[32]

A blocked graph's candidate blocks of one pair run in ONE run of this protocol with the results
packed (crypto.lattice_blocks: the same messages, b parts only at the candidates' coefficients).

B answers A's block with RES messages of about ``target_message_bytes`` each; A acknowledges each
one, and after the last chunk of a block sends the next block's COLS. Bytes per pair at L = 1024
and large sites: about 14·(L+1)/n_b (A→B) + 3·(N + n_blk)/n_blk (B→A) + 2 (A's share).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from crypto import rlwe
from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, check_bits
from crypto.secure_sum import prg_uint64
from crypto.state import State, pack

MAGIC = b"XLAT"
VERSION = 3  # 2: A's columns packed r to a ciphertext; 3: q = 2^108, the uniform seed bound to A's bits
HELLO, COLS, RES, ACK, SHARE_A, SHARE_B = 1, 2, 3, 4, 5, 6
_HDR = struct.Struct("<4sBB")
_HELLO = struct.Struct("<IIIBBBI32s")
_COLS = struct.Struct("<II")
_RES = struct.Struct("<IIII")  # block, first, count, n_b
_ACK = struct.Struct("<II")
_SHARE = struct.Struct("<IIB")
SIGMA = 40  # statistical security of the flooding, over every ciphertext a job returns
# The flooding covers at most this many result ciphertexts decrypted under one key of A (one job:
# a site is A under one key for all its peers; one ciphertext per vector of B and block of A).
# A counts them and refuses more; B refuses a pair that would need more on its own.
MAX_CIPHERTEXTS = 1 << 20
MAX_BITS = 8192  # 3 parts of 36 bits × 8192 terms < 2^53: the 0/1 products are exact in float64
MAX_MESSAGES = 512  # a pair never takes more; B makes its chunks large enough
SUB_BATCH = 32  # B's vectors per step of its computation: the arrays stay in cache


@dataclass(frozen=True)
class LatticeParams:
    n_bits: int
    ring: rlwe.RLWEParams
    flood_bits: int  # F: flooding noise uniform in [−2^F, 2^F)
    log_q_out: int  # k: results travel modulo 2^k

    @property
    def log_t(self) -> int:
        return self.ring.log_t


def flood_shift(n_bits: int, n: int = rlwe.N_DEFAULT, eta: int = rlwe.ETA) -> int:
    """The bound, per coefficient, on how much A's decrypted noise can differ between two vectors y,
    y' of B before flooding: 4Lη for the columns' noise (−2 Σ_l y_l e_l, |·| ≤ 2Lη, twice) plus
    2(2N + 1)η for the re-randomisation noise (e_pk·u + e2·s + e1, |·| ≤ (2N + 1)η, twice). The
    latter is not independent of y given the a part A sees (a = a_y + p1·u + e2), so it is flooded
    too, as in Gentry's and Ducas–Stehlé's circuit privacy arguments."""
    return 4 * n_bits * eta + 2 * (2 * n + 1) * eta


def flood_bits(n_bits: int, n: int = rlwe.N_DEFAULT, eta: int = rlwe.ETA, ciphertexts: int = MAX_CIPHERTEXTS,
               sigma: int = SIGMA) -> int:
    """The least F with 2^F ≥ 2^σ · C · N · shift, i.e. F ≥ σ + log2(N·(4Lη + 2(2N+1)η)) + log2(C).
    Uniform flooding on [−2^F, 2^F) moved by at most `shift` differs by at most shift/2^(F+1) in
    statistical distance per coefficient; a ciphertext has at most N decrypted coefficients and a job
    at most C ciphertexts, so A's whole view of a job moves by at most C·N·shift/2^(F+1) ≤ 2^−(σ+1)
    (hybrid argument over independent flooding)."""
    return sigma + (ciphertexts * n * flood_shift(n_bits, n, eta) - 1).bit_length()


def flooding_distance_log2(params: LatticeParams, ciphertexts: int = MAX_CIPHERTEXTS) -> float:
    """log2 of the bound on the statistical distance of A's view of a whole job (C ciphertexts)."""
    n, eta = params.ring.n, params.ring.eta
    return math.log2(ciphertexts * n * flood_shift(params.n_bits, n, eta)) - (params.flood_bits + 1)


def lattice_params(n_bits: int, n: int = rlwe.N_DEFAULT, eta: int = rlwe.ETA) -> LatticeParams:
    """The parameters for L = n_bits, with the security and correctness conditions checked."""
    if not isinstance(n_bits, (int, np.integer)) or not 1 <= n_bits <= MAX_BITS:
        raise ProtocolError(f"the lattice protocol takes 1 ≤ L ≤ {MAX_BITS}, got {n_bits!r}")
    L = int(n_bits)
    ring = rlwe.RLWEParams(n=n, log_t=L.bit_length(), eta=eta)  # checks the HE standard
    flood = flood_bits(L, n, eta)
    # the bound, checked in exact integers: C · N · shift ≤ 2^(F − σ), so the job's distance ≤ 2^−(σ+1)
    assert MAX_CIPHERTEXTS * n * flood_shift(L, n, eta) <= 1 << (flood - SIGMA)
    # decryption: flooding + (2L + 1)η (A's columns and weights) + (2N + 1)η (re-randomisation) at q
    noise_at_q = (1 << flood) + (2 * L + 1) * eta + (2 * n + 1) * eta
    w = ring.log_t
    for k in range(8, 33, 8):  # RES values travel as 1 … 4 bytes
        # after switching: noise·2^(k−log q) + (N + 1)/2 (rounding, ternary s) < Δ'/2 = 2^(k−w−1)
        if 2 * noise_at_q * 2**k + (n + 1) * 2**rlwe.LOG_Q < 2 ** (rlwe.LOG_Q + k - w):
            return LatticeParams(L, ring, flood, k)
    raise ProtocolError(f"no result modulus fits L = {L} at N = {n}: the noise would not decrypt")


def _header(mtype: int) -> bytes:
    return _HDR.pack(MAGIC, VERSION, mtype)


def _open(message, expected: tuple[int, ...], max_bytes: int) -> tuple[int, memoryview]:
    if message is None:
        raise ProtocolError("lattice: expected a message, got none")
    mv = memoryview(message)
    if len(mv) > max_bytes:
        raise ProtocolError(f"lattice: message of {len(mv)} bytes exceeds the limit of {max_bytes}")
    if len(mv) < _HDR.size:
        raise ProtocolError("lattice: message too short")
    magic, version, mtype = _HDR.unpack_from(mv)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError("lattice: not a lattice-protocol message (magic or version)")
    if mtype not in expected:
        raise ProtocolError(f"lattice: unexpected message type {mtype}, expected {expected}")
    return mtype, mv[_HDR.size :]


def _need(body: memoryview, n: int, what: str) -> None:
    if len(body) != n:
        raise ProtocolError(f"lattice: {what} has {len(body)} bytes, its header says {n}")


def _blocks(n_points: int, n: int) -> list[tuple[int, int]]:
    return [(s, min(s + n, n_points)) for s in range(0, n_points, n)]


def _parallel(fn, items: list, threads: int) -> list:
    """fn over items on `threads` threads (numpy, BLAS, the FFT and AES release the GIL), with BLAS
    itself held to one thread meanwhile so that the cores are not oversubscribed."""
    if threads <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, items))


def rho(key: bytes, group: int, n_a: int, log_t: int) -> np.ndarray:
    """B's masks ρ for its vectors SUB_BATCH·group … SUB_BATCH·(group + 1) − 1 against all of A's
    points, (SUB_BATCH, n_a): stream `group` of AES-256-CTR under B's key, as uint16 values mod t."""
    words = prg_uint64(key, SUB_BATCH * ((n_a + 3) // 4), stream=group)
    values = words.view("<u2").reshape(SUB_BATCH, -1)[:, :n_a]
    return (values & np.uint16((1 << log_t) - 1)).astype(np.int64)


class LatticeHamming:
    """The lattice Hamming protocol. One object per job: A's key and encrypted columns are made
    once per site and reused for every peer (each peer's results are re-randomised and flooded
    afresh, so sharing A's ciphertexts between peers reveals nothing more)."""

    name = "lattice"

    def __init__(self, *, n: int = rlwe.N_DEFAULT, target_message_bytes: int = 16 << 20,
                 max_message_bytes: int = 1 << 31, threads: int | None = None):
        self.n = n
        self.threads = max(1, int(threads or os.cpu_count() or 1))
        self.target_message_bytes = int(target_message_bytes)
        self.max_message_bytes = int(max_message_bytes)
        self._key: rlwe.SecretKey | None = None
        self._master: bytes | None = None  # the seeds of the uniform polynomials are derived from it
        self._public: dict[bytes, bytes] = {}  # uniform seed → p0 bytes
        self._columns: dict[tuple[bytes, int], dict[int, bytes]] = {}  # (digest, L) → block → COLS body
        self.decrypted = 0  # result ciphertexts decrypted under this key (≤ MAX_CIPHERTEXTS)

    def party_a(self, bits: np.ndarray, n_bits: int) -> LatticePartyA:
        return LatticePartyA(self, check_bits(bits, n_bits, "A's bits"), int(n_bits))

    def party_b(self, bits: np.ndarray, n_bits: int, secret: bytes | None = None) -> LatticePartyB:
        return LatticePartyB(self, check_bits(bits, n_bits, "B's bits"), int(n_bits), secret)

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray:
        """The coordinator's step: h = (u − ρ) mod t, checked to lie in [0, L]."""
        p = lattice_params(n_bits, self.n)
        _, body_a = _open(share_a, (SHARE_A,), self.max_message_bytes)
        _, body_b = _open(share_b, (SHARE_B,), 1 << 16)
        for who, body in (("A", body_a), ("B", body_b)):
            if len(body) < _SHARE.size:
                raise ProtocolError(f"lattice: {who}'s share is too short")
            sa, sb, lt = _SHARE.unpack_from(body)
            if (sa, sb, lt) != (n_a, n_b, p.log_t):
                raise ProtocolError(f"lattice: {who}'s share is for {sa} × {sb} points and log t = {lt}, "
                                    f"expected {n_a} × {n_b} and {p.log_t}")
        _need(body_a, _SHARE.size + 2 * n_a * n_b, "A's share")
        _need(body_b, _SHARE.size + 32, "B's share")
        u = np.frombuffer(body_a[_SHARE.size :], dtype="<u2").reshape(n_a, n_b).astype(np.int64)
        key = bytes(body_b[_SHARE.size :])
        t = 1 << p.log_t
        h = np.empty((n_a, n_b), dtype=np.int32)
        for g, b0 in enumerate(range(0, n_b, SUB_BATCH)):
            b1 = min(b0 + SUB_BATCH, n_b)
            h[:, b0:b1] = (u[:, b0:b1] - rho(key, g, n_a, p.log_t)[: b1 - b0].T) & (t - 1)
        if h.max(initial=0) > n_bits:
            raise ProtocolError("lattice: the shares do not combine into distances (a value exceeds L)")
        return h

    # -- A's per-job state, shared by all its pairs ------------------------------------------------
    def _secret(self, params: LatticeParams, digest: bytes) -> tuple[rlwe.SecretKey, bytes, bytes]:
        """A's key, the seed of the uniform polynomials for the bit set with SHA-256 `digest`, and p0.
        The seed is bound to the bits it encrypts (and to L): were two bit sets encrypted under the
        same a, B would subtract the b parts and read x − x' (up to small noise). One bit set per seed,
        so every a is used once."""
        if self._master is None:
            self._master = os.urandom(32)  # the one draw: s and every error of A below expand from it
        if self._key is None:
            self._key = rlwe.SecretKey.generate(params.ring, key=rlwe.subkey(self._master, "secret"))
        if self._key.params.log_t != params.log_t:  # t follows L: same s, a key per t
            self._key = rlwe.SecretKey(params.ring, self._key.s)
        seed = hashlib.sha256(b"xclp/lattice/uniform-seed/v1" + self._master
                              + struct.pack("<I", params.n_bits) + digest).digest()
        if seed not in self._public:
            pk = self._key.public_key(seed, stream=_pk_stream(params.n_bits),
                                      noise_key=rlwe.subkey(self._master, "public-key", seed))
            self._public[seed] = rlwe.words_to_bytes(pk.p0)
        return self._key, seed, self._public[seed]

    # -- saved state (crypto.state: no pickle) -------------------------------------------------------
    def state(self) -> bytes:
        """A's job-wide secret: the master key (s, its public keys' and columns' errors all expand
        from it, so nothing else is kept) and the count of results decrypted under it."""
        return pack({"master": self._master or b"", "decrypted": self.decrypted})

    def restore(self, data: bytes) -> LatticeHamming:
        s = State(data, "lattice protocol")
        master = s.bytes("master")
        if master and len(master) != 32:
            raise ProtocolError("lattice: a saved master key is 32 bytes")
        self._master, self._key, self._public, self._columns = master or None, None, {}, {}
        self.decrypted = s.int("decrypted", 0, MAX_CIPHERTEXTS)
        return self

    def restore_party(self, bits: np.ndarray, n_bits: int, data: bytes) -> LatticePartyA | LatticePartyB:
        s = State(data, "lattice party")
        role = s.str("role")
        cls = LatticePartyA if role == "a" else LatticePartyB
        return cls.restore(self, bits, n_bits, s)

    def _count(self, ciphertexts: int) -> None:
        """A decrypts `ciphertexts` more results under its key: refused past MAX_CIPHERTEXTS, the
        number the flooding covers."""
        if self.decrypted + ciphertexts > MAX_CIPHERTEXTS:
            raise ProtocolError(f"lattice: more than {MAX_CIPHERTEXTS} result ciphertexts under one key, past what "
                                "the flooding covers")
        self.decrypted += ciphertexts

    def _cols(self, params: LatticeParams, bits: np.ndarray, block: int, start: int, stop: int) -> bytes:
        digest = hashlib.sha256(bits.tobytes()).digest()
        store = self._columns.setdefault((digest, params.n_bits), {})
        if block not in store:
            key, seed, _ = self._secret(params, digest)
            L, width = params.n_bits, stop - start
            r, count = packing(L, width, self.n)
            x = np.unpackbits(bits[start:stop], axis=1, count=L).astype(np.int64)  # (width, L)
            columns = np.zeros((count * r, width), dtype=np.int64)  # column l = k·r + j: slot j of ciphertext k
            columns[:L] = x.T
            columns[L] = x.sum(axis=1)
            m = np.zeros((count, self.n), dtype=np.int64)
            m[:, : r * width] = columns.reshape(count, r * width)
            a = rlwe.uniform_poly(seed, count, self.n, stream=block)
            rows = [(c, min(c + 64, count)) for c in range(0, count, 64)]
            # errors keyed by the master key, block and rows: the same ciphertexts whenever they are
            # made (for another peer, after a restore) — a fresh error under the same a would hand
            # two peers two samples of one a·s to average
            parts = _parallel(lambda c: key.encrypt(a[:, c[0] : c[1]], m[c[0] : c[1]],
                                                    rlwe.subkey(self._master, "columns", seed, block, c[0]))
                              [:, :, : r * width], rows, self.threads)
            b = np.concatenate(parts, axis=1)
            store[block] = _header(COLS) + _COLS.pack(block, width) + rlwe.words_to_bytes(b)
        return store[block]


def packing(n_bits: int, width: int, n: int) -> tuple[int, int]:
    """(r, count): A's L + 1 columns of a block of `width` points go r to a ciphertext (slot j holds
    coefficients j·width … (j + 1)·width − 1), in `count` ciphertexts. A small site thus encrypts
    ⌈(L + 1)/r⌉ polynomials, not L + 1."""
    r = max(1, min(n // width, n_bits + 1))
    return r, -(-(n_bits + 1) // r)


def parse_hello(body: memoryview, p: LatticeParams, n: int,
                extra: int = 0) -> tuple[int, int, bytes, rlwe.PublicKey, bytes, memoryview]:
    """A HELLO's fields after its header, checked against this side's parameters: (n_a, blocks,
    seed, A's public key, the `extra` bytes between the fixed fields and p0 (crypto.lattice_blocks:
    the layout's digest), the rest of the body)."""
    if len(body) < _HELLO.size + extra:
        raise ProtocolError("lattice: HELLO too short")
    L, n_a, ring_n, log_q, log_t, eta, blocks, seed = _HELLO.unpack_from(body)
    try:  # refuses anything below the HE security standard before comparing with ours
        ring = rlwe.RLWEParams(n=ring_n, log_t=log_t, eta=eta, log_q=log_q)
    except ProtocolError as exc:
        raise ProtocolError(f"lattice: A's parameters are refused: {exc}") from None
    if (L, ring) != (p.n_bits, p.ring):
        raise ProtocolError(f"lattice: A uses L = {L}, N = {ring_n}, log q = {log_q}, log t = {log_t}, η = {eta}; "
                            f"this side expects L = {p.n_bits}, N = {n}, log q = {p.ring.log_q}, "
                            f"log t = {p.log_t}, η = {p.ring.eta}")
    p0_start = _HELLO.size + extra
    p0_end = p0_start + n * rlwe.COEFF_BYTES
    if len(body) < p0_end:
        raise ProtocolError("lattice: HELLO too short for its public key")
    p0 = rlwe.words_from_bytes(body[p0_start:p0_end], n, "public key")
    p1 = rlwe.uniform_poly(seed, 1, n, stream=_pk_stream(L))[:, 0]
    return n_a, blocks, seed, rlwe.PublicKey(ring, p0, p1), bytes(body[_HELLO.size : p0_start]), body[p0_end:]


def column_matrix(seed: bytes, words: memoryview, block: int, width: int, n_bits: int,
                  n: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """B's view of A's block `block` of `width` points from its COLS b-words: the (L, 3N + 3·width)
    float64 matrix of 36-bit parts of every column's (a | b) as brought to slot 0, and the weights'
    ciphertext (a words (2, N), b words (2, width)). Used by every pair run (crypto.lattice_blocks too)."""
    L = n_bits
    r, count = packing(L, width, n)
    b = rlwe.words_from_bytes(words, count * r * width, "COLS").reshape(2, count * r, width)
    a = rlwe.uniform_poly(seed, count, n, stream=block)
    neg = rlwe.normalise(-a[0], -a[1])
    # Column l = k·r + j sits in slot j of ciphertext k: X^(−j·width) · ct_k brings it to slot 0.
    # Its b part there is b_k's slot j; its a part is a_k shifted negacyclically, X^(−s) a[c] =
    # a[c + s] for c + s < N and −a[c + s − N] after: the window s … s + N of [a_k | −a_k].
    doubled = np.concatenate([a, neg], axis=2)  # (2, count, 2N) words
    parts = rlwe.to_parts(doubled)  # (3, count, 2N): 36-bit parts, float64
    m = np.empty((L, 3 * n + 3 * width), dtype=np.float64)  # filled in place: one pass per part
    for j in range(r):
        ks, shift = len(range(j, L, r)), j * width
        for part in range(3):
            m[j:L:r, part * n : (part + 1) * n] = parts[part, :ks, shift : shift + n]
    b_parts = rlwe.to_parts(b[:, :L])  # (3, L, width)
    for part in range(3):
        m[:, 3 * n + part * width : 3 * n + (part + 1) * width] = b_parts[part]
    k, j = divmod(L, r)
    return m, (doubled[:, k, j * width : j * width + n].copy(), b[:, L].copy())


def _pk_stream(n_bits: int) -> int:
    return (1 << 62) + n_bits  # never a block's stream


class _Party:
    def __init__(self, proto: LatticeHamming, bits: np.ndarray, n_bits: int):
        self.proto = proto
        self.bits = bits
        self.params = lattice_params(n_bits, proto.n)
        self.failed = False
        self.finished = False
        self.messages = 0

    def _common(self) -> dict:
        return {"failed": self.failed, "finished": self.finished, "messages": self.messages}

    def _set_common(self, s: State) -> None:
        self.failed, self.finished = s.bool("failed"), s.bool("finished")
        self.messages = s.int("messages", 0, MAX_MESSAGES)

    def receive(self, message: bytes | None) -> Outgoing:
        if self.failed:
            raise ProtocolError("lattice: this party has already failed")
        if self.finished:
            raise ProtocolError("lattice: this party has already finished")
        self.messages += 1
        if self.messages > MAX_MESSAGES:
            self.failed = True
            raise ProtocolError("lattice: too many messages for one pair")
        try:
            return self._step(message)
        except Exception:
            self.failed = True
            raise


class LatticePartyA(_Party):
    """A: the key owner (encrypted side)."""

    def __init__(self, proto: LatticeHamming, bits: np.ndarray, n_bits: int):
        super().__init__(proto, bits, n_bits)
        self.n_a = bits.shape[0]
        self.digest = hashlib.sha256(bits.tobytes()).digest()
        self.blocks = _blocks(self.n_a, proto.n)
        self.block = 0
        self.next = 0  # B's next vector in the current block
        self.n_b: int | None = None
        self.share: np.ndarray | None = None
        self.started = False

    def _step(self, message):
        p = self.params
        if message is None:
            if self.started:
                raise ProtocolError("lattice: A has already started")
            self.started = True
            _, seed, p0 = self.proto._secret(p, self.digest)
            hello = _header(HELLO) + _HELLO.pack(p.n_bits, self.n_a, self.proto.n, p.ring.log_q, p.log_t, p.ring.eta,
                                                 len(self.blocks), seed) + p0
            return Outgoing(to_peer=hello + self._cols(0))
        if not self.started:
            raise ProtocolError("lattice: A speaks first (HELLO) and then takes only RES messages")
        _, body = _open(message, (RES,), self.proto.max_message_bytes)
        if len(body) < _RES.size:
            raise ProtocolError("lattice: RES too short")
        block, first, count, n_b = _RES.unpack_from(body)
        if self.n_b is None:
            if first != 0 or block != 0 or n_b < 1:
                raise ProtocolError("lattice: the first RES must start block 0 at vector 0")
            self.n_b = n_b
            self.share = np.zeros((self.n_a, n_b), dtype=np.uint16)
        elif (block, first, n_b) != (self.block, self.next, self.n_b):
            raise ProtocolError(f"lattice: RES for block {block} from vector {first}; expected block {self.block} "
                                f"from vector {self.next}")
        start, stop = self.blocks[block]
        if not 1 <= count <= self.n_b - first:
            raise ProtocolError("lattice: RES count out of range")
        qb = p.log_q_out // 8
        n = self.proto.n
        _need(body, _RES.size + count * (n + stop - start) * qb, "RES")
        off = _RES.size
        a = rlwe.small_from_bytes(body[off : off + count * n * qb], count * n, p.log_q_out, "RES a").reshape(count, n)
        off += count * n * qb
        b = rlwe.small_from_bytes(body[off:], count * (stop - start), p.log_q_out, "RES b").reshape(count, stop - start)
        self.proto._count(count)
        key, _, _ = self.proto._secret(p, self.digest)

        def decrypt(r):
            m, _ = key.decrypt_switched(a[r : r + SUB_BATCH], b[r : r + SUB_BATCH], p.log_q_out)
            self.share[start:stop, first + r : first + r + m.shape[0]] = m.T

        _parallel(decrypt, list(range(0, count, SUB_BATCH)), self.proto.threads)
        self.next = first + count
        if self.next < self.n_b:
            return Outgoing(to_peer=_header(ACK) + _ACK.pack(self.block, self.next))
        self.block += 1
        self.next = 0
        if self.block < len(self.blocks):
            return Outgoing(to_peer=self._cols(self.block))
        self.finished = True
        out = _header(SHARE_A) + _SHARE.pack(self.n_a, self.n_b, p.log_t) + self.share.astype("<u2").tobytes()
        self.share = None
        return Outgoing(to_server=out, done=True)

    def _cols(self, block: int) -> bytes:
        start, stop = self.blocks[block]
        return self.proto._cols(self.params, self.bits, block, start, stop)

    def state(self) -> bytes:
        """A's progress and the results decrypted so far (its key is the protocol's: LatticeHamming.state)."""
        return pack({"role": "a", **self._common(), "started": self.started, "block": self.block, "next": self.next,
                     "n_b": self.n_b, **({"share": self.share} if self.share is not None else {})})

    @classmethod
    def restore(cls, proto: LatticeHamming, bits: np.ndarray, n_bits: int, s: State) -> LatticePartyA:
        a = proto.party_a(bits, n_bits)
        a._set_common(s)
        a.started, a.block = s.bool("started"), s.int("block", 0, len(a.blocks))
        n_b = s.json("n_b")
        if n_b is not None and (isinstance(n_b, bool) or not isinstance(n_b, int) or n_b < 1):
            raise ProtocolError("lattice: a saved party A has a bad n_b")
        a.n_b, a.next = n_b, s.int("next", 0, n_b or 0)
        a.share = s.optional_array("share", np.uint16, (a.n_a, n_b))
        return a



class LatticePartyB(_Party):
    """B: the evaluating side. It never decrypts; it re-randomises, floods and switches every result."""

    def __init__(self, proto: LatticeHamming, bits: np.ndarray, n_bits: int, secret: bytes | None = None):
        super().__init__(proto, bits, n_bits)
        self.n_b = bits.shape[0]
        # B's one draw (or an injected key): ρ's key (its share for the coordinator) and every
        # re-randomisation and flooding draw, one subkey per (block, group), expand from it. So a
        # restored B makes the same results; and a B restored from an older state and asked again
        # sends the SAME result, never a second independently flooded one that A could average.
        self.secret = os.urandom(32) if secret is None else bytes(secret)
        if len(self.secret) != 32:
            raise ProtocolError("lattice: B's secret is 32 bytes")
        self.rho_key = rlwe.subkey(self.secret, "rho")
        self.public: rlwe.PublicKey | None = None
        self.seed: bytes | None = None
        self.n_a = 0
        self.blocks: list[tuple[int, int]] = []
        self.block = -1
        self.next = 0
        self.matrix: np.ndarray | None = None  # (L, 3N + 3 n_blk) float64: 36-bit parts of the block's columns
        self.weights_ct: np.ndarray | None = None  # (a words (2, N), b words (2, n_blk)) of Enc(|x|)
        self.cols: bytes | None = None  # the block's COLS body: the matrix is rebuilt from it on restore

    def state(self) -> bytes:
        """B's secret, A's public key and the block in progress (its COLS body, not the matrix made
        from it: a fraction of the size, and the matrix is remade exactly)."""
        live = self.public is not None and not self.finished
        return pack({"role": "b", **self._common(), "secret": self.secret, "n_a": self.n_a,
                     "seed": self.seed or b"", "block": self.block, "next": self.next,
                     **({"p0": self.public.p0, "cols": self.cols} if live else {})})

    @classmethod
    def restore(cls, proto: LatticeHamming, bits: np.ndarray, n_bits: int, s: State) -> LatticePartyB:
        b = cls(proto, check_bits(bits, n_bits, "B's bits"), int(n_bits), s.bytes("secret", 32))
        b._set_common(s)
        b.seed, b.n_a = s.bytes("seed") or None, s.int("n_a", 0)
        b.blocks = _blocks(b.n_a, proto.n)
        b.block, b.next = s.int("block", -1, len(b.blocks)), s.int("next", 0, b.n_b)
        if "p0" in s:  # a block in progress: A's public key, and the block's matrix made again
            if b.seed is None or len(b.seed) != 32 or not 0 <= b.block < len(b.blocks):
                raise ProtocolError("lattice: a saved party B in a block has no seed or a bad block")
            p1 = rlwe.uniform_poly(b.seed, 1, proto.n, stream=_pk_stream(b.params.n_bits))[:, 0]
            b.public = rlwe.PublicKey(b.params.ring, s.array("p0", np.int64, (2, proto.n)), p1)
            block, after = b.block, b.next
            b.block, b.next = block - 1, b.n_b  # as just before the block's COLS came
            b._columns(memoryview(s.bytes("cols")))
            b.next = after
        return b

    def _step(self, message):
        p, n = self.params, self.proto.n
        if message is None:
            raise ProtocolError("lattice: B speaks only after A's HELLO")
        mtype, body = _open(message, (HELLO,) if self.public is None else (ACK, COLS), self.proto.max_message_bytes)
        share = None
        if mtype == HELLO:
            body = self._hello(body)
            share = _header(SHARE_B) + _SHARE.pack(self.n_a, self.n_b, p.log_t) + self.rho_key
            mtype, body = _open(body, (COLS,), self.proto.max_message_bytes)
        if mtype == COLS:
            self._columns(body)
        else:
            if len(body) != _ACK.size or _ACK.unpack_from(body) != (self.block, self.next):
                raise ProtocolError(f"lattice: ACK out of order (expected block {self.block}, vector {self.next})")
        start, stop = self.blocks[self.block]
        qb = p.log_q_out // 8
        per_vector = (n + stop - start) * qb
        count = max(self.proto.target_message_bytes // per_vector, -(-self.n_b // 64), 1)
        count = min(-(-count // SUB_BATCH) * SUB_BATCH, self.n_b - self.next)  # whole groups of ρ
        out = self._results(self.next, count)
        self.next += count
        done = self.next == self.n_b and self.block == len(self.blocks) - 1
        if done:  # a site is B for many peers at once: free the block's matrix as soon as possible
            self.finished, self.matrix, self.weights_ct, self.cols = True, None, None, None
        return Outgoing(to_peer=out, to_server=share, done=done)

    def _hello(self, body: memoryview) -> memoryview:
        n_a, blocks, seed, public, _, rest = parse_hello(body, self.params, self.proto.n)
        if n_a < 1 or blocks != len(_blocks(n_a, self.proto.n)):
            raise ProtocolError(f"lattice: HELLO declares {n_a} points in {blocks} blocks")
        if blocks * self.n_b > MAX_CIPHERTEXTS:
            raise ProtocolError(f"lattice: {blocks} blocks × {self.n_b} vectors are more than the {MAX_CIPHERTEXTS} "
                                "result ciphertexts the flooding covers")
        self.public, self.seed, self.n_a, self.blocks = public, seed, n_a, _blocks(n_a, self.proto.n)
        return rest

    def _columns(self, body: memoryview) -> None:
        n, L = self.proto.n, self.params.n_bits
        if self.block >= 0 and self.next != self.n_b:
            raise ProtocolError("lattice: COLS before the previous block's results were through")
        if len(body) < _COLS.size:
            raise ProtocolError("lattice: COLS too short")
        block, width = _COLS.unpack_from(body)
        if block != self.block + 1 or block >= len(self.blocks):
            raise ProtocolError(f"lattice: COLS for block {block}, expected {self.block + 1}")
        start, stop = self.blocks[block]
        if width != stop - start:
            raise ProtocolError(f"lattice: COLS of block {block} has {width} points, expected {stop - start}")
        r, count = packing(L, width, n)
        _need(body, _COLS.size + count * r * width * rlwe.COEFF_BYTES, "COLS")
        self.cols = bytes(body)
        self.matrix = None  # free the previous block's matrix first
        self.matrix, self.weights_ct = column_matrix(self.seed, body[_COLS.size :], block, width, L, n)
        self.block, self.next = block, 0

    def _results(self, first: int, count: int) -> bytes:
        """RES for B's vectors first … first + count − 1 (first is a multiple of SUB_BATCH)."""
        p, L = self.params, self.params.n_bits
        y = np.unpackbits(self.bits[first : first + count], axis=1, count=L)
        # Σ_l y_l ct_l for every vector at once: one dense product of 36-bit parts, exact in float64
        # (L ≤ 8192 terms: every sum stays below 2^49 < 2^53).
        assert L <= rlwe.MAX_PART_TERMS
        sums = y.astype(np.float64) @ self.matrix
        weights = y.sum(axis=1, dtype=np.int64)
        k = p.log_q_out

        def batch(s):  # the rest in small batches, on all cores
            e = min(s + SUB_BATCH, count)
            a, b = self._finish(sums[s:e], weights[s:e], (first + s) // SUB_BATCH)
            return rlwe.small_to_bytes(rlwe.mod_switch(a, k), k), rlwe.small_to_bytes(rlwe.mod_switch(b, k), k)

        parts = _parallel(batch, list(range(0, count, SUB_BATCH)), self.proto.threads)
        return (_header(RES) + _RES.pack(self.block, first, count, self.n_b)
                + b"".join(x for x, _ in parts) + b"".join(x for _, x in parts))

    def _finish(self, sums: np.ndarray, weights: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
        """From Σ_l y_l ct_l (sums of 36-bit parts, exact float64) to ciphertexts at q of h + ρ: add the
        weights and the masks, re-randomise with a fresh encryption of zero, flood."""
        p, n = self.params, self.proto.n
        count = sums.shape[0]
        start, stop = self.blocks[self.block]
        width = stop - start
        acc = sums.astype(np.int64, copy=False)
        ya = rlwe.from_part_sums(acc[:, :n], acc[:, n : 2 * n], acc[:, 2 * n : 3 * n])  # words (2, count, N)
        yb = rlwe.from_part_sums(*(acc[:, 3 * n + i * width : 3 * n + (i + 1) * width] for i in range(3)))
        sa, sb = self.weights_ct
        # −2·Σ_l y_l ct_l + ct_S + Δ·(|y| + ρ) encrypts |x| + |y| − 2⟨x, y⟩ + ρ = h + ρ (mod t); a fresh
        # encryption of zero re-randomises it and the flooding noise is added, all in one reduction
        # per part (every partial sum stays below 2^57, far inside int64).
        masks = rho(self.rho_key, group, self.n_a, p.log_t)[:count, start:stop]
        shifted = (weights[:, None] + masks) << (p.ring.delta_shift - rlwe.WORD)
        za, zb = self.public.encrypt_zero(count, rlwe.subkey(self.secret, "zero", self.block, group))
        flood = rlwe.sample_flood((count, width), p.flood_bits, rlwe.subkey(self.secret, "flood", self.block, group))
        a = rlwe.normalise(-2 * ya[0] + sa[0] + za[0], -2 * ya[1] + sa[1] + za[1])
        b = rlwe.normalise(-2 * yb[0] + sb[0] + zb[0, :, :width] + flood[0],
                           -2 * yb[1] + sb[1] + shifted + zb[1, :, :width] + flood[1])
        return a, b
