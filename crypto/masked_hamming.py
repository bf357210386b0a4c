"""Hamming distances at a pair's candidate entries only, from codes masked under keys the coordinator
does not hold: the "masked" protocol. (About 570 lines: the construction and its argument, the views,
both parties with their saved state, the coordinator's step and the whole-site runs — one scheme.) Its work grows with the candidates and its bytes with the points
and the candidates, never with n_a × n_b (issue 35) — and it trusts the coordinator not to collude with
a site (Traits.trusts_coordinator).

Threat model: semi-honest parties, and a coordinator that does not collude with any site (the model
docs/security.md states for the secure sum and the blocked graph's tags). Under it, a third party that
holds no input makes inner products cheap: Beaver, "Commodity-based cryptography", STOC 1997; Du &
Atallah, "Protocols for secure remote database access with approximate matching", 2001 (a scalar
product with a commodity server). The construction here needs no dealt randomness: the sites mask their
codes under keys the coordinator never sees, the COORDINATOR evaluates the masked inner products, and the
sites cancel the cross terms with per-candidate shares, themselves masked by a key of the pair.

Notation. L bits per code, t = 2^k with k = bit length of L (t > L, so a distance h ∈ [0, L] is its own
residue mod t; k = 11 at L = 1024). Each site j draws ONE mask key K_j per job (32 bytes, os.urandom; the
session keeps it). A's points p, B's points q, x_p, y_q ∈ {0,1}^L; the pair's candidate entries E in a
fixed order e = 0 … |E| − 1 (by A's point, then B's). All arithmetic mod t. AES-256-CTR streams
(crypto.secure_sum.prg_uint64, one stream per label) expand the keys:
    r_p ∈ Z_t^L = row p of K_A's mask stream,  s_q = row q of K_B's,  z_e ∈ Z_t from a run key K_z.

    once per site and job    A → S:  x̃_p = x_p + r_p for every point p    (n·L·k bits)
                             B → S:  ỹ_q = y_q + s_q for every point q
    per run (pair, round)    A → B:  K_A, K_z (fresh)            sealed in the channel (crypto.channel)
                             B → A:  K_B                         sealed
                             B → S:  v_e = |y_q| + 2⟨r_p, y_q⟩ − z_e        per candidate (k bits)
                             A → S:  u_e = |x_p| + 2⟨x̃_p, s_q⟩ + z_e        per candidate (k bits)
    S:                       h_e = u_e + v_e − 2⟨x̃_p, ỹ_q⟩ mod t            (refused if h_e > L)

Correctness: ⟨x̃,ỹ⟩ = ⟨x,y⟩ + ⟨x,s⟩ + ⟨r,y⟩ + ⟨r,s⟩ and ⟨x̃,s⟩ = ⟨x,s⟩ + ⟨r,s⟩, so
u + v = |x| + |y| + 2⟨x̃,ỹ⟩ − 2⟨x,y⟩, and h = |x| + |y| − 2⟨x,y⟩ exactly (mod t, and h < t).

What each party sees, and why it learns no more (AES-256-CTR taken as a PRF):
- S: every x̃_p and ỹ_q ONCE (each coordinate one-time padded by a value uniform in Z_t that S does not
  know; one masking per point and job, so no two maskings of a point to difference); per candidate u_e,
  uniform and independent of all else (z_e, fresh per run), and v_e, then determined by h_e. A simulator
  given the h_e alone draws x̃, ỹ, u uniform and sets v = h + 2⟨x̃,ỹ⟩ − u: the same distribution. So S
  learns the candidate distances (the protocol's output, as with the lattice protocol) and nothing more.
  (Without z, S would learn |x_p| + 2⟨x̃_p, s_q⟩ for many p per q — linear equations in the unknown s_q,
  and from s_q the code y_q: z is not optional; tests/crypto/test_masked_hamming.py plants its absence.)
- A: K_B and its view; B: K_A and its view. Keys only: a site never sees a masked code of its peer's, so
  it learns nothing of the peer's codes.
- Each site's VIEW of a pair's run (`PairView`): the candidate entries by both sites' local indices (the
  masks are per point and job, so each side must name the peer's points): which of its points are
  candidates of which of the peer's, linkable across rounds — candidate structure, no code. (The
  lattice's private packed view shows B less: its own rows per group.)
- S with one site colluding: the site knows every peer's K_j, so S unmasks every code of every peer
  (x̃ − r). Sites colluding without S learn nothing (they never see a masked code). This is why a site must
  opt in (SitePolicy.allow_trusted_coordinator, `xclp agent run --allow-trusted-coordinator`) and why
  the lattice protocol stays the default.

Messages (little-endian; a list of N values mod t is `pack_values`: k bit planes of ⌈N/8⌉ bytes):

    S←site  CODES  type=4 L k n ‖ x̃[n·L]                       (round 0 of a blocked job: topic "codes")
    A→B     HELLO  type=1 L k m_a m_b |E| shape[32] K_A[32] K_z[32]
    B→A     KEY    type=5 K_B[32]
    B→S     SHARE  type=3 L k m_a m_b |E| view_b[32] v[|E|] (‖ CODES of B, `with_codes`)
    A→S     SHARE  type=2 L k m_a m_b |E| view_a[32] u[|E|] (‖ CODES of A, `with_codes`)

`with_codes` (run_pair, run_blocks and the tests: no round 0) appends the site's CODES to its share.

Cost: n·L·k/8 bytes per site and job (1.4 kB a point at L = 1024), k/8 bytes per candidate from each site,
64 + 32 bytes of keys per run; per candidate one length-L inner product at each of A (⟨x̃, s⟩), B
(⟨r, y⟩) and S (⟨x̃, ỹ⟩), all three by crypto.sampled_dots (torch.sparse.sampled_addmm over the run's
CSR view, each side's rows of the pair gathered once and converted once per run): float64 for A's and
S's (every partial sum an integer below t²·L = 2^32 at L = 1024, exact below 2^53), float32 for B's (y
bits: below (t − 1)·L < 2^24). Per run each side also expands the masks of the run's candidate points
(AES-CTR: 2·L bytes a point, from the run's first point of that site to its last: `row_masks`, the same
values as the whole stream's rows; until 2026-11-28 the whole stream up to the site's last point, then
its rows picked: twice the time). `pair_views` checks and hashes a run's view once and gives B its twin
(`PairView.twin`: the same arrays, B's digest); the hash reads the int64 arrays in place.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, check_bits
from crypto.sampled_dots import sampled_dots
from crypto.secure_sum import prg_uint64
from crypto.state import Nested, State, pack

HELLO, SHARE_A, SHARE_B, CODES, KEY = 1, 2, 3, 4, 5
_HEAD = struct.Struct("<BHBIIQ")  # type, L, k, m_a, m_b, |E|
_CODES = struct.Struct("<BHBI")  # type, L, k, n
DIGEST = 32
KEY_BYTES = 32
STREAM_MASK, STREAM_Z = 1, 3
MAX_CANDIDATES = 1 << 32
MAX_POINTS = 1 << 24
MAX_BITS = 4095  # (t − 1)·L < 2^24 (B's float32 products exact) with t = 4096


def log_t(n_bits: int) -> int:
    """k: t = 2^k > L (a distance is its own residue)."""
    return int(n_bits).bit_length()


def masks(key: bytes, stream: int, count: int, k: int) -> np.ndarray:
    """`count` values uniform in Z_(2^k) from K's AES-256-CTR stream `stream` (the low k bits of each
    16-bit half-word of the keystream: exactly uniform, as 2^k divides 2^16)."""
    words = prg_uint64(key, -(-int(count) // 4), stream=stream)
    return (words.view("<u2")[: int(count)] & np.uint16((1 << k) - 1)).astype(np.uint16)


def point_masks(key: bytes, n: int, n_bits: int) -> np.ndarray:
    """A site's masks r_p (rows p = 0 … n − 1, L values each) under its key."""
    return masks(key, STREAM_MASK, int(n) * int(n_bits), log_t(n_bits)).reshape(int(n), int(n_bits))


