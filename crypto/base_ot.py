"""Batched semi-honest 1-out-of-2 base OT: Chou–Orlandi "simplest OT", sans-I/O.

Construction (Chou & Orlandi, LATINCRYPT 2015), in the prime-order subgroup of edwards25519
(G the standard base point, ℓ its order), ``count`` OTs (128 by default) at once:

    sender    a ← Z_ℓ*,  S = a·G                              ── S ──────────────▶
    receiver  for each i: b_i ← Z_ℓ*, R_i = b_i·G + c_i·S     ◀── R_1 … R_count ──
    receiver  k_i     = KDF(sid, i, S, R_i, b_i·S)
    sender    k_i^0   = KDF(sid, i, S, R_i, a·R_i)
              k_i^1   = KDF(sid, i, S, R_i, a·R_i − a·S)       (= a·(R_i − S))

so the receiver ends with k_i^{c_i} and, under CDH in the random-oracle model, nothing about
k_i^{1−c_i}; the sender learns nothing about c_i (R_i is a uniform group element either way).
KDF is SHA-256 over a domain tag, the session id, the index and the points; keys are 32 bytes
(the OT extension uses the first 16 as an AES-128 key). Semi-honest security only; one S serves
the whole batch, which is the standard batched form.

Group: PyNaCl 1.6 does not expose libsodium's ristretto255 functions (``nacl.bindings`` has only
the ``crypto_core_ed25519_*`` / ``crypto_scalarmult_ed25519_*`` families), so this module works in
edwards25519's prime-order subgroup directly. Every received point is checked with
``crypto_core_ed25519_is_valid_point`` (canonical encoding, on the curve, in the prime-order
subgroup, not of small order — which also rejects the identity); scalar multiplications use the
``noclamp`` variants with scalars reduced mod ℓ, and libsodium refuses an identity result. This
gives the same security as ristretto255 for this protocol (ristretto's only advantage, a
cofactor-free encoding, is replaced by the explicit subgroup check).

Messages are raw concatenations of 32-byte points (the caller wraps them in its own versioned
framing); every malformed input raises :class:`crypto.errors.ProtocolError`.

Usage::

    snd = BaseOTSender(session_id, count=128)
    rcv = BaseOTReceiver(session_id, choices)          # choices: 128 ints in {0, 1}
    reply = rcv.respond(snd.first_message())
    pairs = snd.finish(reply)                          # [(k0, k1)] * 128
    keys = rcv.keys                                    # [k_{c_i}] * 128
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence

from nacl import bindings as nb
from nacl.exceptions import RuntimeError as NaclRuntimeError

from crypto.errors import ProtocolError
from crypto.state import State, pack

POINT_BYTES = 32
KEY_BYTES = 32
DEFAULT_COUNT = 128
MAX_COUNT = 4096
_DOMAIN = b"XCLP/base-ot/chou-orlandi/ed25519/v1"

__all__ = ["BaseOTSender", "BaseOTReceiver", "POINT_BYTES", "KEY_BYTES", "DEFAULT_COUNT"]


def _random_scalar() -> bytes:
    """A uniform non-zero scalar mod ℓ (64 random bytes reduced: bias < 2^-250)."""
    while True:
        s = nb.crypto_core_ed25519_scalar_reduce(os.urandom(64))
        if any(s):
            return s


def _check_point(p: bytes, what: str) -> None:
    if len(p) != POINT_BYTES or not nb.crypto_core_ed25519_is_valid_point(p):
        raise ProtocolError(f"base OT: {what} is not a valid prime-order edwards25519 point")


def _mul(scalar: bytes, point: bytes, what: str) -> bytes:
    try:
        return nb.crypto_scalarmult_ed25519_noclamp(scalar, point)
    except NaclRuntimeError as exc:  # identity result
        raise ProtocolError(f"base OT: {what} gives the identity") from exc


def _check_session_id(session_id: bytes) -> bytes:
    if not isinstance(session_id, (bytes, bytearray)) or not 1 <= len(session_id) <= 255:
        raise ProtocolError("base OT: session id must be 1..255 bytes")
    return bytes(session_id)


def _check_count(count: int) -> int:
    if not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ProtocolError(f"base OT: count must be an integer in 1..{MAX_COUNT}, got {count!r}")
    return count


def _kdf(session_id: bytes, index: int, s: bytes, r: bytes, shared: bytes) -> bytes:
    h = hashlib.sha256()
    h.update(_DOMAIN)
    h.update(bytes([len(session_id)]) + session_id)
    h.update(struct.pack(">I", index))
    h.update(s)
    h.update(r)
    h.update(shared)
    return h.digest()


class BaseOTSender:
    """The OT sender: ends with a pair of random 32-byte keys (k0, k1) per OT."""

    def __init__(self, session_id: bytes, count: int = DEFAULT_COUNT):
        self.session_id = _check_session_id(session_id)
        self.count = _check_count(count)
        self._a = _random_scalar()
        self._s = nb.crypto_scalarmult_ed25519_base_noclamp(self._a)
        self._finished = False

    def first_message(self) -> bytes:
        """S = a·G (32 bytes)."""
        return self._s

    def state(self) -> bytes:
        """The secret scalar a (wiped once finished), S and whether it has finished (crypto.state)."""
        return pack({"sid": self.session_id, "count": self.count, "a": self._a, "S": self._s,
                     "finished": self._finished})

    @classmethod
    def restore(cls, data: bytes) -> BaseOTSender:
        s = State(data, "base OT sender")
        snd = cls.__new__(cls)  # not __init__: it would draw a new a
        snd.session_id, snd.count = _check_session_id(s.bytes("sid")), _check_count(s.int("count"))
        snd._a, snd._s, snd._finished = s.bytes("a"), s.bytes("S", POINT_BYTES), s.bool("finished")
        if not snd._finished and len(snd._a) != 32:
            raise ProtocolError("base OT: a saved sender's scalar is 32 bytes")
        return snd

    @property
    def reply_bytes(self) -> int:
        return self.count * POINT_BYTES

    def finish(self, reply: bytes) -> list[tuple[bytes, bytes]]:
        """Consume the receiver's R_1..R_count and return [(k0, k1)] per OT."""
        if self._finished:
            raise ProtocolError("base OT: sender already finished")
        if not isinstance(reply, (bytes, bytearray, memoryview)):
            raise ProtocolError("base OT: reply must be bytes")
        reply = bytes(reply)
        if len(reply) != self.reply_bytes:
            raise ProtocolError(f"base OT: reply has {len(reply)} bytes, expected {self.reply_bytes}")
        a_s = _mul(self._a, self._s, "a·S")
        out = []
        for i in range(self.count):
            r = reply[i * POINT_BYTES : (i + 1) * POINT_BYTES]
            _check_point(r, f"receiver point {i}")
            p0 = _mul(self._a, r, f"a·R_{i}")
            p1 = nb.crypto_core_ed25519_sub(p0, a_s)
            out.append((_kdf(self.session_id, i, self._s, r, p0), _kdf(self.session_id, i, self._s, r, p1)))
        self._finished = True
        self._a = b""
        return out


