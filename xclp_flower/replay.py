"""A site's state across Flower messages, by replay.

Flower's deployment runtime runs a ClientApp in a fresh process for every message; what survives
between messages is the node's `Context.state` (records of numbers, strings and bytes). A site's
side of an XCLP job is a state machine with live objects in it (an end-to-end channel per peer, the
pair protocols' parties, arrays), so the ClientApp keeps, instead of the objects, what makes them:
its secrets and every message it has taken, in order. Each call rebuilds the session and takes the
earlier messages again, then the new one.

Replaying gives the same state only if every random draw repeats. The site's long-lived secrets (its
X25519 key, its seed contribution, its DP noise secret) are stored, not drawn. Everything else the
protocol draws comes from `os.urandom` (crypto/: the lattice protocol's keys, errors, masks and
flooding noise; the channels' nonces), which `deterministic_urandom` replaces, for the duration of
one call, by AES-256-CTR keystream under a 32-byte secret that the site drew once from the real
os.urandom and keeps in its node-local state (NIST SP 800-90A's CTR_DRBG without reseeding: one
key, a counter, no output reused). The call is single-threaded (the lattice protocol with one
thread), so the draws come in the same order in every replay. The replayed outputs are those the
site already sent; they are dropped. Only protocols whose randomness is all os.urandom can be
replayed: plaintext (the reference) and lattice; Paillier (python-paillier's own generator) and OT
(libsodium) are refused with a clear error.
"""

from __future__ import annotations

import contextlib
import os

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from crypto.hamming_api import REGISTRY

REPLAYABLE = tuple(name for name, t in REGISTRY.items() if t.replayable)


class KeystreamRandom:
    """os.urandom's stand-in: the AES-256-CTR keystream under `key`, read from the start."""

    def __init__(self, key: bytes):
        if len(key) != 32:
            raise ValueError("the replay key is 32 bytes")
        self._key, self._pos = key, 0

    def __call__(self, n: int) -> bytes:
        n = int(n)
        if n < 0:
            raise ValueError("negative byte count")
        block, skip = divmod(self._pos, 16)
        enc = Cipher(algorithms.AES(self._key), modes.CTR(block.to_bytes(16, "big"))).encryptor()
        out = enc.update(bytes(skip + n))[skip:]
        self._pos += n
        return out


@contextlib.contextmanager
def deterministic_urandom(key: bytes):
    """Within the block, os.urandom reads `key`'s keystream (this process only: a ClientApp call)."""
    real = os.urandom
    os.urandom = KeystreamRandom(key)
    try:
        yield
    finally:
        os.urandom = real
