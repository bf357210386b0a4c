"""PLAINTEXT Hamming "protocol": each site sends its bits to the coordinator in the clear.

Not secure, and named so: it is the reference that the secure protocols must match exactly, and
the fast path for experiments. It has the same interface as the secure protocols, so the phase
code is the same for every mode.
"""

from __future__ import annotations

import numpy as np

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, check_bits, plaintext_hamming
from crypto.state import State, pack

START = b"\x01"


class _Sender:
    """A sends its bits and a one-byte start signal to B; B, on the signal, sends its bits.

    The signal keeps the interface's rule that B acts only on a message from A, so every driver
    (in-process or over the relay) treats all protocols alike.
    """

    def __init__(self, bits: np.ndarray, n_bits: int, first: bool):
        self.bits = check_bits(bits, n_bits)
        self.first = first
        self.done = False

    def receive(self, message: bytes | None) -> Outgoing:
        if self.done:
            raise ProtocolError("plaintext Hamming: this party has finished")
        if self.first and message is not None:
            raise ProtocolError("plaintext Hamming: A expects no message from B")
        if not self.first and message != START:
            raise ProtocolError("plaintext Hamming: B expects A's start signal")
        self.done = True
        return Outgoing(to_peer=START if self.first else None, to_server=self.bits.tobytes(), done=True)

    def state(self) -> bytes:
        return pack({"first": self.first, "done": self.done})

    @classmethod
    def restore(cls, bits: np.ndarray, n_bits: int, data: bytes) -> _Sender:
        s = State(data, "plaintext party")
        party = cls(bits, n_bits, s.bool("first"))
        party.done = s.bool("done")
        return party


class PlaintextHamming:
    name = "plaintext"

    def party_a(self, bits: np.ndarray, n_bits: int) -> _Sender:
        return _Sender(bits, n_bits, first=True)

    def party_b(self, bits: np.ndarray, n_bits: int) -> _Sender:
        return _Sender(bits, n_bits, first=False)

    def restore_party(self, bits: np.ndarray, n_bits: int, data: bytes) -> _Sender:
        return _Sender.restore(bits, n_bits, data)

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray:
        width = (n_bits + 7) // 8
        for share, n, who in ((share_a, n_a, "A"), (share_b, n_b, "B")):
            if len(share) != n * width:
                raise ProtocolError(f"plaintext Hamming: share of {who} has {len(share)} bytes, expected {n * width}")
        a = check_bits(np.frombuffer(share_a, dtype=np.uint8).reshape(n_a, width), n_bits, "A's bits")
        b = check_bits(np.frombuffer(share_b, dtype=np.uint8).reshape(n_b, width), n_bits, "B's bits")
        return plaintext_hamming(a, b, n_bits)
