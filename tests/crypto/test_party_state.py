"""Every pair protocol's parties save to bytes and restore (crypto.state: no pickle), and the restored
party goes on exactly as the saved one would have: after every message one side is replaced by its
restored copy, and a twin restored from the same bytes must answer the next message byte for byte as
the copy does — except on the few steps that draw fresh randomness (listed), where the final
distances must still be the plaintext's. With its randomness injected, a lattice pair restored after
every message gives the very shares of an uninterrupted one."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.hamming_api import PairDriver, plaintext_hamming
from crypto.lattice_hamming import LatticeHamming
from crypto.ot_hamming import OTHamming
from crypto.paillier_hamming import PaillierHamming, PaillierNaiveHamming
from crypto.plaintext_hamming import PlaintextHamming
from crypto.state import State, pack

L = 40


def _bits(n, seed):
    rng = np.random.default_rng(seed)
    return np.packbits(rng.integers(0, 2, (n, L), dtype=np.uint8), axis=1)


PROTOCOLS = {
    "plaintext": lambda: PlaintextHamming(),
    "lattice": lambda: LatticeHamming(threads=1),
    "paillier": lambda: PaillierHamming(1024, insecure_test_key_bits=True, threads=1),
    "paillier-naive": lambda: PaillierNaiveHamming(1024, insecure_test_key_bits=True),
    "ot": lambda: OTHamming(chunk_vectors=3, threads=1),  # several EXT/CORR rounds
}
# (protocol, role, stage before the step): steps that draw fresh randomness, so a twin differs
FRESH = {("paillier", "a", 0), ("paillier", "b", 0), ("paillier-naive", "a", 0), ("paillier-naive", "b", 0),
         ("ot", "a", "base"), ("ot", "b", "start")}


def _stage(party):
    return getattr(party, "stage", None)


@pytest.mark.parametrize("side", ["a", "b"])
@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_a_party_restored_after_every_message_goes_on_as_the_saved_one(name, side):
    proto = PROTOCOLS[name]()
    bits = {"a": _bits(7, 1), "b": _bits(8, 2)}
    parties = {"a": proto.party_a(bits["a"], L), "b": proto.party_b(bits["b"], L)}
    saved_proto = proto.state() if hasattr(proto, "state") else None
    shares, who, message, steps = {}, "a", None, 0
    while True:
        party = parties[who]
        if who == side:
            data = party.state()
            assert isinstance(data, bytes) and b"pickle" not in data
            if saved_proto is not None:  # the site's job-wide secrets travel with it (lattice: A's key)
                proto = PROTOCOLS[name]().restore(proto.state())
            restored = proto.restore_party(bits[who], L, data)
            assert restored.state() == data  # nothing lost, nothing added
            twin = proto.restore_party(bits[who], L, data)
            fresh = (name, who, _stage(party)) in FRESH
            out = restored.receive(message)
            if not fresh:
                assert twin.receive(message) == out, (name, who, steps)
            parties[who] = restored
        else:
            out = party.receive(message)
        steps += 1
        if out.to_server is not None:
            shares[who] = out.to_server
        if out.to_peer is None:
            break
        who, message = ("b" if who == "a" else "a"), out.to_peer
    assert set(shares) == {"a", "b"}
    h = proto.combine(shares["a"], shares["b"], 7, 8, L)
    assert np.array_equal(h, plaintext_hamming(bits["a"], bits["b"], L))


def _lattice_shares(restore_every: bool, key: bytes) -> tuple[bytes, bytes]:
    """A lattice pair with A's master key and B's secret injected; with `restore_every`, both sides
    (and A's protocol object) are saved and rebuilt from bytes after every message."""
    bits_a, bits_b = _bits(9, 3), _bits(70, 4)  # several RES/ACK rounds (B answers in groups of 32)
    proto = LatticeHamming(threads=1, target_message_bytes=1).restore(pack({"master": key, "decrypted": 0}))
    drivers = {"a": PairDriver(proto.party_a(bits_a, L), True),
               "b": PairDriver(proto.party_b(bits_b, L, secret=key[::-1]), False)}
    bits = {"a": bits_a, "b": bits_b}
    shares, who, message = {}, "a", None
    while True:
        if restore_every:
            proto = LatticeHamming(threads=1, target_message_bytes=1).restore(proto.state())
            drivers = {w: PairDriver.restore(d.state(), lambda b, w=w, p=proto: p.restore_party(bits[w], L, b))
                       for w, d in drivers.items()}
        to_peer, to_server = drivers[who].step(message)
        if to_server is not None:
            shares[who] = to_server
        if to_peer is None:
            break
        who, message = ("b" if who == "a" else "a"), to_peer[1]
    return shares["a"], shares["b"]


def test_an_injected_lattice_pair_restored_after_every_message_gives_the_uninterrupted_shares():
    key = bytes(range(32))
    assert _lattice_shares(True, key) == _lattice_shares(False, key)
    assert _lattice_shares(False, bytes(32))[0] != _lattice_shares(False, key)[0]


def test_a_pair_driver_restores_its_turns():
    proto = PlaintextHamming()
    a = PairDriver(proto.party_a(_bits(3, 1), L), True)
    back = PairDriver.restore(a.state(), lambda b: proto.restore_party(_bits(3, 1), L, b))
    assert (back.my_turn, back.sent, back.got, back.done) == (True, 0, 0, False)
    back.step(None)
    with pytest.raises(ProtocolError, match="finished"):
        PairDriver.restore(back.state(), lambda b: proto.restore_party(_bits(3, 1), L, b)).step(b"x")


def test_a_saved_state_is_framed_fields_and_refuses_anything_else():
    import pickle

    data = pack({"n": 3, "b": b"\x00\x01", "a": np.arange(4, dtype=np.int64), "big": 2**300})
    s = State(data)
    assert s.int("n") == 3 and s.bytes("b") == b"\x00\x01" and s.json("big") == 2**300
    assert np.array_equal(s.array("a", np.int64, (4,)), np.arange(4))
    with pytest.raises(ProtocolError, match="kind"):
        s.bytes("n")
    with pytest.raises(ProtocolError, match="expected"):
        s.array("a", np.uint8)
    for bad in (pickle.dumps({"n": 3}), data[:-1], data + b"x", b""):
        with pytest.raises(ProtocolError):
            State(bad)
    # an array field that holds a pickled object array is refused, never unpickled
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([object()], dtype=object), allow_pickle=True)
    from crypto.state import _FIELD, _HEAD, _NAME, MAGIC, VERSION

    evil = _HEAD.pack(MAGIC, VERSION, 1) + _NAME.pack(1) + b"a" + _FIELD.pack(b"A", len(buf.getvalue())) + buf.getvalue()
    with pytest.raises(ProtocolError, match="not an array"):
        State(evil).array("a")
