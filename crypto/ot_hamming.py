"""SecureHamming, oblivious-transfer variant: SHADE (Bringer–Chabanne–Patey 2013), batched.

(About 710 lines: both SHADE parties, their message formats, their saved state and the batched OT
extension that drives them are one protocol, read together.)

A (OT sender) holds x_1..x_{n_a}, B (OT receiver) holds y_1..y_{n_b}, all L-bit vectors; the
coordinator ends with H[a, b] = h(x_a, y_b) and nothing else. Arithmetic is in Z_q, q = L + 1.

Protocol (as in docs/spec "SecureHamming, oblivious-transfer variant"): for every pair (a, b) and
bit l, A draws r uniform in Z_q and offers (r + x_l, r + 1 − x_l); B picks with choice bit y_l and
gets t = r + (x_l ⊕ y_l); A sends R = Σ_l r to the server, B sends T = Σ_l t, the server computes
h = T − R mod q. Batched: ONE OT per (vector y_b, bit l) carries A's messages for all n_a of A's
vectors, so n_b·L OTs serve n_a·n_b pairs. The OTs are IKNP-extended (``crypto.ot_extension``)
from 128 Chou–Orlandi base OTs (``crypto.base_ot``).

Correlated-OT form (halves the bytes, same leakage). For OT i = (b, l) let H(q_i), H(q_i ⊕ Δ)
be A's two IKNP pads and H(t_i) = H(q_i ⊕ y_{b,l}Δ) B's, each expanded (tweak counter, see
ot_extension) and reduced to n_a values of Z_q: h0[i, a], h1[i, a] (A) and g[i, a] (B). A sets

    r          = h0 − x_{a,l}                     (so message 0 = r + x_l = h0 is "free")
    c[i, a]    = (r + 1 − x_{a,l}) − h1 = h0 + 1 − 2·x_{a,l} − h1      (mod q)

and sends only c (one value per (OT, vector of A)). B computes t = g + y_{b,l}·c: for y = 0,
t = h0 = r + x; for y = 1, t = h1 + c = r + 1 − x. The c that B cannot "open" is masked by the
pad it does not know (h0 for y = 1, h1 for y = 0), exactly as the second ciphertext of a plain
1-out-of-2 OT would be, so B's and the server's views are those of the textbook protocol.
A's share R[a, b] = Σ_l h0[(b, l), a] − |x_a|, B's share T[a, b] = Σ_l t.

Uniform values in Z_q. Each value is cut from k = 16·w pad bits W (w little-endian u16 words)
as floor(W·q / 2^k) (multiply-shift, computed exactly word by word in uint32 arithmetic: no
division, no rejection, so A and B cut the pads identically). Every residue then has ⌊2^k/q⌋ or
⌈2^k/q⌉ preimages, so one value is within statistical distance q / 2^(k+2) of uniform; w is
chosen per session so that the union bound over ALL N = n_a·n_b·L values of one pad set is
≤ 2^-40, i.e. k ≥ 38 + log2(N·q) (k ≥ 32 always). L = 256, 24 × 24: k = 64; L = 1024,
500 × 500: k = 80.

Messages (A = ``party_a``, B = ``party_b``; all integers big-endian in headers, value arrays
little-endian; every message starts with MAGIC ‖ version ‖ type):

    A→B  HELLO  sid[16] L:u32 n_a:u32
    B→A  BASE1  n_b:u32 chunk:u32 S[32]                (Chou–Orlandi sender point)
    A→B  BASE2  R_1..R_128[32 each]
    B→A  EXT    k:u32 count:u32 U[128 · ⌈count·L/8⌉]  (chunk k of B's vectors)
    A→B  CORR   k:u32 count:u32 c[count · L · n_a]     (packed, see below)
    ... EXT/CORR alternate, one pair per chunk; A's last CORR comes with its share (done),
    B answers the last CORR with its share only (done).
    share  sid[16] L:u32 n_a:u32 n_b:u32 values[n_a · n_b] (u8/u16), SHARE_A / SHARE_B

CORR values are packed tightly: with m = count·L·n_a values of β = max(8, bit length of L) bits
each, the body holds the m low bytes (value & 0xFF), then, for j = 0..β−9, one bit plane of bit
8 + j of every value (⌈m/8⌉ bytes, little bit order, padding bits zero). L = 256: 9 bits per
value (1.125 bytes) instead of a uint16; L ≤ 255: plain bytes. A receiver rejects nonzero padding
bits and values ≥ q.

Sparse high bits, for 256 < q ≤ 264 (L = 256..263, where a bit plane would be mostly zeros: c is
uniform in Z_q, so only a fraction (q − 256)/q of the values, 1/257 at L = 256, is ≥ 256): the m
low bytes, then count:u32 and the count positions (u32 little-endian, strictly increasing, < m)
of the values ≥ 256, each of which is 256 + its low byte. ≈ 1.016 bytes per value at L = 256. A
receiver rejects positions out of order or out of range, and values ≥ q.

So a pair takes 3 + 2·⌈n_b / chunk⌉ messages; ``chunk`` is chosen by B (``chunk_vectors``, or
automatically: the largest chunk whose CORR message stays under ``target_message_bytes``, but
at least ⌈n_b / max_chunks⌉ so that the pair fits in hamming_api.run_pair's 64 messages).
Memory: only one chunk's message plus fixed-size scratch blocks (``block_values`` values) are
alive at a time on either side.

Bytes: A→B ≈ n_a·n_b·L values (β/8 bytes each), B→A ≈ 16·n_b·L bytes, each share
n_a·n_b values (u8 if q ≤ 256 else u16).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, check_bits
from crypto.ot_extension import KAPPA, OTExtReceiver, OTExtSender, TCCRHash, u_bytes
from crypto.state import Nested, State, pack

MAGIC = b"XSHD"
VERSION = 2  # 2: CORR values packed to β bits (1: u8/u16)
T_HELLO, T_BASE1, T_BASE2, T_EXT, T_CORR, T_SHARE_A, T_SHARE_B = 1, 2, 3, 4, 5, 6, 7
_TYPE_NAMES = {1: "HELLO", 2: "BASE1", 3: "BASE2", 4: "EXT", 5: "CORR", 6: "SHARE_A", 7: "SHARE_B"}
_HDR = struct.Struct(">4sBB")
_HELLO = struct.Struct(">16sII")
_BASE1 = struct.Struct(">II32s")
_CHUNK = struct.Struct(">II")
_SHARE = struct.Struct(">16sIII")
SID_BYTES = 16
POINT_BYTES = 32
MAX_L = 65535  # values of Z_{L+1} fit a uint16
MAX_N = 1 << 24
SIGMA = 40

__all__ = ["OTHamming", "OTPartyA", "OTPartyB", "MAGIC", "VERSION"]


# ----------------------------------------------------------------------------- parameters


def _value_dtype(q: int) -> np.dtype:
    return np.dtype(np.uint8) if q <= 256 else np.dtype("<u2")


def _high_bits(q: int) -> int:
    """Bits per CORR value above the low byte: β − 8, β = max(8, bit length of q − 1)."""
    return max(0, (q - 1).bit_length() - 8)


def _sparse(q: int) -> bool:
    """Sparse high bits (positions of the values ≥ 256) instead of a bit plane: when 4 bytes per such
    value, (q − 256)/q of them, beat ⅛ byte per value."""
    return 256 < q and 32 * (q - 256) < q


_SPARSE_COUNT = struct.Struct(">I")


def _packed_bytes(n_values: int, q: int) -> int:
    """Bytes of n_values packed CORR values: the low bytes, then one bit plane per high bit; in the
    sparse form (whose size depends on the values) an upper estimate used for chunking and limits."""
    if _sparse(q):
        return n_values + _SPARSE_COUNT.size + n_values // 8
    return n_values + _high_bits(q) * (-(-n_values // 8))


_PACK_VALUES = 1 << 22  # values per packbits call (a multiple of 8): bounded scratch memory


def _pack_planes(high: np.ndarray, h: int, out: np.ndarray) -> None:
    """out[j] ← bit plane j of high (uint8 values < 2^h, flat), little bit order, in slices."""
    n = high.size
    for s in range(0, n, _PACK_VALUES):
        e = min(n, s + _PACK_VALUES)
        blk = high[s:e]
        for j in range(h):
            plane = blk if h == 1 else (blk >> np.uint8(j)) & np.uint8(1)
            out[j, s // 8 : -(-e // 8)] = np.packbits(plane, bitorder="little")


def _unpack_bits(plane: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bits start..stop−1 of a little-bit-order plane, as uint8 0/1."""
    b0 = start >> 3
    bits = np.unpackbits(plane[b0 : (stop + 7) >> 3], bitorder="little")
    return bits[start - 8 * b0 : stop - 8 * b0]