def row_masks(key: bytes, rows: np.ndarray, n_bits: int) -> np.ndarray:
    """`point_masks(key, n, n_bits)[rows]`, the same values, with the stream expanded from the first of
    `rows` to the last only (rows increasing): row p is the uint16 values p·L … (p + 1)·L − 1 of the
    stream, i.e. keystream bytes 2pL … 2(p + 1)L − 1, and AES-256-CTR's block b is AES_K(stream ‖ b)
    (crypto.secure_sum.prg_uint64's counter: the stream in the high half), so the keystream from block
    b on is the same CTR started at (stream ‖ b). A run needs its candidate points' masks: the whole
    stream up to the last point was expanded, masked and copied again for every peer and round."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    rows = np.asarray(rows, dtype=np.int64)
    L = int(n_bits)
    if len(key) != KEY_BYTES:
        raise ProtocolError("masked: a mask key is 32 bytes")
    if rows.ndim != 1 or (rows.size and (rows[0] < 0 or rows[-1] >= MAX_POINTS or np.any(np.diff(rows) < 1))):
        raise ProtocolError("masked: mask rows must be increasing point indices in [0, 2^24)")
    if not rows.size:
        return np.zeros((0, L), dtype=np.uint16)
    start = 2 * L * int(rows[0])  # the first row's first keystream byte
    block = start // 16
    offset = start - 16 * block  # within that block (0 when 8 divides L)
    total = offset + 2 * L * (int(rows[-1]) - int(rows[0]) + 1)
    buf = np.empty(total + 15, dtype=np.uint8)  # (update_into's slack); every used byte is written
    out = memoryview(buf)
    enc = Cipher(algorithms.AES(bytes(key)), modes.CTR(struct.pack(">QQ", STREAM_MASK, block))).encryptor()
    zeros = memoryview(bytes(_CHUNK))
    for pos in range(0, total, _CHUNK):
        size = min(_CHUNK, total - pos)
        if enc.update_into(zeros[:size], out[pos : pos + size + 15]) != size:
            raise ProtocolError("masked: AES-CTR keystream came out short")
    enc.finalize()
    out.release()
    values = buf[offset : offset + 2 * L * (int(rows[-1]) - int(rows[0]) + 1)].view("<u2").reshape(-1, L)
    picked = values[rows - rows[0]]  # (a copy: the caller's to keep)
    picked &= np.uint16((1 << log_t(L)) - 1)
    return picked


_CHUNK = 1 << 16


def pack_values(v: np.ndarray, k: int) -> bytes:
    """Values < 2^k (any shape, flattened): k bit planes, least significant first, each the N values'
    bit packed by numpy.packbits (big-endian bit order, zero padded to a whole byte): k·⌈N/8⌉ bytes."""
    v = np.ascontiguousarray(v, dtype=np.uint16).reshape(-1)
    return b"".join(np.packbits(((v >> b) & 1).astype(np.uint8)).tobytes() for b in range(k))


def packed_size(count: int, k: int) -> int:
    return k * -(-int(count) // 8)


def unpack_values(data, count: int, k: int) -> np.ndarray:
    """`pack_values`'s bytes back to `count` values (uint16), the length checked."""
    plane = -(-int(count) // 8)
    if len(data) != k * plane:
        raise ProtocolError(f"masked: {len(data)} bytes for {count} values of {k} bits, expected {k * plane}")
    raw = np.frombuffer(data, dtype=np.uint8)
    out = np.zeros(int(count), dtype=np.uint16)
    for b in range(k):
        out |= np.unpackbits(raw[b * plane : (b + 1) * plane], count=int(count)).astype(np.uint16) << b
    return out


def _mod(x: np.ndarray, k: int) -> np.ndarray:
    return (np.asarray(x, dtype=np.int64) & ((1 << k) - 1)).astype(np.uint16)


def codes_message(bits: np.ndarray, n_bits: int, key: bytes) -> bytes:
    """CODES: a site's masked codes x̃ = x + r for all its points, under its mask key."""
    bits = check_bits(bits, n_bits, "the site's bits")
    k = log_t(n_bits)
    x = np.unpackbits(bits, axis=1, count=int(n_bits)).astype(np.uint16)
    x += point_masks(key, bits.shape[0], n_bits)
    x &= np.uint16((1 << k) - 1)
    return _CODES.pack(CODES, int(n_bits), k, bits.shape[0]) + pack_values(x, k)


def read_codes(data, n: int, n_bits: int, what: str = "codes") -> np.ndarray:
    """CODES back to the n × L masked codes (uint16), checked."""
    mv = memoryview(data)
    if len(mv) < _CODES.size or _CODES.unpack_from(mv) != (CODES, int(n_bits), log_t(n_bits), int(n)):
        raise ProtocolError(f"masked: {what} are not the masked codes of {n} points at L = {n_bits}")
    return unpack_values(mv[_CODES.size :], int(n) * int(n_bits), log_t(n_bits)).reshape(int(n), int(n_bits))


def codes_size(n: int, n_bits: int) -> int:
    return _CODES.size + packed_size(int(n) * int(n_bits), log_t(n_bits))


class PairView:
    """What one site of a pair needs of a run: the candidate entries as CSR over A's candidate points —
    entry e pairs A's point rows_a[a] (ptr[a] ≤ e < ptr[a+1]) with B's point rows_b[cols[e]] (cols
    increasing within a row) — by both sites' local indices (the masks are per point). The two sites'
    views differ only in `side`; `shape_digest` (everything but the side) rides in A's HELLO, `digest` in
    each share (the coordinator refuses a share of another view)."""

    def __init__(self, side: str, n_a: int, n_b: int, rows_a, rows_b, ptr, cols):
        if side not in ("a", "b"):
            raise ProtocolError("masked: a view is A's or B's")
        self.side, self.n_a, self.n_b = side, int(n_a), int(n_b)
        if not (1 <= self.n_a <= MAX_POINTS and 1 <= self.n_b <= MAX_POINTS):
            raise ProtocolError("masked: a view's sites need 1 … 2^24 points")
        arrays = [np.asarray(x) for x in (rows_a, rows_b, ptr, cols)]
        for name, x in zip(("rows_a", "rows_b", "ptr", "cols"), arrays):
            if x.ndim != 1 or x.dtype.kind not in "iu":
                raise ProtocolError(f"masked: a view's {name} must be a 1-D integer array")
        rows_a, rows_b, ptr, cols = (x.astype(np.int64) for x in arrays)
        for name, rows, n in (("A", rows_a, self.n_a), ("B", rows_b, self.n_b)):
            if rows.size < 1 or rows.min() < 0 or rows.max() >= n or np.any(np.diff(rows) < 1):
                raise ProtocolError(f"masked: a view's points of {name} must be increasing indices in [0, {n})")
        self.m_a, self.m_b = int(rows_a.size), int(rows_b.size)
        if ptr.size != self.m_a + 1 or ptr[0] != 0 or ptr[-1] != cols.size or np.any(np.diff(ptr) < 1) \
                or cols.size > MAX_CANDIDATES:
            raise ProtocolError("masked: a view's candidate pointers are malformed (every point of A needs one)")
        if cols.min() < 0 or cols.max() >= self.m_b:
            raise ProtocolError(f"masked: a view's ordinals of B's points must be in [0, {self.m_b})")
        inner = np.diff(cols) > 0
        inner[ptr[1:-1] - 1] = True  # across rows: any order
        if not inner.all():
            raise ProtocolError("masked: a view's points of B must increase within each point of A")
        if np.bincount(cols, minlength=self.m_b).min() < 1:
            raise ProtocolError("masked: every point of B in a view needs a candidate")
        # (the ordinals in 32 bits: a round's views of 28.7 M candidates are held by both sites and the coordinator)
        self.rows_a, self.rows_b, self.ptr, self.cols = rows_a, rows_b, ptr, cols.astype(np.int32)
        self.candidates = int(cols.size)
        h = hashlib.sha256(b"xclp/masked/shape/v2" + struct.pack("<QQ", self.n_a, self.n_b))
        for x in (rows_a, rows_b, ptr, cols):  # (int64 already: hashed in place, no copy where native is "<i8")
            h.update(struct.pack("<Q", x.size))
            h.update(memoryview(np.ascontiguousarray(x, dtype="<i8")).cast("B"))
        self.shape_digest = h.digest()
        self.digest = hashlib.sha256(self.shape_digest + b"view " + side.encode()).digest()

    def twin(self) -> PairView:
        """The other site's view of the same run: the same arrays (shared: a view is never changed),
        checked and hashed once (`pair_views` makes both)."""
        out = object.__new__(PairView)
        out.__dict__.update(self.__dict__)
        out.side = "b" if self.side == "a" else "a"
        out.digest = hashlib.sha256(self.shape_digest + b"view " + out.side.encode()).digest()
        return out

    def a_ordinal(self) -> np.ndarray:
        """Each entry's ordinal among A's candidate points."""
        return np.repeat(np.arange(self.m_a), np.diff(self.ptr))

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """The entries (A's point, B's point), in entry order."""
        return self.rows_a[self.a_ordinal()], self.rows_b[self.cols]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"meta": np.array([self.side == "b", self.n_a, self.n_b], dtype=np.int64), "rows_a": self.rows_a,
                "rows_b": self.rows_b, "ptr": self.ptr, "cols": self.cols.astype(np.int64)}

    @classmethod
    def from_arrays(cls, get) -> PairView:
        meta = get("meta")
        if meta is None or meta.shape != (3,) or meta.dtype.kind not in "iu" or meta[0] not in (0, 1):
            raise ProtocolError("masked: a malformed view")
        parts = [get(k) for k in ("rows_a", "rows_b", "ptr", "cols")]
        if any(p is None for p in parts):
            raise ProtocolError("masked: a view without its points or candidates")
        return cls("b" if meta[0] else "a", int(meta[1]), int(meta[2]), *parts)

    def state(self) -> dict:
        return {f"view_{k}": v for k, v in self.arrays().items()}

    @classmethod
    def restore(cls, s: State) -> PairView:
        return cls.from_arrays(lambda k: s.array(f"view_{k}", np.int64) if f"view_{k}" in s else None)


