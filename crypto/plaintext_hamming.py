"""PLAINTEXT Hamming "protocol": each site sends its bits to the coordinator in the clear.

Not secure, and named so: it is the reference that the secure protocols must match exactly, and
the fast path for experiments. It has the same interface as the secure protocols, so the phase
code is the same for every mode.
"""

from __future__ import annotations

import numpy as np

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, check_bits, plaintext_hamming


class _Sender:
    def __init__(self, bits: np.ndarray, n_bits: int):
        self.bits = check_bits(bits, n_bits)

    def receive(self, message: bytes | None) -> Outgoing:
        if message is not None:
            raise ProtocolError("plaintext Hamming: a party expects no message from its peer")
        return Outgoing(to_server=self.bits.tobytes(), done=True)


class PlaintextHamming:
    name = "plaintext"

    def party_a(self, bits: np.ndarray, n_bits: int) -> _Sender:
        return _Sender(bits, n_bits)

    def party_b(self, bits: np.ndarray, n_bits: int) -> _Sender:
        return _Sender(bits, n_bits)

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray:
        width = (n_bits + 7) // 8
        for share, n, who in ((share_a, n_a, "A"), (share_b, n_b, "B")):
            if len(share) != n * width:
                raise ProtocolError(f"plaintext Hamming: share of {who} has {len(share)} bytes, expected {n * width}")
        a = check_bits(np.frombuffer(share_a, dtype=np.uint8).reshape(n_a, width), n_bits, "A's bits")
        b = check_bits(np.frombuffer(share_b, dtype=np.uint8).reshape(n_b, width), n_bits, "B's bits")
        return plaintext_hamming(a, b, n_bits)