def _pad_words(q: int, n_values: int) -> int:
    """w such that k = 16·w pad bits per value give total bias ≤ 2^-SIGMA over n_values values."""
    need = SIGMA - 2 + math.log2(max(1, n_values)) + math.log2(q)
    return max(2, math.ceil(need / 16))


class _Params:
    def __init__(self, n_bits: int, n_a: int, n_b: int):
        self.L = n_bits
        self.q = n_bits + 1
        self.n_a = n_a
        self.n_b = n_b
        self.dtype = _value_dtype(self.q)
        self.high = _high_bits(self.q)
        self.sparse = _sparse(self.q)
        self.words = _pad_words(self.q, n_a * n_b * n_bits)
        self.nblocks = (2 * self.words * n_a + 15) // 16
        # sums of L values < 2q fit a uint32 iff 2·L·q < 2^32
        self.sum_dtype = np.uint32 if 2 * n_bits * self.q < (1 << 32) else np.uint64


def _reduce(pad: np.ndarray, p: _Params, out: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """Map each value's k = 16·w pad bits W (w little-endian u16 words, least significant first,
    word e of value a at pad[:, 2(e·n_a + a)]) to floor(W·q / 2^k) ∈ Z_q, in uint32 arithmetic:
    acc ← (acc + word·q) >> 16 over the words (exact: acc < q and word·q + acc < 2^32 for q ≤ 2^16).
    Every residue has ⌊2^k/q⌋ or ⌈2^k/q⌉ preimages: statistical distance ≤ q / 2^(k+2)."""
    n_a, q = p.n_a, np.uint32(p.q)
    s16 = np.uint32(16)
    np.multiply(pad[:, : 2 * n_a].view("<u2"), q, out=out)
    np.right_shift(out, s16, out=out)
    for e in range(1, p.words):
        np.multiply(pad[:, 2 * e * n_a : 2 * (e + 1) * n_a].view("<u2"), q, out=tmp)
        out += tmp
        np.right_shift(out, s16, out=out)
    return out


def _mod_small(v: np.ndarray, q: int, tmp: np.ndarray) -> None:
    """v ← v mod q in place (uint32)."""
    qq = np.uint32(q)
    np.floor_divide(v, qq, out=tmp)
    np.multiply(tmp, qq, out=tmp)
    np.subtract(v, tmp, out=v)


def _row_sums(vals: np.ndarray, s: int, L: int, acc: np.ndarray, dtype) -> None:
    """acc[b] += Σ_l vals[(b, l)] for the rows s..s+len(vals) of a chunk (rows are (b, l) pairs);
    the block is either whole vectors or part of one vector (see _Party._blocks)."""
    n = vals.shape[0]
    b = s // L
    if n >= L:  # whole vectors
        acc[b : b + n // L] += vals.reshape(n // L, L, -1).sum(axis=1, dtype=dtype)
    else:
        acc[b] += vals.sum(axis=0, dtype=dtype)


# ----------------------------------------------------------------------------- framing


def _header(mtype: int) -> bytes:
    return _HDR.pack(MAGIC, VERSION, mtype)


def _open(msg, expected: int, max_bytes: int) -> memoryview:
    """Check size guard, magic, version and type; return the body."""
    name = _TYPE_NAMES[expected]
    if msg is None:
        raise ProtocolError(f"SHADE: expected a {name} message, got nothing")
    if not isinstance(msg, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"SHADE: {name} message must be bytes, got {type(msg).__name__}")
    mv = memoryview(msg).cast("B")
    if len(mv) > max_bytes:
        raise ProtocolError(f"SHADE: {name} message of {len(mv)} bytes exceeds the limit of {max_bytes}")
    if len(mv) < _HDR.size:
        raise ProtocolError(f"SHADE: message of {len(mv)} bytes is too short for a header")
    magic, version, mtype = _HDR.unpack_from(mv)
    if magic != MAGIC:
        raise ProtocolError("SHADE: bad magic (not a SHADE message)")
    if version != VERSION:
        raise ProtocolError(f"SHADE: unsupported version {version} (this side speaks {VERSION})")
    if mtype != expected:
        got = _TYPE_NAMES.get(mtype, f"unknown type {mtype}")
        raise ProtocolError(f"SHADE: expected a {name} message, got {got}")
    return mv[_HDR.size :]


def _need(body: memoryview, n: int, name: str) -> None:
    if len(body) != n:
        raise ProtocolError(f"SHADE: {name} body has {len(body)} bytes, expected {n}")


def _check_values(arr: np.ndarray, q: int, name: str) -> None:
    if arr.size and int(arr.max()) >= q:
        raise ProtocolError(f"SHADE: {name} carries a value outside Z_{q}")


def _encode_share(mtype: int, sid: bytes, p: _Params, vals: np.ndarray) -> bytes:
    return _header(mtype) + _SHARE.pack(sid, p.L, p.n_a, p.n_b) + vals.astype(p.dtype).tobytes()


def _decode_share(msg, mtype: int, n_a: int, n_b: int, n_bits: int, max_bytes: int):
    name = _TYPE_NAMES[mtype]
    body = _open(msg, mtype, max_bytes)
    if len(body) < _SHARE.size:
        raise ProtocolError(f"SHADE: {name} is truncated")
    sid, L, na, nb = _SHARE.unpack_from(body)
    if L != n_bits:
        raise ProtocolError(f"SHADE: {name} is for L = {L}, expected {n_bits}")
    if (na, nb) != (n_a, n_b):
        raise ProtocolError(f"SHADE: {name} is for {na} × {nb} pairs, expected {n_a} × {n_b}")
    q = n_bits + 1
    dt = _value_dtype(q)
    _need(body, _SHARE.size + n_a * n_b * dt.itemsize, name)
    vals = np.frombuffer(body, dtype=dt, offset=_SHARE.size).reshape(n_a, n_b)
    _check_values(vals, q, name)
    return bytes(sid), vals


# ----------------------------------------------------------------------------- protocol


class OTHamming:
    """SHADE over IKNP OT extension; implements crypto.hamming_api.HammingProtocol (name "ot").

    chunk_vectors: B's vectors per EXT/CORR round (None: automatic, see module docstring).
    session_id: optional bytes both sides agree on (e.g. job ‖ pair ‖ attempt); B then rejects a
        HELLO for another session. None: A draws a random one.
    max_message_bytes: size guard applied to every incoming message and share.
    target_message_bytes: automatic chunking aims at CORR messages of about this size.
    max_messages: automatic chunking keeps a pair within this many peer messages.
    block_values: values per internal compute block (scratch memory ≈ 40 bytes per value).
    threads: worker threads for the pad computation (AES and numpy release the GIL).
    """

    name = "ot"

    def __init__(self, chunk_vectors: int | None = None, *, session_id: bytes | None = None,
                 max_message_bytes: int = 1 << 30, target_message_bytes: int = 64 << 20,
                 max_messages: int = 64, block_values: int = 1 << 17, threads: int | None = None):
        if chunk_vectors is not None and (not isinstance(chunk_vectors, int) or chunk_vectors < 1):
            raise ProtocolError(f"chunk_vectors must be a positive integer, got {chunk_vectors!r}")
        if max_messages < 5:
            raise ProtocolError("max_messages must be at least 5")
        self.chunk_vectors = chunk_vectors
        self.session_id = session_id
        self.max_message_bytes = int(max_message_bytes)
        self.target_message_bytes = int(target_message_bytes)
        self.max_messages = int(max_messages)
        self.block_values = max(1, int(block_values))
        self.threads = max(1, int(threads if threads is not None else min(2, os.cpu_count() or 1)))

    def _sid(self) -> bytes | None:
        if self.session_id is None:
            return None
        return hashlib.sha256(b"XCLP/ot-hamming/session/" + bytes(self.session_id)).digest()[:SID_BYTES]

    def party_a(self, bits: np.ndarray, n_bits: int) -> OTPartyA:
        return OTPartyA(self, check_bits(bits, n_bits, "A's bits"), int(n_bits))

    def party_b(self, bits: np.ndarray, n_bits: int) -> OTPartyB:
        return OTPartyB(self, check_bits(bits, n_bits, "B's bits"), int(n_bits))

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray:
        if not isinstance(n_bits, (int, np.integer)) or not 1 <= n_bits <= MAX_L:
            raise ProtocolError(f"SHADE: L must be in 1..{MAX_L}, got {n_bits!r}")
        n_bits, n_a, n_b = int(n_bits), int(n_a), int(n_b)
        sid_a, r = _decode_share(share_a, T_SHARE_A, n_a, n_b, n_bits, self.max_message_bytes)
        sid_b, t = _decode_share(share_b, T_SHARE_B, n_a, n_b, n_bits, self.max_message_bytes)
        if sid_a != sid_b:
            raise ProtocolError("SHADE: the two shares belong to different sessions")
        q = n_bits + 1
        return ((t.astype(np.int32) - r.astype(np.int32)) % q).astype(np.int32)

    def restore_party(self, bits: np.ndarray, n_bits: int, data: bytes) -> OTPartyA | OTPartyB:
        s = State(data, "SHADE party")
        party = (self.party_a if s.str("role") == "a" else self.party_b)(bits, n_bits)
        party._restore(s)
        return party

    def choose_chunk(self, n_bits: int, n_a: int, n_b: int) -> int:
        if self.chunk_vectors is not None:
            return min(self.chunk_vectors, n_b)
        per_vector = _packed_bytes(n_bits * n_a, n_bits + 1)
        chunk = max(1, self.target_message_bytes // max(1, per_vector))
        max_chunks = (self.max_messages - 3) // 2
        chunk = max(chunk, -(-n_b // max_chunks))
        return min(chunk, n_b)


def _check_n(n: int, who: str) -> None:
    if not 1 <= n <= MAX_N:
        raise ProtocolError(f"SHADE: {who} must have 1..{MAX_N} vectors, has {n}")


class _Party:
    def __init__(self, proto: OTHamming, bits: np.ndarray, n_bits: int):
        if n_bits > MAX_L:
            raise ProtocolError(f"SHADE: L = {n_bits} exceeds the maximum {MAX_L}")
        self.proto = proto
        self.L = n_bits
        self.q = n_bits + 1
        self.bits01 = np.unpackbits(bits, axis=1)[:, :n_bits]
        self.max_bytes = proto.max_message_bytes
        self.stage = "start"
        self.p: _Params | None = None

    _ARRAYS = ()  # the party's arrays in its saved state, beside the JSON fields

    def state(self) -> bytes:
        """The stage, the session, the chunking, the sums so far and the OT extension's state (keys
        and stream positions), as crypto.state fields: never the bits (the site has them)."""
        ext = getattr(self, "ext", None)
        fields = {"role": self.ROLE, "stage": self.stage, "sid": getattr(self, "sid", b""),
                  "n_peer": None if self.p is None else (self.p.n_b if self.ROLE == "a" else self.p.n_a),
                  **{k: getattr(self, k, None) for k in ("chunk", "n_chunks", "next_chunk", "pending_first",
                                                         "pending_count")}}
        fields.update({k: getattr(self, k) for k in self._ARRAYS if getattr(self, k, None) is not None})
        if ext is not None:
            fields["ext"] = Nested(ext.state())
        return pack(fields)

    def _restore(self, s: State) -> None:
        self.stage = s.str("stage")
        if self.stage not in ("start", "base", "base2", "ext", "corr", "done", "failed"):
            raise ProtocolError(f"SHADE: a saved party in stage {self.stage!r}")
        if s.bytes("sid"):
            self.sid = s.bytes("sid", SID_BYTES)
        peer = s.json("n_peer")
        if peer is not None:
            _check_n(peer, "the peer")
            self.p = _Params(self.L, self.n_a, peer) if self.ROLE == "a" else _Params(self.L, peer, self.n_b)
        for k in ("chunk", "n_chunks", "next_chunk", "pending_first", "pending_count"):
            v = s.json(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ProtocolError(f"SHADE: a saved party's {k} is not a count")
            setattr(self, k, v)
        for k in self._ARRAYS:
            setattr(self, k, s.optional_array(k))
        if "ext" in s:
            self.ext = (OTExtSender if self.ROLE == "a" else OTExtReceiver).restore(s.nested("ext"))
        if self.ROLE == "b" and getattr(self, "pending_count", None) is not None and self.stage == "corr":
            b0 = self.next_chunk * self.chunk  # the choices of the chunk in flight, from B's own bits
            self.pending_y = self.bits01[b0 : b0 + self.pending_count].reshape(-1)
        for k, dtype, shape in self._checked():
            a = getattr(self, k, None)
            if a is not None and (a.dtype != np.dtype(dtype) or a.shape != shape):
                raise ProtocolError(f"SHADE: a saved party's {k} is {a.dtype} {a.shape}, expected {dtype} {shape}")

    def _fail(self, exc: Exception):
        self.stage = "failed"
        raise exc

    def receive(self, message: bytes | None) -> Outgoing:
        if self.stage in ("done", "failed"):
            raise ProtocolError(f"SHADE: party is {self.stage}; no more messages accepted")
        try:
            return self._step(message)
        except ProtocolError:
            self.stage = "failed"
            raise

    def _blocks(self, count: int) -> list[tuple[int, int]]:
        """Row ranges for `count` vectors of L rows: whole vectors per block when L·n_a values fit
        in block_values, otherwise each vector split into equal parts (a block never straddles)."""
        L, bv = self.L, self.proto.block_values
        per_vec = L * self.p.n_a
        rows = count * L
        if per_vec <= bv:
            step = (bv // per_vec) * L
            return [(s, min(rows, s + step)) for s in range(0, rows, step)]
        parts = -(-per_vec // bv)
        step = -(-L // parts)
        return [(b * L + s, b * L + min(L, s + step)) for b in range(count) for s in range(0, L, step)]

    def _map(self, make_state, fn, ranges) -> list:
        """Run fn(state, s, e) over the row ranges on up to `threads` workers, each with its own
        state from make_state() (scratch buffers, accumulator); return the states."""
        k = min(self.proto.threads, len(ranges))
        if k <= 1:
            st = make_state()
            for s, e in ranges:
                fn(st, s, e)
            return [st]
        per = -(-len(ranges) // k)
        groups = [ranges[i : i + per] for i in range(0, len(ranges), per)]

        def worker(group):
            st = make_state()
            for s, e in group:
                fn(st, s, e)
            return st

        with ThreadPoolExecutor(len(groups)) as pool:
            return list(pool.map(worker, groups))


class OTPartyA(_Party):
    """SHADE party A: OT-extension sender, holds x."""

    ROLE, _ARRAYS = "a", ("R",)

    def _checked(self):
        return [("R", np.uint64, (self.p.n_b if self.p else 0, self.n_a))]

    def __init__(self, proto: OTHamming, bits: np.ndarray, n_bits: int):
        super().__init__(proto, bits, n_bits)
        self.n_a = bits.shape[0]
        _check_n(self.n_a, "A")
        sid = proto._sid()
        self.sid = sid if sid is not None else os.urandom(SID_BYTES)
        # dxq[l, a] = q + (1 − 2 x_{a,l} mod q): q + 1 where x = 0, 2q − 1 where x = 1
        self.dxq = np.where(self.bits01.T == 1, 2 * self.q - 1, self.q + 1).astype(np.uint32)
        self.weight = self.bits01.sum(axis=1, dtype=np.int64)
        self.ext = OTExtSender(self.sid)

    def _step(self, message):
        if self.stage == "start":
            if message is not None:
                raise ProtocolError("SHADE: party A speaks first; it got a message before HELLO")
            self.stage = "base"
            return Outgoing(to_peer=_header(T_HELLO) + _HELLO.pack(self.sid, self.L, self.n_a))
        if self.stage == "base":
            body = _open(message, T_BASE1, self.max_bytes)
            _need(body, _BASE1.size, "BASE1")
            n_b, chunk, point = _BASE1.unpack_from(body)
            _check_n(n_b, "B")
            if not 1 <= chunk <= n_b:
                raise ProtocolError(f"SHADE: chunk of {chunk} vectors is invalid for n_b = {n_b}")
            self.p = _Params(self.L, self.n_a, n_b)
            corr_bytes = _HDR.size + _CHUNK.size + _packed_bytes(chunk * self.L * self.n_a, self.q)
            if corr_bytes > self.max_bytes:
                raise ProtocolError(f"SHADE: chunk of {chunk} vectors needs {corr_bytes}-byte messages, "
                                    f"over the limit of {self.max_bytes}")
            self.chunk = chunk
            self.n_chunks = -(-n_b // chunk)
            self.next_chunk = 0
            self.R = np.zeros((n_b, self.n_a), dtype=np.uint64)  # Σ_l h0, per (b, a)
            reply = self.ext.respond_base(bytes(point))
            self.stage = "ext"
            return Outgoing(to_peer=_header(T_BASE2) + reply)
        if self.stage == "ext":
            body = _open(message, T_EXT, self.max_bytes)
            if len(body) < _CHUNK.size:
                raise ProtocolError("SHADE: EXT is truncated")
            k, count = _CHUNK.unpack_from(body)
            if k != self.next_chunk:
                raise ProtocolError(f"SHADE: EXT for chunk {k}, expected chunk {self.next_chunk}")
            want = min(self.chunk, self.p.n_b - k * self.chunk)
            if count != want:
                raise ProtocolError(f"SHADE: EXT chunk {k} has {count} vectors, expected {want}")
            m = count * self.L
            _need(body, _CHUNK.size + u_bytes(m), "EXT")
            q_rows, first = self.ext.extend(body[_CHUNK.size :], m)
            msg = self._corrections(q_rows, first, k, count)
            self.next_chunk += 1
            out = Outgoing(to_peer=msg)
            if self.next_chunk == self.n_chunks:
                r = (self.R + np.uint64(self.q) - self.weight.astype(np.uint64)[None, :]) % np.uint64(self.q)
                out.to_server = _encode_share(T_SHARE_A, self.sid, self.p, r.T)
                out.done = True
                self.stage = "done"
            return out
        raise ProtocolError(f"SHADE: party A in unexpected state {self.stage}")

    def _corrections(self, q_rows: np.ndarray, first: int, k: int, count: int) -> bytes:
        b0 = k * self.chunk
        p, L, q = self.p, self.L, self.q
        head = _header(T_CORR) + _CHUNK.pack(k, count)
        m = count * L * p.n_a
        msg = bytearray(len(head) + (m if p.sparse else _packed_bytes(m, q)))
        msg[: len(head)] = head
        # low bytes of c go straight into the message; the high bits (if any) into a scratch
        # array, bit-planed into the message at the end, or, sparse, as the positions of values ≥ 256
        corr = np.frombuffer(msg, dtype=np.uint8, offset=len(head), count=m).reshape(count * L, p.n_a)
        high = np.empty((count * L, p.n_a), np.uint8) if p.high and not p.sparse else None
        delta = self.ext.delta
        blocks = self._blocks(count)
        maxn = max(e - s for s, e in blocks)
        qq = np.uint32(q)

        def make_state():
            bufs = [np.empty((maxn, p.n_a), np.uint32) for _ in range(3)]
            return TCCRHash(), TCCRHash(), bufs, np.zeros((count, p.n_a), np.uint64), []

        def work(st, s, e):
            hs0, hs1, (h0, h1, tmp), acc, spots = st
            n = e - s
            h0, h1, tmp = h0[:n], h1[:n], tmp[:n]
            _reduce(hs0.hash(q_rows[s:e], first + s, p.nblocks), p, h0, tmp)
            _reduce(hs1.hash(q_rows[s:e] ^ delta, first + s, p.nblocks), p, h1, tmp)
            # c = h0 + (1 − 2x) − h1 mod q, computed as (h0 − h1 + dxq) mod q, dxq = q + (1 − 2x) mod q
            np.subtract(h0, h1, out=h1)
            if n >= L:
                h1.reshape(n // L, L, p.n_a)[...] += self.dxq
            else:
                h1 += self.dxq[s % L : s % L + n]
            np.floor_divide(h1, qq, out=tmp)
            tmp *= qq
            if not p.high:
                np.subtract(h1, tmp, out=corr[s:e], casting="unsafe")
            else:
                np.subtract(h1, tmp, out=h1)
                np.copyto(corr[s:e], h1, casting="unsafe")  # low byte
                if p.sparse:
                    spots.append(np.flatnonzero(h1 >= np.uint32(256)).astype("<u4") + np.uint32(s * p.n_a))
                else:
                    np.right_shift(h1, np.uint32(8), out=h1)
                    np.copyto(high[s:e], h1, casting="unsafe")
            _row_sums(h0, s, L, acc, p.sum_dtype)

        racc = self.R[b0 : b0 + count]
        states = self._map(make_state, work, blocks)
        for st in states:
            racc += st[3]
        if p.sparse:  # the states hold contiguous, ascending block ranges, in order
            spots = np.concatenate([a for st in states for a in st[4]] or [np.zeros(0, "<u4")])
            return b"".join((msg, _SPARSE_COUNT.pack(spots.size), spots.astype("<u4", copy=False).tobytes()))
        if high is not None:
            planes = np.frombuffer(msg, dtype=np.uint8, offset=len(head) + m).reshape(p.high, -1)
            _pack_planes(high.reshape(-1), p.high, planes)
        return bytes(msg)


class OTPartyB(_Party):
    """SHADE party B: OT-extension receiver, choice bits y."""

    ROLE, _ARRAYS = "b", ("T", "pending_rows")

    def _checked(self):
        rows = (self.pending_count or 0) * self.L
        return [("T", np.uint64, (self.n_b, self.p.n_a if self.p else 0)), ("pending_rows", np.uint8, (rows, 16))]

    def __init__(self, proto: OTHamming, bits: np.ndarray, n_bits: int):
        super().__init__(proto, bits, n_bits)
        self.n_b = bits.shape[0]
        _check_n(self.n_b, "B")
        self.expected_sid = proto._sid()

    def _step(self, message):
        if self.stage == "start":
            body = _open(message, T_HELLO, self.max_bytes)
            _need(body, _HELLO.size, "HELLO")
            sid, L, n_a = _HELLO.unpack_from(body)
            if L != self.L:
                raise ProtocolError(f"SHADE: A's vectors have L = {L} bits, B's have {self.L}")
            _check_n(n_a, "A")
            if self.expected_sid is not None and sid != self.expected_sid:
                raise ProtocolError("SHADE: HELLO is for another session")
            self.sid = bytes(sid)
            self.p = _Params(self.L, n_a, self.n_b)
            self.chunk = self.proto.choose_chunk(self.L, n_a, self.n_b)
            self.n_chunks = -(-self.n_b // self.chunk)
            self.ext = OTExtReceiver(self.sid)
            self.T = np.zeros((self.n_b, n_a), dtype=np.uint64)
            self.stage = "base2"
            return Outgoing(to_peer=_header(T_BASE1) + _BASE1.pack(self.n_b, self.chunk, self.ext.base_message()))
        if self.stage == "base2":
            body = _open(message, T_BASE2, self.max_bytes)
            _need(body, KAPPA * POINT_BYTES, "BASE2")
            self.ext.accept_base_reply(bytes(body))
            self.next_chunk = 0
            self.stage = "corr"
            return Outgoing(to_peer=self._ext_message())
        if self.stage == "corr":
            body = _open(message, T_CORR, self.max_bytes)
            if len(body) < _CHUNK.size:
                raise ProtocolError("SHADE: CORR is truncated")
            k, count = _CHUNK.unpack_from(body)
            if (k, count) != (self.next_chunk, self.pending_count):
                raise ProtocolError(f"SHADE: CORR for chunk {k} ({count} vectors), expected chunk "
                                    f"{self.next_chunk} ({self.pending_count} vectors)")
            p = self.p
            rows = count * self.L
            m = rows * p.n_a
            if p.sparse:
                if len(body) < _CHUNK.size + m + _SPARSE_COUNT.size:
                    raise ProtocolError("SHADE: CORR is truncated")
                (n_spots,) = _SPARSE_COUNT.unpack_from(body, _CHUNK.size + m)
                _need(body, _CHUNK.size + m + _SPARSE_COUNT.size + 4 * n_spots, "CORR")
            else:
                _need(body, _CHUNK.size + _packed_bytes(m, self.q), "CORR")
            corr = np.frombuffer(body, dtype=np.uint8, offset=_CHUNK.size, count=m).reshape(rows, p.n_a)
            planes = None
            if p.sparse:
                planes = np.frombuffer(body, dtype="<u4", offset=_CHUNK.size + m + _SPARSE_COUNT.size, count=n_spots)
                if n_spots and (int(planes[-1]) >= m or np.any(planes[1:] <= planes[:-1])):
                    raise ProtocolError("SHADE: CORR positions of high values are out of order or out of range")
                if n_spots and int(corr.reshape(-1)[planes].max()) >= self.q - 256:
                    raise ProtocolError(f"SHADE: CORR carries a value outside Z_{self.q}")
            elif p.high:
                planes = np.frombuffer(body, dtype=np.uint8, offset=_CHUNK.size + m).reshape(p.high, -1)
                if m % 8 and np.any(planes[:, -1] >> np.uint8(m % 8)):
                    raise ProtocolError("SHADE: CORR has nonzero padding bits")
            else:
                _check_values(corr, self.q, "CORR")
            self._absorb(corr, planes, k * self.chunk, count)
            self.next_chunk += 1
            if self.next_chunk < self.n_chunks:
                return Outgoing(to_peer=self._ext_message())
            t = self.T % np.uint64(self.q)
            self.stage = "done"
            return Outgoing(to_server=_encode_share(T_SHARE_B, self.sid, p, t.T), done=True)
        raise ProtocolError(f"SHADE: party B in unexpected state {self.stage}")

    def _ext_message(self) -> bytes:
        k = self.next_chunk
        b0 = k * self.chunk
        count = min(self.chunk, self.n_b - b0)
        self.pending_y = self.bits01[b0 : b0 + count].reshape(-1)
        u, t_rows, first = self.ext.extend(self.pending_y)
        self.pending_rows, self.pending_first, self.pending_count = t_rows, first, count
        return _header(T_EXT) + _CHUNK.pack(k, count) + u

    def _absorb(self, corr: np.ndarray, planes: np.ndarray | None, b0: int, count: int) -> None:
        """corr: the low bytes of the chunk's values; planes: their high bit planes, or (sparse) the
        positions of the values ≥ 256, or None."""
        p, L = self.p, self.L
        t_rows, first = self.pending_rows, self.pending_first
        y = self.pending_y.astype(np.uint32)[:, None]
        blocks = self._blocks(count)
        maxn = max(e - s for s, e in blocks)
        qq = np.uint32(self.q)

        def make_state():
            bufs = [np.empty((maxn, p.n_a), np.uint32) for _ in range(3 if p.high and not p.sparse else 2)]
            return TCCRHash(), bufs, np.zeros((count, p.n_a), np.uint64)

        def work(st, s, e):
            hs, bufs, acc = st
            n = e - s
            g, tmp = bufs[0][:n], bufs[1][:n]
            _reduce(hs.hash(t_rows[s:e], first + s, p.nblocks), p, g, tmp)
            # t = g + y·c (mod q later: T = Σ_l t mod q)
            if planes is None:
                np.multiply(corr[s:e], y[s:e], out=tmp)
            elif p.sparse:
                np.copyto(tmp, corr[s:e])
                lo, hi = np.searchsorted(planes, (s * p.n_a, e * p.n_a))
                if hi > lo:
                    tmp.reshape(-1)[planes[lo:hi] - np.uint32(s * p.n_a)] += np.uint32(256)
                tmp *= y[s:e]
            else:
                c, bit = tmp, bufs[2][:n]
                np.copyto(c, corr[s:e])
                for j in range(p.high):
                    np.copyto(bit, _unpack_bits(planes[j], s * p.n_a, e * p.n_a).reshape(n, p.n_a))
                    np.left_shift(bit, np.uint32(8 + j), out=bit)
                    c |= bit
                if n and int(c.max()) >= qq:
                    raise ProtocolError(f"SHADE: CORR carries a value outside Z_{self.q}")
                c *= y[s:e]
            g += tmp
            _row_sums(g, s, L, acc, p.sum_dtype)

        tacc = self.T[b0 : b0 + count]
        for st in self._map(make_state, work, blocks):
            tacc += st[2]
        self.pending_rows = self.pending_y = None