def pair_views(i: np.ndarray, j: np.ndarray, n_a: int, n_b: int) -> tuple[PairView, PairView]:
    """The two views of a run over the candidate entries (i, j) (local indices; repeats are merged)."""
    i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
    if i.shape != j.shape or i.ndim != 1 or i.size == 0:
        raise ProtocolError("masked: a run needs a non-empty list of candidate entries")
    if i.min() < 0 or i.max() >= n_a or j.min() < 0 or j.max() >= n_b:
        raise ProtocolError(f"masked: candidate entries outside [0, {n_a}) × [0, {n_b})")
    key = np.sort(i * n_b + j)  # (sorted, then the repeats dropped: numpy 2's np.unique hashes, 60× slower here)
    key = key[np.r_[True, key[1:] != key[:-1]]]
    i, j = key // n_b, key % n_b
    rows_a, ia = np.unique(i, return_inverse=True)
    rows_b, jb = np.unique(j, return_inverse=True)
    ptr = np.r_[0, np.cumsum(np.bincount(ia, minlength=rows_a.size))]
    va = PairView("a", n_a, n_b, rows_a, rows_b, ptr, jb)
    return va, va.twin()


def blocks_entries(blocks: list, n_a: int, n_b: int) -> tuple[np.ndarray, np.ndarray]:
    """The entries of (rows_a, rows_b) blocks (with repeats)."""
    if not blocks:
        raise ProtocolError("masked: no blocks")
    parts_i, parts_j = [], []
    for ra, rb in blocks:
        ra, rb = np.asarray(ra, dtype=np.int64), np.asarray(rb, dtype=np.int64)
        if ra.ndim != 1 or rb.ndim != 1 or ra.size == 0 or rb.size == 0:
            raise ProtocolError("masked: a block needs non-empty lists of rows")
        parts_i.append(np.repeat(ra, rb.size))
        parts_j.append(np.tile(rb, ra.size))
    return np.concatenate(parts_i), np.concatenate(parts_j)


