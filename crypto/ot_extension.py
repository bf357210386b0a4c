"""IKNP OT extension (semi-honest), vectorised with numpy and `cryptography`'s AES. Sans-I/O.

Roles (Ishai–Kilian–Nissim–Petrank 2003):

* the extension RECEIVER (holds the choice bits r ∈ {0,1}^m) acts as the base-OT SENDER and
  ends the 128 Chou–Orlandi base OTs (``crypto.base_ot``) with seed pairs (k_j^0, k_j^1);
* the extension SENDER draws Δ = s ∈ {0,1}^128 and, as base-OT receiver with choices s_j,
  ends with k_j^{s_j}.

Extending a batch of m OTs (any number of batches, one after the other):

    receiver  T_j = G(k_j^0),  U_j = T_j ⊕ G(k_j^1) ⊕ r          (j = 1..128, m bits each)
              sends U (128 × ⌈m/8⌉ bytes)
    sender    Q_j = G(k_j^{s_j}) ⊕ s_j·U_j  =  T_j ⊕ s_j·r
    both      transpose: row i of Q is q_i = t_i ⊕ r_i·Δ  (128 bits per OT)

G is AES-128-CTR keyed with the first 16 bytes of the base-OT key (one long keystream per
seed, consumed batch after batch; ``update_into`` on preallocated buffers). The transpose is a
byte-level 8×8 bit-block transpose on uint64 words (three mask-and-shift steps), no Python loop.

The sender's two pads for OT i are H(q_i, i) and H(q_i ⊕ Δ, i); the receiver obtains
H(t_i, i) = the pad for its choice r_i, and the other pad is hidden under the correlation
robustness of H. H is the tweakable circular-correlation-robust hash of Guo, Katz, Wang, Yu
(S&P 2020) built from fixed-key AES, π = AES-128 under a fixed public key:

    TCCR(x, τ) = π(π(x) ⊕ τ) ⊕ π(x)

extended to long outputs by giving every 16-byte output block its own tweak τ = (b ‖ i): block
counter b in the low 64-bit word, OT index i (counted over the whole session) in the high word,
so every τ is used once per session, for the pair x ∈ {q_i, q_i ⊕ Δ}. We output
TCCR(x, τ) ⊕ τ (that is, π(y) ⊕ y with y = π(x) ⊕ τ, the Matyas–Meyer–Oseas form); XORing the
public tweak into the output is a public bijection, so the security is exactly that of TCCR, and
it saves a pass over the data:

    H_b(x, i) = π(y) ⊕ y,  y = π(x) ⊕ (b ‖ i);   pad = H_0 ‖ H_1 ‖ …

Everything is computed for whole arrays at once (AES-ECB ``update_into`` over all blocks).
Which pads are used, and how messages are derived from them (random OT, correlated OT), is the
caller's business: see ``crypto.ot_hamming``.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from crypto.base_ot import BaseOTReceiver, BaseOTSender
from crypto.errors import ProtocolError
from crypto.state import Nested, State, pack

KAPPA = 128  # computational security parameter = number of base OTs = row width in bits
ROW_BYTES = KAPPA // 8
#: the fixed, public AES key of π (nothing up the sleeve: a hash of a label)
FIXED_KEY = hashlib.sha256(b"XCLP/ot-extension/tccr-fixed-key/v1").digest()[:16]
MAX_BATCH = 1 << 26  # OTs per extend() call: U is then 1 GiB; callers use far less

_U64 = np.dtype("<u8")

__all__ = [
    "KAPPA",
    "ROW_BYTES",
    "FIXED_KEY",
    "OTExtSender",
    "OTExtReceiver",
    "TCCRHash",
    "tccr_hash",
    "transpose_bits",
    "u_bytes",
]


def u_bytes(m: int) -> int:
    """Length of the receiver's U message for a batch of m OTs."""
    return KAPPA * ((m + 7) // 8)


def _ecb_encryptor():
    return Cipher(algorithms.AES(FIXED_KEY), modes.ECB()).encryptor()


def transpose_bits(mat: np.ndarray, m: int) -> np.ndarray:
    """Transpose a 128 × ⌈m/8⌉-byte bit matrix (row j = bits of column j, big-endian bit order)
    into m rows of 16 bytes (row i = bit i of every input row, same bit order)."""
    mat = np.asarray(mat, dtype=np.uint8)
    mb = mat.shape[1]
    if mat.shape[0] != KAPPA:
        raise ValueError("transpose_bits needs 128 rows")
    # 8×8 blocks: bytes mat[8J + k, I], k = 0..7, as one big-endian uint64 (k = 0 most significant).
    x = mat.reshape(16, 8, mb).transpose(0, 2, 1).copy().view(">u8").reshape(16, mb).astype(np.uint64)
    s7, s14, s28 = np.uint64(7), np.uint64(14), np.uint64(28)
    t = (x ^ (x >> s7)) & np.uint64(0x00AA00AA00AA00AA)
    x ^= t ^ (t << s7)
    t = (x ^ (x >> s14)) & np.uint64(0x0000CCCC0000CCCC)
    x ^= t ^ (t << s14)
    t = (x ^ (x >> s28)) & np.uint64(0x00000000F0F0F0F0)
    x ^= t ^ (t << s28)
    # byte k of x[J, I] now holds bits (8J .. 8J+7) of row i = 8I + k.
    b = x.astype(">u8").view(np.uint8).reshape(16, mb, 8)
    return np.ascontiguousarray(b.transpose(1, 2, 0).reshape(mb * 8, ROW_BYTES)[:m])


class TCCRHash:
    """H_b(x, i) = π(y) ⊕ y with y = π(x) ⊕ (b ‖ i), for many rows x at once (see module docstring).

    ``hash(rows, first_index, nblocks)`` returns a (m, 16·nblocks) uint8 view (valid until the next
    call on the same object): row r is H_0 ‖ … ‖ H_{nblocks−1} of (rows[r], first_index + r).
    Scratch buffers are kept between calls (no page faults in the hot loop). One object per thread.
    """

    def __init__(self):
        self._enc = _ecb_encryptor()
        self._cap = 0
        self._inp = self._out = None
        self._jv: np.ndarray | None = None

    def _scratch(self, nwords: int):
        if nwords > self._cap:
            self._cap = nwords
            self._inp = np.empty(nwords, dtype=_U64)
            self._out = np.empty(nwords + 2, dtype=_U64)  # ECB update_into wants 15 spare bytes
        return self._inp, self._out

    def hash(self, rows: np.ndarray, first_index: int, nblocks: int) -> np.ndarray:
        rows = np.ascontiguousarray(rows, dtype=np.uint8)
        m = rows.shape[0]
        if rows.shape != (m, ROW_BYTES) or nblocks < 1:
            raise ValueError("rows must be (m, 16) uint8 and nblocks ≥ 1")
        if first_index < 0 or first_index + m > (1 << 64):
            raise ValueError("OT index out of range")
        n = 2 * m * nblocks
        # px = π(x) ⊕ (0 ‖ i): the OT index goes into the high word, once per row.
        px = np.empty(2 * m + 2, dtype=_U64)
        self._enc.update_into(rows.reshape(-1), px.view(np.uint8))
        px = px[: 2 * m].reshape(m, 2)
        px[:, 1] ^= np.arange(first_index, first_index + m, dtype=_U64)
        inp, out = self._scratch(n)
        # y = px broadcast over the blocks (a 16-byte-wide copy), ⊕ (b ‖ 0) in the low word.
        np.copyto(inp[:n].view("V16").reshape(m, nblocks), px.view("V16").reshape(m, 1))
        inp3 = inp[:n].reshape(m, nblocks, 2)
        if self._jv is None or self._jv.shape[0] < nblocks:
            self._jv = np.arange(max(nblocks, 64), dtype=_U64)
        inp3[:, :, 0] ^= self._jv[:nblocks]
        self._enc.update_into(inp[:n].view(np.uint8), out.view(np.uint8))
        res = out[:n]
        res ^= inp[:n]
        return res.reshape(m, 2 * nblocks).view(np.uint8)


def tccr_hash(rows: np.ndarray, first_index: int, nblocks: int) -> np.ndarray:
    """One-shot H (a fresh copy): (m, 16·nblocks) uint8."""
    return TCCRHash().hash(rows, first_index, nblocks).copy()


class _PRG:
    """AES-128-CTR keystream from a base-OT key, read in consecutive pieces, from byte `pos` on (a
    restored stream starts at its counter block and drops the bytes of it already read)."""

    def __init__(self, key: bytes, pos: int = 0):
        block, skip = divmod(int(pos), 16)
        self._enc = Cipher(algorithms.AES(key[:16]), modes.CTR(block.to_bytes(16, "big"))).encryptor()
        if skip:
            self._enc.update(bytes(skip))

    def read_into(self, zeros: memoryview, out: np.ndarray) -> None:
        self._enc.update_into(zeros, out)


class _Stream:
    """128 PRGs filled into one 128 × nbytes matrix per batch."""

    def __init__(self, keys: list[bytes], pos: int = 0):
        self.keys = [bytes(k) for k in keys]
        self.pos = int(pos)  # bytes read from each PRG so far: with the keys, the whole state
        self._prgs = [_PRG(k, self.pos) for k in keys]
        self._zeros = np.zeros(0, np.uint8)
        self._buf = np.zeros(0, np.uint8)

    def state(self) -> bytes:
        return pack({"keys": b"".join(self.keys), "width": len(self.keys[0]) if self.keys else 0, "pos": self.pos})

    @classmethod
    def restore(cls, data: bytes) -> _Stream:
        s = State(data, "OT extension stream")
        width, keys = s.int("width", 16, 64), s.bytes("keys")
        if len(keys) != KAPPA * width:
            raise ProtocolError("OT extension: a saved stream holds 128 keys")
        return cls([keys[i * width : (i + 1) * width] for i in range(KAPPA)], s.int("pos", 0))

    def matrix(self, nbytes: int) -> np.ndarray:
        if self._zeros.shape[0] < nbytes:
            self._zeros = np.zeros(nbytes, np.uint8)
            self._buf = np.empty(nbytes + 16, np.uint8)
        out = np.empty((len(self._prgs), nbytes), np.uint8)
        self.pos += nbytes
        z = self._zeros[:nbytes]
        for j, prg in enumerate(self._prgs):
            prg.read_into(z, self._buf)
            out[j] = self._buf[:nbytes]
        return out


def _check_batch(m: int) -> int:
    if not isinstance(m, (int, np.integer)) or not 1 <= int(m) <= MAX_BATCH:
        raise ProtocolError(f"OT extension: batch size must be 1..{MAX_BATCH}, got {m!r}")
    return int(m)


class OTExtReceiver:
    """Extension receiver (holds choice bits); base-OT sender.

    ``base_message()`` → bytes for the sender; ``accept_base_reply(reply)``; then any number of
    ``extend(choices)`` → (U bytes for the sender, t rows (m, 16), first OT index).
    """

    def __init__(self, session_id: bytes):
        self._base = BaseOTSender(session_id, KAPPA)
        self._g0: _Stream | None = None
        self._g1: _Stream | None = None
        self.next_index = 0

    def base_message(self) -> bytes:
        return self._base.first_message()

    @property
    def base_reply_bytes(self) -> int:
        return self._base.reply_bytes

    def accept_base_reply(self, reply: bytes) -> None:
        pairs = self._base.finish(reply)
        self._g0 = _Stream([k0 for k0, _ in pairs])
        self._g1 = _Stream([k1 for _, k1 in pairs])

    def state(self) -> bytes:
        """Before the base OTs end: the base-OT sender; after: the two streams (keys and position)
        and the next OT index (crypto.state)."""
        if self._g0 is None:
            return pack({"base": Nested(self._base.state()), "next": self.next_index})
        return pack({"g0": Nested(self._g0.state()), "g1": Nested(self._g1.state()), "next": self.next_index})

    @classmethod
    def restore(cls, data: bytes) -> OTExtReceiver:
        s = State(data, "OT extension receiver")
        r = cls.__new__(cls)  # not __init__: it would draw a new base-OT secret
        r._base, r._g0, r._g1 = None, None, None
        if "base" in s:
            r._base = BaseOTSender.restore(s.nested("base"))
        else:
            r._g0, r._g1 = _Stream.restore(s.nested("g0")), _Stream.restore(s.nested("g1"))
        r.next_index = s.int("next", 0)
        return r

    def extend(self, choices: np.ndarray) -> tuple[bytes, np.ndarray, int]:
        if self._g0 is None:
            raise ProtocolError("OT extension: base OTs not done")
        choices = np.asarray(choices)
        if choices.ndim != 1 or (choices.size and int(choices.max()) > 1) or (choices.size and int(choices.min()) < 0):
            raise ProtocolError("OT extension: choices must be a 1-D array of 0/1")
        m = _check_batch(choices.shape[0])
        mb = (m + 7) // 8
        r = np.packbits(choices.astype(np.uint8))  # zero padding to a byte
        t = self._g0.matrix(mb)
        u = self._g1.matrix(mb)
        u ^= t
        u ^= r[None, :]
        first = self.next_index
        self.next_index += 8 * mb
        return u.tobytes(), transpose_bits(t, m), first


class OTExtSender:
    """Extension sender; base-OT receiver with random Δ.

    ``respond_base(first)`` → bytes for the receiver; then ``extend(u, m)`` → (q rows (m, 16),
    first OT index) per batch, in the receiver's order. ``delta`` is Δ as 16 bytes.
    """

    def __init__(self, session_id: bytes):
        delta = np.frombuffer(os.urandom(ROW_BYTES), np.uint8).copy()
        self.delta = delta
        self._s = np.unpackbits(delta)
        self._base = BaseOTReceiver(session_id, self._s.tolist())
        self._g: _Stream | None = None
        self.next_index = 0

    def state(self) -> bytes:
        """Δ, the base-OT receiver (its keys once it responded), the stream's position, the next OT
        index (crypto.state)."""
        return pack({"delta": self.delta.tobytes(), "base": Nested(self._base.state()),
                     "pos": self._g.pos if self._g is not None else -1, "next": self.next_index})

    @classmethod
    def restore(cls, data: bytes) -> OTExtSender:
        s = State(data, "OT extension sender")
        snd = cls.__new__(cls)  # not __init__: it would draw a new Δ
        snd.delta = np.frombuffer(s.bytes("delta", ROW_BYTES), np.uint8).copy()
        snd._s = np.unpackbits(snd.delta)
        snd._base = BaseOTReceiver.restore(s.nested("base"))
        if snd._base._choices != snd._s.tolist():
            raise ProtocolError("OT extension: a saved sender's base-OT choices are not its Δ")
        pos = s.int("pos", -1)
        snd._g = None if pos < 0 else _Stream(snd._base.keys, pos)
        snd.next_index = s.int("next", 0)
        return snd

    def respond_base(self, first: bytes) -> bytes:
        reply = self._base.respond(first)
        self._g = _Stream(self._base.keys)
        return reply

    def extend(self, u: bytes, m: int) -> tuple[np.ndarray, int]:
        if self._g is None:
            raise ProtocolError("OT extension: base OTs not done")
        m = _check_batch(m)
        mb = (m + 7) // 8
        if not isinstance(u, (bytes, bytearray, memoryview)) or len(u) != KAPPA * mb:
            got = len(u) if isinstance(u, (bytes, bytearray, memoryview)) else type(u).__name__
            raise ProtocolError(f"OT extension: U has {got} bytes, expected {KAPPA * mb} for {m} OTs")
        uu = np.frombuffer(u, np.uint8).reshape(KAPPA, mb)
        q = self._g.matrix(mb)
        mask = (self._s * np.uint8(0xFF))[:, None]
        q ^= uu & mask
        first = self.next_index
        self.next_index += 8 * mb
        return transpose_bits(q, m), first

    def pads(self, q_rows: np.ndarray, first_index: int, nblocks: int) -> tuple[np.ndarray, np.ndarray]:
        """Random-OT pads (H(q_i), H(q_i ⊕ Δ)), each (m, 16·nblocks) uint8."""
        p0 = tccr_hash(q_rows, first_index, nblocks)
        p1 = tccr_hash(q_rows ^ self.delta[None, :], first_index, nblocks)
        return p0, p1