class BaseOTReceiver:
    """The OT receiver with choice bits c_i: ends with k_i^{c_i} per OT (``keys``)."""

    def __init__(self, session_id: bytes, choices: Sequence[int]):
        self.session_id = _check_session_id(session_id)
        choices = [int(c) for c in choices]
        _check_count(len(choices))
        if any(c not in (0, 1) for c in choices):
            raise ProtocolError("base OT: choice bits must be 0 or 1")
        self.count = len(choices)
        self._choices = choices
        self._keys: list[bytes] | None = None

    def respond(self, first: bytes) -> bytes:
        """Consume S and return R_1..R_count (count × 32 bytes); the keys are then in ``keys``."""
        if self._keys is not None:
            raise ProtocolError("base OT: receiver already responded")
        if not isinstance(first, (bytes, bytearray, memoryview)):
            raise ProtocolError("base OT: first message must be bytes")
        s = bytes(first)
        if len(s) != POINT_BYTES:
            raise ProtocolError(f"base OT: first message has {len(s)} bytes, expected {POINT_BYTES}")
        _check_point(s, "sender point S")
        reply = []
        keys = []
        for i, c in enumerate(self._choices):
            b = _random_scalar()
            bg = nb.crypto_scalarmult_ed25519_base_noclamp(b)
            r = (bg, nb.crypto_core_ed25519_add(s, bg))[c]  # both computed: no choice-dependent work
            reply.append(r)
            keys.append(_kdf(self.session_id, i, s, r, _mul(b, s, "b·S")))
        self._keys = keys
        return b"".join(reply)

    def state(self) -> bytes:
        """The choice bits and, once it has responded, the keys it ended with (crypto.state)."""
        return pack({"sid": self.session_id, "choices": bytes(self._choices),
                     "keys": b"".join(self._keys) if self._keys is not None else b"", "responded": self._keys is not None})

    @classmethod
    def restore(cls, data: bytes) -> BaseOTReceiver:
        s = State(data, "base OT receiver")
        rcv = cls(s.bytes("sid"), list(s.bytes("choices")))
        if s.bool("responded"):
            keys = s.bytes("keys", rcv.count * KEY_BYTES)
            rcv._keys = [keys[i * KEY_BYTES : (i + 1) * KEY_BYTES] for i in range(rcv.count)]
        return rcv

    @property
    def keys(self) -> list[bytes]:
        if self._keys is None:
            raise ProtocolError("base OT: receiver has not responded yet")
        return list(self._keys)