def _header(mtype: int, n_bits: int, view: PairView, digest: bytes) -> bytes:
    return _HEAD.pack(mtype, n_bits, log_t(n_bits), view.m_a, view.m_b, view.candidates) + digest


def _open(message, mtype: int, n_bits: int, view: PairView, digest: bytes, what: str) -> memoryview:
    mv = memoryview(message)
    if len(mv) < _HEAD.size + DIGEST:
        raise ProtocolError(f"masked: {what} is too short")
    got = _HEAD.unpack_from(mv)
    want = (mtype, n_bits, log_t(n_bits), view.m_a, view.m_b, view.candidates)
    if got != want:
        raise ProtocolError(f"masked: {what} is (type, L, k, m_a, m_b, |E|) = {got}, expected {want}")
    if bytes(mv[_HEAD.size : _HEAD.size + DIGEST]) != digest:
        raise ProtocolError(f"masked: {what} is for another list of candidates")
    return mv[_HEAD.size + DIGEST :]


def _key(body, what: str) -> bytes:
    if len(body) != KEY_BYTES:
        raise ProtocolError(f"masked: {what} is not a {KEY_BYTES}-byte key")
    return bytes(body)


class _Party:
    role = ""

    def __init__(self, proto: MaskedHamming, bits: np.ndarray, n_bits: int, view: PairView, with_codes: bool):
        self.proto, self.n_bits, self.view, self.with_codes = proto, int(n_bits), view, bool(with_codes)
        if not 1 <= self.n_bits <= MAX_BITS:
            raise ProtocolError(f"masked: L = {n_bits} is outside 1 … {MAX_BITS}")
        if view.side != self.role:
            raise ProtocolError(f"masked: party {self.role.upper()} needs {self.role.upper()}'s view")
        self.bits = check_bits(bits, n_bits, f"{self.role.upper()}'s bits")
        n = view.n_a if self.role == "a" else view.n_b
        if self.bits.shape[0] != n:
            raise ProtocolError(f"masked: {self.role.upper()} has {self.bits.shape[0]} points; its view says {n}")
        self.step, self.run_key = 0, None

    def _share(self, mtype: int, values: np.ndarray) -> bytes:
        k = log_t(self.n_bits)
        out = _header(mtype, self.n_bits, self.view, self.view.digest) + pack_values(values, k)
        if self.with_codes:
            out += codes_message(self.bits, self.n_bits, self.proto.site_key())
        return out

    def state(self) -> bytes:
        return pack({"role": "masked-" + self.role, "L": self.n_bits, "step": self.step, "codes": self.with_codes,
                     "run_key": self.run_key or b"", **self.view.state()})


