"""Hamming distances at a pair's candidate entries only, from codes masked by a key the coordinator
does not hold: the "masked" protocol. Its work and bytes grow with the candidates, not with n_a × n_b
(issue 35) — and it trusts the coordinator not to collude with a site (Traits.trusts_coordinator).

Threat model (the one docs/security.md states for the secure sum and the blocked graph's tags): the
parties are semi-honest and the coordinator does not collude with a site. Under that model a third party
that holds no input makes inner products cheap: Beaver, "Commodity-based cryptography", STOC 1997; Du &
Atallah, "Protocols for secure remote database access with approximate matching", 2001 (a scalar
product with a commodity server). The construction here is a variant of that idea that needs no dealt
randomness at all: the two sites share a fresh key K the coordinator never sees, mask their codes under
it, and the COORDINATOR evaluates the masked inner products; the sites cancel the cross terms.

Notation. L bits per code, t = 2^k with k = bit length of L (t > L: a distance h ∈ [0, L] is its own
residue mod t; k = 11 at L = 1024). A's candidate points p (its "rows", m_a of them), B's rows q (m_b),
the pair's candidate entries E ⊂ rows_a × rows_b in a fixed order e = 0 … |E| − 1 (by A's row, then B's).
x_p, y_q ∈ {0,1}^L. All arithmetic mod t.

    A draws K (32 bytes, os.urandom) and sends it to B inside the sealed channel (crypto.channel:
    end-to-end encrypted, the coordinator relays ciphertext only). From K, AES-256-CTR streams
    (crypto.secure_sum.prg_uint64, one stream per label) give
        r_p ∈ Z_t^L per A row, s_q ∈ Z_t^L per B row, z_e ∈ Z_t per candidate entry.
    A → S:  x̃_p = x_p + r_p                                  (once per row: m_a·L·k bits)
            u_e = |x_p| + 2⟨x̃_p, s_q⟩ + z_e                  (per candidate: k bits)
    B → S:  ỹ_q = y_q + s_q                                  (once per row)
            v_e = |y_q| + 2⟨r_p, y_q⟩ − z_e                  (per candidate)
    S:      h_e = u_e + v_e − 2⟨x̃_p, ỹ_q⟩ mod t             (refused if h_e > L)

Correctness: ⟨x̃,ỹ⟩ = ⟨x,y⟩ + ⟨x,s⟩ + ⟨r,y⟩ + ⟨r,s⟩ and ⟨x̃,s⟩ = ⟨x,s⟩ + ⟨r,s⟩, so
u + v = |x| + |y| + 2⟨x̃,ỹ⟩ − 2⟨x,y⟩ and h = |x| + |y| − 2⟨x,y⟩ exactly (mod t, and h < t).

What each party sees, and why it learns no more (K pseudorandom: AES-256-CTR as a PRF):
- S (the coordinator): x̃_p and ỹ_q — each coordinate one-time padded by an independent uniform value
  of Z_t it does not know (a fresh K per run, so the maskings of one point in different runs and pairs
  are independent) —, u_e uniform and independent of everything else (z_e), and v_e, which is then
  determined by h_e. A simulator given only the h_e draws x̃, ỹ, u uniform and sets v = h + 2⟨x̃,ỹ⟩ − u:
  the same distribution. So S learns the candidate distances (the protocol's output, as with the
  lattice protocol) and nothing else. (Without z, S would learn |x_p| + 2⟨x̃_p, s_q⟩ for many p per q,
  linear equations in the unknown s_q, and from s_q the code y_q: z is not optional.)
- A: K (its own), its view (below). Nothing of B's codes: B sends A nothing.
- B: K, its view. Nothing of A's codes: A sends B only K.
- Each site's VIEW of the pair (`PairView`): its own candidate rows and the candidate entries as
  (its row ordinal, the peer's row ordinal): the bipartite graph between its points and PSEUDONYMOUS
  rows of the peer (ordinals among the peer's candidate rows of this run, no index of the peer's). This
  is more than the lattice's private packed view gives B (B there sees only its own rows per group).
- S with one site colluding: the site knows K, so S unmasks the peer's codes x̃ − r: every code of the
  peer that is a candidate of the pair. This is why a site must opt in (SitePolicy: allow_trusted_coordinator)
  and why the lattice protocol stays the default.

Messages (L, k, counts little-endian; a list of N values as k bit planes, `pack_values`):

    A→B  HELLO  type=1 L k m_a m_b |E| shape[32] K[32]           (sealed by the channel)
    A→S  SHARE  type=2 L k m_a m_b |E| view_a[32] x̃[m_a·L] u[|E|]
    B→S  SHARE  type=3 L k m_a m_b |E| view_b[32] ỹ[m_b·L] v[|E|]

Cost per run: each site m·L·k/8 + |E|·k/8 bytes to S (k = 11: 1.4 kB per candidate row, 1.4 bytes per
candidate); per candidate one length-L inner product at each of A (⟨x̃, s⟩), B (⟨r, y⟩) and S (⟨x̃, ỹ⟩),
as float64 (float32 where one operand is bits) products per row of A over the gathered rows of B: exact,
every partial sum is an integer below 2^33 (float64, 2^53 exact) or 2^21 (float32, 2^24 exact).
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, check_bits
from crypto.secure_sum import prg_uint64
from crypto.state import State, pack

HELLO, SHARE_A, SHARE_B = 1, 2, 3
_HEAD = struct.Struct("<BHBIIQ")  # type, L, k, m_a, m_b, |E|
DIGEST = 32
KEY_BYTES = 32
STREAM_R, STREAM_S, STREAM_Z = 1, 2, 3
MAX_CANDIDATES = 1 << 32
MAX_BITS = 4095  # (t − 1)·L < 2^24 (B's float32 products exact) with t = 4096


def log_t(n_bits: int) -> int:
    """k: t = 2^k > L (a distance is its own residue)."""
    return int(n_bits).bit_length()


def masks(key: bytes, stream: int, count: int, k: int) -> np.ndarray:
    """`count` values uniform in Z_(2^k) from K's AES-256-CTR stream `stream` (the low k bits of each
    16-bit half-word of the keystream: exactly uniform, as 2^k divides 2^16)."""
    words = prg_uint64(key, -(-int(count) // 4), stream=stream)
    return (words.view("<u2")[: int(count)] & np.uint16((1 << k) - 1)).astype(np.uint16)


def pack_values(v: np.ndarray, k: int) -> bytes:
    """Values < 2^k (any shape, flattened): k bit planes, least significant first, each the N values'
    bit packed by numpy.packbits (big-endian bit order, zero padded to a whole byte): k·⌈N/8⌉ bytes."""
    v = np.ascontiguousarray(v, dtype=np.uint16).reshape(-1)
    return b"".join(np.packbits(((v >> b) & 1).astype(np.uint8)).tobytes() for b in range(k))


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


def row_dots(left: np.ndarray, right: np.ndarray, ptr: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """⟨left[i], right[cols[e]]⟩ for e in ptr[i] … ptr[i+1] − 1, for every row i: one matrix-vector
    product per row of `left` (float32 or float64) over its rows of `right` (kept compact, uint8/uint16,
    gathered and converted to left's type row by row). Exact where the caller chose the type so that
    every sum stays below the mantissa (2^24 float32, 2^53 float64)."""
    out = np.empty(cols.size, dtype=np.float64)
    for i in np.flatnonzero(np.diff(ptr)).tolist():
        a, b = int(ptr[i]), int(ptr[i + 1])
        out[a:b] = right[cols[a:b]].astype(left.dtype) @ left[i]
    return out


def _mod(x: np.ndarray, k: int) -> np.ndarray:
    return (np.rint(x).astype(np.int64) & ((1 << k) - 1)).astype(np.uint16)


class PairView:
    """What one site of a pair needs of a run: its own candidate rows (`rows`, sorted local indices) and
    the candidate entries as CSR over A's row ordinals: entry e pairs A's ordinal a (ptr[a] ≤ e < ptr[a+1])
    with B's ordinal cols[e] (increasing within a row). The ordinals of the peer's rows are pseudonyms: its
    position among the peer's candidate rows, never the peer's own index. `shape` (the counts, ptr, cols)
    is what both views share (its digest rides in A's HELLO); `digest` adds the side and the rows."""

    def __init__(self, side: str, n_a: int, n_b: int, rows, m_a: int, m_b: int, ptr, cols):
        if side not in ("a", "b"):
            raise ProtocolError("masked: a view is A's or B's")
        self.side, self.n_a, self.n_b = side, int(n_a), int(n_b)
        self.m_a, self.m_b = int(m_a), int(m_b)
        rows, ptr, cols = (np.asarray(x) for x in (rows, ptr, cols))
        for name, x in (("rows", rows), ("ptr", ptr), ("cols", cols)):
            if x.ndim != 1 or x.dtype.kind not in "iu":
                raise ProtocolError(f"masked: a view's {name} must be a 1-D integer array")
        rows, ptr, cols = rows.astype(np.int64), ptr.astype(np.int64), cols.astype(np.int64)
        n_own = self.n_a if side == "a" else self.n_b
        m_own = self.m_a if side == "a" else self.m_b
        if not (1 <= self.m_a <= self.n_a and 1 <= self.m_b <= self.n_b):
            raise ProtocolError("masked: a view needs candidate rows on both sides, within the sites' sizes")
        if rows.size != m_own or rows.min() < 0 or rows.max() >= n_own or np.any(np.diff(rows) < 1):
            raise ProtocolError(f"masked: a view's own rows must be {m_own} increasing rows in [0, {n_own})")
        if ptr.size != self.m_a + 1 or ptr[0] != 0 or ptr[-1] != cols.size or np.any(np.diff(ptr) < 1) \
                or cols.size > MAX_CANDIDATES:
            raise ProtocolError("masked: a view's candidate pointers are malformed (every row of A needs one)")
        if cols.size and (cols.min() < 0 or cols.max() >= self.m_b):
            raise ProtocolError(f"masked: a view's peer ordinals must be in [0, {self.m_b})")
        inner = np.diff(cols) > 0
        inner[ptr[1:-1] - 1] = True  # across rows: any order
        if not inner.all():
            raise ProtocolError("masked: a view's peer ordinals must increase within each row")
        if np.bincount(cols, minlength=self.m_b).min() < 1:
            raise ProtocolError("masked: every candidate row of B needs a candidate")
        self.rows, self.ptr, self.cols = rows, ptr, cols
        self.candidates = int(cols.size)
        h = hashlib.sha256(b"xclp/masked/shape/v1" + struct.pack("<QQQQ", self.n_a, self.n_b, self.m_a, self.m_b))
        h.update(ptr.astype("<i8").tobytes())
        h.update(cols.astype("<i8").tobytes())
        self.shape_digest = h.digest()
        h.update(b"view " + side.encode() + rows.astype("<i8").tobytes())
        self.digest = h.digest()

    def a_ordinal(self) -> np.ndarray:
        """Each entry's A ordinal."""
        return np.repeat(np.arange(self.m_a), np.diff(self.ptr))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"meta": np.array([self.side == "b", self.n_a, self.n_b, self.m_a, self.m_b], dtype=np.int64),
                "rows": self.rows, "ptr": self.ptr, "cols": self.cols}

    @classmethod
    def from_arrays(cls, get) -> PairView:
        meta = get("meta")
        if meta is None or meta.shape != (5,) or meta.dtype.kind not in "iu" or meta[0] not in (0, 1):
            raise ProtocolError("masked: a malformed view")
        parts = [get(k) for k in ("rows", "ptr", "cols")]
        if any(p is None for p in parts):
            raise ProtocolError("masked: a view without its rows or candidates")
        return cls("b" if meta[0] else "a", int(meta[1]), int(meta[2]), parts[0], int(meta[3]), int(meta[4]),
                   parts[1], parts[2])

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
    key = np.unique(i * n_b + j)
    i, j = key // n_b, key % n_b
    rows_a, ia = np.unique(i, return_inverse=True)
    rows_b, jb = np.unique(j, return_inverse=True)
    ptr = np.r_[0, np.cumsum(np.bincount(ia, minlength=rows_a.size))]
    return (PairView("a", n_a, n_b, rows_a, rows_a.size, rows_b.size, ptr, jb),
            PairView("b", n_a, n_b, rows_b, rows_a.size, rows_b.size, ptr, jb))


def blocks_entries(blocks: list, n_a: int, n_b: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct entries of (rows_a, rows_b) blocks."""
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


def pairs_of_views(va: PairView, vb: PairView) -> tuple[np.ndarray, np.ndarray]:
    """The run's entries (A's row, B's row), in entry order, from the two views (the coordinator's)."""
    if va.side != "a" or vb.side != "b" or va.shape_digest != vb.shape_digest:
        raise ProtocolError("masked: the two views are not of one run")
    return va.rows[va.a_ordinal()], vb.rows[vb.cols]


def _header(mtype: int, n_bits: int, view: PairView, digest: bytes) -> bytes:
    return _HEAD.pack(mtype, n_bits, log_t(n_bits), view.m_a, view.m_b, view.candidates) + digest


def _open(message, mtype: int, n_bits: int, view: PairView, digest: bytes, what: str) -> memoryview:
    mv = memoryview(bytes(message) if not isinstance(message, bytes) else message)
    if len(mv) < _HEAD.size + DIGEST:
        raise ProtocolError(f"masked: {what} is too short")
    got = _HEAD.unpack_from(mv)
    want = (mtype, n_bits, log_t(n_bits), view.m_a, view.m_b, view.candidates)
    if got != want:
        raise ProtocolError(f"masked: {what} is (type, L, k, m_a, m_b, |E|) = {got}, expected {want}")
    if bytes(mv[_HEAD.size : _HEAD.size + DIGEST]) != digest:
        raise ProtocolError(f"masked: {what} is for another list of candidates")
    return mv[_HEAD.size + DIGEST :]


class _Party:
    def __init__(self, proto: MaskedHamming, bits: np.ndarray, n_bits: int, view: PairView):
        self.proto, self.n_bits, self.view = proto, int(n_bits), view
        if not 1 <= self.n_bits <= MAX_BITS:
            raise ProtocolError(f"masked: L = {n_bits} is outside 1 … {MAX_BITS}")
        self.bits = check_bits(bits, n_bits, f"{view.side.upper()}'s bits")
        n = self.view.n_a if view.side == "a" else self.view.n_b
        if self.bits.shape[0] != n:
            raise ProtocolError(f"masked: {view.side.upper()} has {self.bits.shape[0]} points; its view says {n}")
        self.done = False

    def _own(self) -> np.ndarray:
        return np.unpackbits(self.bits[self.view.rows], axis=1, count=self.n_bits)

    def state(self) -> bytes:
        return pack({"role": "masked-" + self.view.side, "L": self.n_bits, "done": self.done, **self.view.state()})


class MaskedPartyA(_Party):
    def __init__(self, proto, bits, n_bits, view, key: bytes | None = None):
        if view.side != "a":
            raise ProtocolError("masked: party A needs A's view")
        super().__init__(proto, bits, n_bits, view)
        self._key = key  # tests only: a fixed K

    def receive(self, message: bytes | None) -> Outgoing:
        if self.done or message is not None:
            raise ProtocolError("masked: A speaks once, first, and takes no message")
        v, k, L = self.view, log_t(self.n_bits), self.n_bits
        key = self._key if self._key is not None else os.urandom(KEY_BYTES)
        x = self._own()
        r = masks(key, STREAM_R, v.m_a * L, k).reshape(v.m_a, L)
        xt = (x + r) & np.uint16((1 << k) - 1)
        del r
        s = masks(key, STREAM_S, v.m_b * L, k).reshape(v.m_b, L)
        z = masks(key, STREAM_Z, v.candidates, k).astype(np.int64)
        dots = row_dots(xt.astype(np.float64), s, v.ptr, v.cols)  # < 2^33: exact in float64
        del s
        weight = x.sum(axis=1, dtype=np.int64)[v.a_ordinal()]
        u = _mod(weight + 2 * dots + z, k)
        hello = _header(HELLO, L, v, v.shape_digest) + key
        share = _header(SHARE_A, L, v, v.digest) + pack_values(xt, k) + pack_values(u, k)
        self.done = True
        return Outgoing(to_peer=hello, to_server=share, done=True)


class MaskedPartyB(_Party):
    def __init__(self, proto, bits, n_bits, view):
        if view.side != "b":
            raise ProtocolError("masked: party B needs B's view")
        super().__init__(proto, bits, n_bits, view)

    def receive(self, message: bytes | None) -> Outgoing:
        if self.done or message is None:
            raise ProtocolError("masked: B speaks once, after A's HELLO")
        v, k, L = self.view, log_t(self.n_bits), self.n_bits
        body = _open(message, HELLO, L, v, v.shape_digest, "A's HELLO")
        if len(body) != KEY_BYTES:
            raise ProtocolError("masked: A's HELLO carries a key of the wrong size")
        key = bytes(body)
        y = self._own()
        s = masks(key, STREAM_S, v.m_b * L, k).reshape(v.m_b, L)
        yt = (y + s) & np.uint16((1 << k) - 1)
        del s
        r = masks(key, STREAM_R, v.m_a * L, k).reshape(v.m_a, L).astype(np.float32)
        z = masks(key, STREAM_Z, v.candidates, k).astype(np.int64)
        dots = row_dots(r, y, v.ptr, v.cols)  # ≤ (t − 1)·L < 2^24: exact in float32
        del r
        weight = y.sum(axis=1, dtype=np.int64)[v.cols]
        vals = _mod(weight + 2 * dots - z, k)
        share = _header(SHARE_B, L, v, v.digest) + pack_values(yt, k) + pack_values(vals, k)
        self.done = True
        return Outgoing(to_server=share, done=True)


def combine_views(share_a: bytes, share_b: bytes, va: PairView, vb: PairView, n_bits: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The coordinator's step: (A's row, B's row, h) per candidate entry, from the two shares, each checked
    against the view its site was given; h refused above L (shares that do not combine into distances)."""
    i, j = pairs_of_views(va, vb)
    k, L = log_t(n_bits), int(n_bits)
    ba = _open(share_a, SHARE_A, L, va, va.digest, "A's share")
    bb = _open(share_b, SHARE_B, L, vb, vb.digest, "B's share")
    cut_a, cut_b = k * -(-va.m_a * L // 8), k * -(-vb.m_b * L // 8)
    need = k * -(-va.candidates // 8)
    for who, body, cut in (("A", ba, cut_a), ("B", bb, cut_b)):
        if len(body) != cut + need:
            raise ProtocolError(f"masked: {who}'s share has {len(body)} bytes after its header, expected {cut + need}")
    xt = unpack_values(ba[:cut_a], va.m_a * L, k).reshape(va.m_a, L).astype(np.float64)
    yt = unpack_values(bb[:cut_b], vb.m_b * L, k).reshape(vb.m_b, L)
    u = unpack_values(ba[cut_a:], va.candidates, k).astype(np.int64)
    v = unpack_values(bb[cut_b:], va.candidates, k).astype(np.int64)
    h = _mod(u + v - 2 * row_dots(xt, yt, va.ptr, va.cols), k).astype(np.int32)
    if h.max(initial=0) > L:
        raise ProtocolError("masked: the shares do not combine into distances (a value exceeds L)")
    return i, j, h


class MaskedHamming:
    """The protocol object (crypto.hamming_api.REGISTRY["masked"]). A whole-site run (`party_a`,
    `party_b`, `combine`) is a run over every entry; the blocked graph's rounds run over their
    candidate entries (`party_a_pairs` / `party_b_pairs` from each site's PairView, `combine_views`;
    `party_a_blocks` / `party_b_blocks` / `combine_blocks` / `combine_pairs` from a list of blocks)."""

    name = "masked"

    def _all(self, n_a: int, n_b: int) -> tuple[PairView, PairView]:
        i, j = np.divmod(np.arange(n_a * n_b, dtype=np.int64), n_b)
        return pair_views(i, j, n_a, n_b)

    # a whole-site run: each side is given only its own bits, so the two first tell each other their sizes
    def party_a(self, bits: np.ndarray, n_bits: int):
        return _WholeA(self, bits, n_bits)

    def party_b(self, bits: np.ndarray, n_bits: int):
        return _WholeB(self, bits, n_bits)

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray:
        va, vb = self._all(n_a, n_b)
        i, j, h = combine_views(share_a, share_b, va, vb, n_bits)
        out = np.empty((n_a, n_b), dtype=np.int32)
        out[i, j] = h
        return out

    def party_a_pairs(self, bits, n_bits, view: PairView, key: bytes | None = None) -> MaskedPartyA:
        return MaskedPartyA(self, bits, n_bits, view, key)

    def party_b_pairs(self, bits, n_bits, view: PairView) -> MaskedPartyB:
        return MaskedPartyB(self, bits, n_bits, view)

    def party_a_blocks(self, bits: np.ndarray, n_bits: int, blocks: list, n_b: int) -> MaskedPartyA:
        va, _ = pair_views(*blocks_entries(blocks, bits.shape[0], n_b), bits.shape[0], n_b)
        return MaskedPartyA(self, bits, n_bits, va)

    def party_b_blocks(self, bits: np.ndarray, n_bits: int, blocks: list, n_a: int) -> MaskedPartyB:
        _, vb = pair_views(*blocks_entries(blocks, n_a, bits.shape[0]), n_a, bits.shape[0])
        return MaskedPartyB(self, bits, n_bits, vb)

    def combine_pairs(self, share_a: bytes, share_b: bytes, blocks: list, n_a: int, n_b: int, n_bits: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return combine_views(share_a, share_b, *pair_views(*blocks_entries(blocks, n_a, n_b), n_a, n_b), n_bits)

    def combine_blocks(self, share_a: bytes, share_b: bytes, blocks: list, n_a: int, n_b: int, n_bits: int
                       ) -> list[np.ndarray]:
        i, j, h = self.combine_pairs(share_a, share_b, blocks, n_a, n_b, n_bits)
        lookup = dict(zip((i * n_b + j).tolist(), h.tolist()))
        out = []
        for ra, rb in blocks:
            ra, rb = np.asarray(ra, dtype=np.int64), np.asarray(rb, dtype=np.int64)
            keys = (ra[:, None] * n_b + rb[None, :]).ravel()
            out.append(np.array([lookup[x] for x in keys.tolist()], dtype=np.int32).reshape(ra.size, rb.size))
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
        if view.side != role[-1]:
            raise ProtocolError("masked: a saved party's view is not its side's")
        party = (MaskedPartyA if role == "masked-a" else MaskedPartyB)(self, bits, n_bits, view)
        party.done = s.bool("done")
        return party


_SIZE = struct.Struct("<Q")


class _WholeA:
    """A whole-site run (every entry), A's side: its first message tells B its size, then the run."""

    def __init__(self, proto, bits, n_bits):
        self.proto, self.bits, self.n_bits = proto, check_bits(bits, n_bits, "A's bits"), int(n_bits)
        self.inner: MaskedPartyA | None = None

    def receive(self, message):
        if self.inner is not None or message is None:
            if self.inner is None:
                return Outgoing(to_peer=_SIZE.pack(self.bits.shape[0]))
            raise ProtocolError("masked: A's whole-site run has finished")
        if len(message) != _SIZE.size:
            raise ProtocolError("masked: B's size message is malformed")
        (n_b,) = _SIZE.unpack(message)
        va, _ = self.proto._all(self.bits.shape[0], int(n_b))
        self.inner = MaskedPartyA(self.proto, self.bits, self.n_bits, va)
        return self.inner.receive(None)

    def state(self) -> bytes:
        return pack({"role": "whole-a", "started": self.inner is not None})

    @classmethod
    def restore(cls, proto, bits, n_bits, s: State):
        if s.bool("started"):
            raise ProtocolError("masked: a finished whole-site party A has nothing to restore")
        return cls(proto, bits, n_bits)


class _WholeB:
    def __init__(self, proto, bits, n_bits):
        self.proto, self.bits, self.n_bits = proto, check_bits(bits, n_bits, "B's bits"), int(n_bits)
        self.n_a: int | None = None
        self.inner: MaskedPartyB | None = None

    def receive(self, message):
        if message is None:
            raise ProtocolError("masked: B speaks after A")
        if self.n_a is None:
            if len(message) != _SIZE.size:
                raise ProtocolError("masked: A's size message is malformed")
            (self.n_a,) = _SIZE.unpack(message)
            if not 1 <= self.n_a <= 1 << 24:
                raise ProtocolError("masked: A's size is out of range")
            return Outgoing(to_peer=_SIZE.pack(self.bits.shape[0]))
        _, vb = self.proto._all(int(self.n_a), self.bits.shape[0])
        self.inner = MaskedPartyB(self.proto, self.bits, self.n_bits, vb)
        return self.inner.receive(message)

    def state(self) -> bytes:
        return pack({"role": "whole-b", "n_a": -1 if self.n_a is None else int(self.n_a),
                     "done": self.inner is not None})

    @classmethod
    def restore(cls, proto, bits, n_bits, s: State):
        b = cls(proto, bits, n_bits)
        n_a = s.int("n_a", -1)
        b.n_a = None if n_a < 0 else n_a
        if s.bool("done"):
            raise ProtocolError("masked: a finished whole-site party B has nothing to restore")
        return b
