"""Per-job site key pairs (X25519) and pairwise key derivation (HKDF-SHA256).

Every site makes a fresh X25519 key pair per job and registers the public key with the coordinator,
which hands all public keys to all participants (the setup phase, xclp/protocol.py). Two sites j and k then derive
the same pairwise key

    K_jk = HKDF-SHA256(ikm = X25519(sk_j, pk_k), salt = "xclp/pairwise-key/v1",
                       info = "xclp/pairwise-key/v1" ‖ job ‖ purpose ‖ attempt ‖
                              name_lo ‖ pk_lo ‖ name_hi ‖ pk_hi)

where (name_lo, pk_lo), (name_hi, pk_hi) are the two sites and their public keys sorted by name, so
both sides compute the same bytes. Every string is UTF-8 with a 4-byte big-endian length prefix and
the attempt is a fixed 8-byte big-endian integer, so two distinct tuples never give the same info
(no ambiguity such as ("ab", "c") vs ("a", "bc")). Binding the public keys as well ties the key to
this exact exchange.

`purpose` separates independent uses of one pair of key pairs (e.g. "channel", "row-sums",
"class-counts"); `attempt` makes every restart of a protocol use fresh keys (SecureRowSums must never
reuse masks across attempts).

Sans-I/O: no files, no sockets. Persist `private_bytes()` yourself (it is secret).
"""

from __future__ import annotations

import struct

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from crypto.encoding import lp
from crypto.errors import ProtocolError

KEY_BYTES = 32  # X25519 private and public keys
_DOMAIN = b"xclp/pairwise-key/v1"
_MAX_NAME_BYTES = 1024
_MAX_HKDF_BYTES = 255 * 32


def _name_bytes(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(f"{what} must be a str, got {type(value).__name__}")
    data = value.encode("utf-8")
    if not data:
        raise ProtocolError(f"{what} must not be empty")
    if len(data) > _MAX_NAME_BYTES:
        raise ProtocolError(f"{what} is longer than {_MAX_NAME_BYTES} bytes")
    return data


def _check_public(peer_public: bytes) -> bytes:
    if not isinstance(peer_public, bytes | bytearray | memoryview):
        raise ProtocolError(f"a public key must be bytes, got {type(peer_public).__name__}")
    peer_public = bytes(peer_public)
    if len(peer_public) != KEY_BYTES:
        raise ProtocolError(f"an X25519 public key has {KEY_BYTES} bytes, got {len(peer_public)}")
    return peer_public


class SiteKeyPair:
    """A site's X25519 key pair for one job."""

    __slots__ = ("_private",)

    def __init__(self, private_key: X25519PrivateKey):
        if not isinstance(private_key, X25519PrivateKey):
            raise ProtocolError("SiteKeyPair needs an X25519PrivateKey")
        self._private = private_key

    @classmethod
    def generate(cls) -> SiteKeyPair:
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, data: bytes) -> SiteKeyPair:
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) != KEY_BYTES:
            raise ProtocolError(f"an X25519 private key has {KEY_BYTES} bytes")
        return cls(X25519PrivateKey.from_private_bytes(bytes(data)))

    def private_bytes(self) -> bytes:
        """The raw 32-byte private key (secret: persist it only in the site's own protected store)."""
        return self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def public_bytes(self) -> bytes:
        """The raw 32-byte public key, to register with the coordinator."""
        return self._private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def exchange(self, peer_public: bytes) -> bytes:
        """The raw X25519 shared secret; rejects malformed and low-order public keys."""
        peer_public = _check_public(peer_public)
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError as exc:  # OpenSSL refuses an all-zero result (low-order point)
            raise ProtocolError("X25519 exchange failed: the peer public key is of low order") from exc
        if shared == bytes(len(shared)):
            raise ProtocolError("X25519 shared secret is all zero: the peer public key is of low order")
        return shared

    def __repr__(self) -> str:  # never print the private key
        return f"SiteKeyPair(public={self.public_bytes().hex()[:16]}…)"


def check_peer_public(peer_public: bytes, what: str = "public key") -> bytes:
    """A peer's X25519 public key as 32 bytes, refused (ProtocolError) if malformed or of low order:
    such a key would make every peer's key agreement fail later, so it is refused on receipt.
    (One exchange with a throwaway key costs ~30 µs.)"""
    try:
        key = _check_public(peer_public)
        SiteKeyPair.generate().exchange(key)
    except ProtocolError as exc:
        raise ProtocolError(f"{what}: {exc}") from None
    return key


def pairwise_info(
    *, job: str, purpose: str, attempt: int, me: str, peer: str, me_public: bytes, peer_public: bytes
) -> bytes:
    """The HKDF info string (exposed for tests and documentation); symmetric in (me, peer)."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt < 2**63:
        raise ProtocolError(f"attempt must be an int in [0, 2^63), got {attempt!r}")
    me_b, peer_b = _name_bytes(me, "me"), _name_bytes(peer, "peer")
    if me_b == peer_b:
        raise ProtocolError("a pairwise key needs two distinct sites")
    sides = sorted([(me_b, _check_public(me_public)), (peer_b, _check_public(peer_public))])
    return b"".join(
        [
            _DOMAIN,
            lp(_name_bytes(job, "job")),
            lp(_name_bytes(purpose, "purpose")),
            struct.pack(">Q", attempt),
            lp(sides[0][0]),
            lp(sides[0][1]),
            lp(sides[1][0]),
            lp(sides[1][1]),
        ]
    )


def pairwise_key(
    private: SiteKeyPair,
    peer_public: bytes,
    *,
    job: str,
    purpose: str,
    attempt: int,
    me: str,
    peer: str,
    length: int = 32,
) -> bytes:
    """K_jk: the same `length` bytes at both sites, bound to (job, purpose, attempt, {me, peer})."""
    if not isinstance(private, SiteKeyPair):
        raise ProtocolError("private must be a SiteKeyPair")
    if isinstance(length, bool) or not isinstance(length, int) or not 16 <= length <= _MAX_HKDF_BYTES:
        raise ProtocolError(f"length must be an int in [16, {_MAX_HKDF_BYTES}], got {length!r}")
    info = pairwise_info(
        job=job,
        purpose=purpose,
        attempt=attempt,
        me=me,
        peer=peer,
        me_public=private.public_bytes(),
        peer_public=peer_public,
    )
    shared = private.exchange(peer_public)
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=_DOMAIN, info=info).derive(shared)


def pairwise_keys(
    private: SiteKeyPair,
    public_keys: dict[str, bytes],
    *,
    job: str,
    purpose: str,
    attempt: int,
    me: str,
    peers: list[str] | None = None,
    length: int = 32,
) -> dict[str, bytes]:
    """K_{me,k} for every peer k in `peers` (default: every name in public_keys except me)."""
    if peers is None:
        peers = [name for name in public_keys if name != me]
    out: dict[str, bytes] = {}
    for peer in peers:
        if peer == me:
            continue
        if peer not in public_keys:
            raise ProtocolError(f"no public key for site {peer!r}")
        out[peer] = pairwise_key(
            private, public_keys[peer], job=job, purpose=purpose, attempt=attempt, me=me, peer=peer, length=length
        )
    return out