class MaskedPartyA(_Party):
    role = "a"

    def receive(self, message: bytes | None) -> Outgoing:
        v, k, L = self.view, log_t(self.n_bits), self.n_bits
        if self.step == 0:
            if message is not None:
                raise ProtocolError("masked: A speaks first")
            self.run_key = self.run_key or os.urandom(KEY_BYTES)  # K_z: fresh per run
            self.step = 1
            return Outgoing(to_peer=_header(HELLO, L, v, v.shape_digest) + self.proto.site_key() + self.run_key)
        if self.step != 1 or message is None:
            raise ProtocolError("masked: A's run has finished")
        mv = memoryview(message)
        if len(mv) != 1 + KEY_BYTES or mv[0] != KEY:
            raise ProtocolError("masked: B's KEY message is malformed")
        key_b = _key(mv[1:], "B's key")
        x = np.unpackbits(self.bits[v.rows_a], axis=1, count=L).astype(np.uint16)
        xt = (x + row_masks(self.proto.site_key(), v.rows_a, L)) & np.uint16((1 << k) - 1)
        s = row_masks(key_b, v.rows_b, L)
        z = masks(self.run_key, STREAM_Z, v.candidates, k).astype(np.int64)
        dots = sampled_dots(xt, s, v.ptr, v.cols)  # (sums < t²·L = 2^32 at L = 1024: float64)
        weight = x.sum(axis=1, dtype=np.int64)[v.a_ordinal()]
        self.step, self.run_key = 2, None
        return Outgoing(to_server=self._share(SHARE_A, _mod(weight + 2 * dots + z, k)), done=True)


