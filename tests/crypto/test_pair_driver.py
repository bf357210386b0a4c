"""The pair protocols' turn-taking (crypto.hamming_api.PairDriver), which the in-process exchange and
the site agent share: message numbers, turns, one share per side, and a protocol that stalls or
talks too long is an error, never a hang."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, PairDriver, exchange, plaintext_hamming
from crypto.lattice_hamming import LatticeHamming


class Scripted:
    """A party that answers every message with the next of its scripted outputs."""

    def __init__(self, outputs):
        self.outputs = list(outputs)
        self.seen = []

    def receive(self, message):
        self.seen.append(message)
        return self.outputs.pop(0)


def test_messages_are_numbered_and_driven_in_turn_as_over_http():
    rng = np.random.default_rng(3)
    a = np.packbits(rng.integers(0, 2, (5, 64), dtype=np.uint8), axis=1)
    b = np.packbits(rng.integers(0, 2, (4, 64), dtype=np.uint8), axis=1)
    proto = LatticeHamming()
    sides = {"a": PairDriver(proto.party_a(a, 64), first=True), "b": PairDriver(proto.party_b(b, 64), first=False)}
    assert sides["a"].awaiting is None and sides["b"].awaiting == 0
    mailbox: dict[tuple[str, int], bytes] = {}  # (recipient, number) -> bytes: what the relay stores
    shares = {}
    for _ in range(20):  # each side asks for exactly the message its `awaiting` names, as the agent does
        for who, other in (("a", "b"), ("b", "a")):
            side = sides[who]
            if side.done:
                continue
            if side.awaiting is not None and (who, side.awaiting) not in mailbox:
                continue
            to_peer, to_server = side.step(None if side.awaiting is None else mailbox.pop((who, side.awaiting)))
            if to_server is not None:
                shares[who] = to_server
            if to_peer is not None:
                mailbox[(other, to_peer[0])] = to_peer[1]
    assert sides["a"].done and sides["b"].done and not mailbox
    H = proto.combine(shares["a"], shares["b"], 5, 4, 64)
    assert np.array_equal(H, plaintext_hamming(a, b, 64))


def test_out_of_turn_twice_shared_stalled_and_endless_protocols_are_refused():
    with pytest.raises(ProtocolError, match="needs the peer's next message"):
        PairDriver(Scripted([]), first=False).step(None)
    with pytest.raises(ProtocolError, match="speaks first"):
        PairDriver(Scripted([]), first=True).step(b"x")
    d = PairDriver(Scripted([Outgoing(to_server=b"s", done=True)]), first=True)
    d.step()
    with pytest.raises(ProtocolError, match="finished"):
        d.step()
    twice = PairDriver(Scripted([Outgoing(to_peer=b"m", to_server=b"s"), Outgoing(to_server=b"s")]), first=True)
    twice.step()
    with pytest.raises(ProtocolError, match="share twice"):
        twice.step(b"reply")
    # B answers nothing and is not done: A waits forever over HTTP; in process it is an error at once
    stalled_a = Scripted([Outgoing(to_peer=b"hello")])
    stalled_b = Scripted([Outgoing(to_server=b"s")])
    with pytest.raises(ProtocolError, match="stalled"):
        exchange(stalled_a, stalled_b)
    chatty = [Outgoing(to_peer=b"m")] * 10
    with pytest.raises(ProtocolError, match="within 4 messages"):
        exchange(Scripted(chatty), Scripted(chatty), max_rounds=4)
