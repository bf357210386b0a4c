"""Unambiguous byte strings for what is hashed, signed, or bound into a key: every variable-length part
length-prefixed (4 bytes, big-endian), so that no two different lists of parts encode alike (the
ambiguity "ab"+"c" = "a"+"bc" that a plain concatenation has). One encoding for the channels, the
pairwise keys, the seed agreement and the identity signatures."""

from __future__ import annotations

import struct


def lp(data: bytes) -> bytes:
    """`data`, prefixed with its length (4 bytes, big-endian)."""
    return struct.pack(">I", len(data)) + bytes(data)