class MaskedPartyB(_Party):
    role = "b"

    def receive(self, message: bytes | None) -> Outgoing:
        v, k, L = self.view, log_t(self.n_bits), self.n_bits
        if self.step != 0 or message is None:
            raise ProtocolError("masked: B speaks once, after A's HELLO")
        body = _open(memoryview(message), HELLO, L, v, v.shape_digest, "A's HELLO")
        if len(body) != 2 * KEY_BYTES:
            raise ProtocolError("masked: A's HELLO carries keys of the wrong size")
        key_a, run_key = bytes(body[:KEY_BYTES]), bytes(body[KEY_BYTES:])
        y = np.unpackbits(self.bits[v.rows_b], axis=1, count=L)  # B's candidate points, by ordinal
        r = row_masks(key_a, v.rows_a, L)
        z = masks(run_key, STREAM_Z, v.candidates, k).astype(np.int64)
        dots = sampled_dots(r, y, v.ptr, v.cols)  # (sums ≤ (t − 1)·L < 2^24: float32)
        weight = y.sum(axis=1, dtype=np.int64)[v.cols]
        self.step = 1
        return Outgoing(to_peer=bytes([KEY]) + self.proto.site_key(),
                        to_server=self._share(SHARE_B, _mod(weight + 2 * dots - z, k)), done=True)


def open_share(share, mtype: int, view: PairView, n_bits: int, with_codes: bool, what: str
               ) -> tuple[np.ndarray, memoryview | None]:
    """A share's per-candidate values (u or v), and its CODES where it carries them."""
    body = _open(memoryview(share), mtype, int(n_bits), view, view.digest, what)
    need = packed_size(view.candidates, log_t(n_bits))
    n = view.n_a if mtype == SHARE_A else view.n_b
    want = need + (codes_size(n, n_bits) if with_codes else 0)
    if len(body) != want:
        raise ProtocolError(f"masked: {what} has {len(body)} bytes after its header, expected {want}")
    return unpack_values(body[:need], view.candidates, log_t(n_bits)), (body[need:] if with_codes else None)


def combine_views(share_a: bytes, share_b: bytes, va: PairView, vb: PairView, n_bits: int,
                  codes_a: np.ndarray | None = None, codes_b: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The coordinator's step: (A's point, B's point, h) per candidate entry, from the two shares, each
    checked against the view its site was given, and the two sites' masked codes (`read_codes` of their
    CODES; None: carried in the shares, `with_codes`). h refused above L (shares that do not combine)."""
    if va.side != "a" or vb.side != "b" or va.shape_digest != vb.shape_digest:
        raise ProtocolError("masked: the two views are not of one run")
    k, L = log_t(n_bits), int(n_bits)
    u, carried_a = open_share(share_a, SHARE_A, va, L, codes_a is None, "A's share")
    v, carried_b = open_share(share_b, SHARE_B, vb, L, codes_b is None, "B's share")
    xt = read_codes(carried_a, va.n_a, L, "A's codes") if codes_a is None else codes_a
    yt = read_codes(carried_b, vb.n_b, L, "B's codes") if codes_b is None else codes_b
    if xt.shape != (va.n_a, L) or yt.shape != (va.n_b, L):
        raise ProtocolError("masked: masked codes of another size than the view's sites")
    dots = sampled_dots(xt[va.rows_a], yt[va.rows_b], va.ptr, va.cols)
    h = _mod(u.astype(np.int64) + v - 2 * dots, k).astype(np.int32)
    if h.max(initial=0) > L:
        raise ProtocolError("masked: the shares do not combine into distances (a value exceeds L)")
    return (*va.pairs(), h)


class MaskedHamming:
    """The protocol object of ONE site (crypto.hamming_api.REGISTRY["masked"]): it holds the site's mask
    key K_j for the job (drawn once, saved with the session: `state` / `restore`). A whole-site run
    (`party_a`, `party_b`, `combine`) runs every entry; the blocked graph's rounds run their candidate
    entries from each site's PairView (`party_a_pairs` / `party_b_pairs`, `combine_views`), the codes
    uploaded once (`codes_message`); `party_a_blocks` / `party_b_blocks` / `combine_blocks` /
    `combine_pairs` run a list of blocks with the codes in the shares (run_blocks)."""

    name = "masked"

    def __init__(self):
        self._key: bytes | None = None

    def site_key(self) -> bytes:
        if self._key is None:
            self._key = os.urandom(KEY_BYTES)  # the one draw: every mask r_p of this site expands from it
        return self._key

    def state(self) -> bytes:
        return pack({"key": self._key or b""})

    def restore(self, data: bytes) -> MaskedHamming:
        key = State(data, "masked protocol").bytes("key")
        if key and len(key) != KEY_BYTES:
            raise ProtocolError("masked: a saved mask key is 32 bytes")
        self._key = key or None
        return self

    def codes_message(self, bits: np.ndarray, n_bits: int) -> bytes:
        return codes_message(bits, n_bits, self.site_key())

    @staticmethod
    def _all(n_a: int, n_b: int) -> tuple[PairView, PairView]:
        i, j = np.divmod(np.arange(int(n_a) * int(n_b), dtype=np.int64), int(n_b))
        return pair_views(i, j, n_a, n_b)

    # a whole-site run: each side is given only its own bits, so the two first tell each other their sizes
    def party_a(self, bits: np.ndarray, n_bits: int):
        return _WholeA(self, bits, n_bits)

    def party_b(self, bits: np.ndarray, n_bits: int):
        return _WholeB(self, bits, n_bits)

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray:
        i, j, h = combine_views(share_a, share_b, *self._all(n_a, n_b), n_bits)
        out = np.empty((n_a, n_b), dtype=np.int32)
        out[i, j] = h
        return out

    def party_a_pairs(self, bits, n_bits, view: PairView, with_codes: bool = False) -> MaskedPartyA:
        return MaskedPartyA(self, bits, n_bits, view, with_codes)

    def party_b_pairs(self, bits, n_bits, view: PairView, with_codes: bool = False) -> MaskedPartyB:
        return MaskedPartyB(self, bits, n_bits, view, with_codes)

    def party_a_blocks(self, bits: np.ndarray, n_bits: int, blocks: list, n_b: int) -> MaskedPartyA:
        va, _ = pair_views(*blocks_entries(blocks, bits.shape[0], n_b), bits.shape[0], n_b)
        return MaskedPartyA(self, bits, n_bits, va, True)

    def party_b_blocks(self, bits: np.ndarray, n_bits: int, blocks: list, n_a: int) -> MaskedPartyB:
        _, vb = pair_views(*blocks_entries(blocks, n_a, bits.shape[0]), n_a, bits.shape[0])
        return MaskedPartyB(self, bits, n_bits, vb, True)

    def combine_pairs(self, share_a: bytes, share_b: bytes, blocks: list, n_a: int, n_b: int, n_bits: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return combine_views(share_a, share_b, *pair_views(*blocks_entries(blocks, n_a, n_b), n_a, n_b), n_bits)

    def combine_blocks(self, share_a: bytes, share_b: bytes, blocks: list, n_a: int, n_b: int, n_bits: int
                       ) -> list[np.ndarray]:
        i, j, h = self.combine_pairs(share_a, share_b, blocks, n_a, n_b, n_bits)
        order = i * n_b + j  # sorted: the entries' order
        out = []
        for ra, rb in blocks:
            ra, rb = np.asarray(ra, dtype=np.int64), np.asarray(rb, dtype=np.int64)
            keys = (ra[:, None] * n_b + rb[None, :]).ravel()
            out.append(h[np.searchsorted(order, keys)].reshape(ra.size, rb.size))
        return out

    def restore_party(self, bits: np.ndarray, n_bits: int, data: bytes):
        s = State(data, "masked party")
        role = s.str("role")
        if role in ("whole-a", "whole-b"):
            return (_WholeA if role == "whole-a" else _WholeB).restore(self, bits, n_bits, s)
        if role not in ("masked-a", "masked-b"):
            raise ProtocolError(f"masked: a saved party of role {role!r}")
        if s.int("L", 1) != int(n_bits):
            raise ProtocolError("masked: a saved party of another L")
        view = PairView.restore(s)
        party = (MaskedPartyA if role == "masked-a" else MaskedPartyB)(self, bits, n_bits, view, s.bool("codes"))
        party.step = s.int("step", 0, 2)
        run_key = s.bytes("run_key")
        if run_key and len(run_key) != KEY_BYTES:
            raise ProtocolError("masked: a saved run key is 32 bytes")
        party.run_key = run_key or None
        if role == "masked-a" and party.step == 1 and party.run_key is None:
            raise ProtocolError("masked: a saved party A between its messages lacks its run key")
        return party


_SIZE = struct.Struct("<Q")


class _WholeA:
    """A whole-site run (every entry), A's side: sizes first, then the run over every entry."""

    def __init__(self, proto, bits, n_bits):
        self.proto, self.bits, self.n_bits = proto, check_bits(bits, n_bits, "A's bits"), int(n_bits)
        self.sent_size = False
        self.inner: MaskedPartyA | None = None

    def receive(self, message):
        if self.inner is not None:
            return self.inner.receive(message)
        if not self.sent_size:
            if message is not None:
                raise ProtocolError("masked: A speaks first")
            self.sent_size = True
            return Outgoing(to_peer=_SIZE.pack(self.bits.shape[0]))
        if message is None or len(message) != _SIZE.size:
            raise ProtocolError("masked: B's size message is malformed")
        (n_b,) = _SIZE.unpack(message)
        if not 1 <= n_b <= MAX_POINTS:
            raise ProtocolError("masked: B's size is out of range")
        self.inner = MaskedPartyA(self.proto, self.bits, self.n_bits, self.proto._all(self.bits.shape[0], n_b)[0], True)
        return self.inner.receive(None)

    def state(self) -> bytes:
        return pack({"role": "whole-a", "sent": self.sent_size,
                     **({"inner": Nested(self.inner.state())} if self.inner is not None else {})})

    @classmethod
    def restore(cls, proto, bits, n_bits, s: State):
        a = cls(proto, bits, n_bits)
        a.sent_size = s.bool("sent")
        if "inner" in s:
            a.inner = proto.restore_party(bits, n_bits, s.nested("inner"))
            if not isinstance(a.inner, MaskedPartyA):
                raise ProtocolError("masked: a saved whole-site party A holds another party")
        return a


class _WholeB:
    def __init__(self, proto, bits, n_bits):
        self.proto, self.bits, self.n_bits = proto, check_bits(bits, n_bits, "B's bits"), int(n_bits)
        self.inner: MaskedPartyB | None = None

    def receive(self, message):
        if self.inner is not None:
            return self.inner.receive(message)
        if message is None or len(message) != _SIZE.size:
            raise ProtocolError("masked: A's size message is malformed")
        (n_a,) = _SIZE.unpack(message)
        if not 1 <= n_a <= MAX_POINTS:
            raise ProtocolError("masked: A's size is out of range")
        self.inner = MaskedPartyB(self.proto, self.bits, self.n_bits, self.proto._all(n_a, self.bits.shape[0])[1], True)
        return Outgoing(to_peer=_SIZE.pack(self.bits.shape[0]))

    def state(self) -> bytes:
        return pack({"role": "whole-b", **({"inner": Nested(self.inner.state())} if self.inner is not None else {})})

    @classmethod
    def restore(cls, proto, bits, n_bits, s: State):
        b = cls(proto, bits, n_bits)
        if "inner" in s:
            b.inner = proto.restore_party(bits, n_bits, s.nested("inner"))
            if not isinstance(b.inner, MaskedPartyB):
                raise ProtocolError("masked: a saved whole-site party B holds another party")
        return b
