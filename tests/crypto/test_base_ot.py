"""Chou–Orlandi base OT and IKNP OT extension: correctness and input validation."""

import secrets

import numpy as np
import pytest
from nacl import bindings as nb

from crypto.base_ot import BaseOTReceiver, BaseOTSender
from crypto.errors import ProtocolError
from crypto.ot_extension import OTExtReceiver, OTExtSender, tccr_hash, transpose_bits, u_bytes

IDENTITY = b"\x01" + b"\x00" * 31
SMALL_ORDER = bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a")  # order 8
NOT_ON_CURVE = b"\x02" + b"\x00" * 31
NON_CANONICAL = b"\xff" * 31 + b"\x7f"


def _run_base(count=128, sid=b"session"):
    choices = [secrets.randbelow(2) for _ in range(count)]
    snd = BaseOTSender(sid, count)
    rcv = BaseOTReceiver(sid, choices)
    pairs = snd.finish(rcv.respond(snd.first_message()))
    return choices, pairs, rcv.keys


def test_base_ot_receiver_gets_exactly_the_chosen_key():
    choices, pairs, keys = _run_base()
    assert len(pairs) == len(keys) == 128
    for c, (k0, k1), k in zip(choices, pairs, keys):
        assert len(k) == 32
        assert k == (k0, k1)[c]
        assert k != (k0, k1)[1 - c]
    flat = [k for pair in pairs for k in pair]
    assert len(set(flat)) == len(flat)  # all keys distinct


def test_base_ot_both_choices_and_small_batches():
    for choices in ([0] * 5, [1] * 5, [0, 1, 1, 0, 1]):
        snd = BaseOTSender(b"s", len(choices))
        rcv = BaseOTReceiver(b"s", choices)
        pairs = snd.finish(rcv.respond(snd.first_message()))
        assert [p[c] for p, c in zip(pairs, choices)] == rcv.keys


def test_base_ot_session_id_separates_keys():
    choices = [0] * 4
    snd = BaseOTSender(b"one", 4)
    rcv = BaseOTReceiver(b"two", choices)
    pairs = snd.finish(rcv.respond(snd.first_message()))
    assert all(p[0] != k for p, k in zip(pairs, rcv.keys))


@pytest.mark.parametrize("bad", [IDENTITY, SMALL_ORDER, NOT_ON_CURVE, NON_CANONICAL, b"\x00" * 32])
def test_base_ot_receiver_rejects_invalid_sender_point(bad):
    assert not nb.crypto_core_ed25519_is_valid_point(bad)
    rcv = BaseOTReceiver(b"s", [0, 1])
    with pytest.raises(ProtocolError):
        rcv.respond(bad)


@pytest.mark.parametrize("bad", [IDENTITY, SMALL_ORDER, NOT_ON_CURVE, NON_CANONICAL])
def test_base_ot_sender_rejects_invalid_receiver_point(bad):
    snd = BaseOTSender(b"s", 4)
    rcv = BaseOTReceiver(b"s", [0, 1, 0, 1])
    reply = bytearray(rcv.respond(snd.first_message()))
    reply[64:96] = bad
    with pytest.raises(ProtocolError):
        snd.finish(bytes(reply))


def test_base_ot_rejects_wrong_lengths_and_parameters():
    snd = BaseOTSender(b"s", 4)
    rcv = BaseOTReceiver(b"s", [0, 1, 0, 1])
    with pytest.raises(ProtocolError):
        rcv.respond(snd.first_message()[:31])
    reply = rcv.respond(snd.first_message())
    with pytest.raises(ProtocolError):
        snd.finish(reply[:-1])
    with pytest.raises(ProtocolError):
        snd.finish(reply + b"\x00")
    with pytest.raises(ProtocolError):
        BaseOTReceiver(b"s", [0, 2])
    with pytest.raises(ProtocolError):
        BaseOTSender(b"", 4)
    with pytest.raises(ProtocolError):
        BaseOTSender(b"s", 0)
    with pytest.raises(ProtocolError):
        rcv.respond(snd.first_message())  # twice


def _ext_pair(sid=b"ext"):
    r, s = OTExtReceiver(sid), OTExtSender(sid)
    r.accept_base_reply(s.respond_base(r.base_message()))
    return r, s


def test_transpose_matches_reference():
    rng = np.random.default_rng(7)
    for m in (1, 7, 8, 9, 100, 1024, 4099):
        mat = rng.integers(0, 256, (128, (m + 7) // 8), dtype=np.uint8)
        ref = np.packbits(np.unpackbits(mat, axis=1)[:, :m].T, axis=1)
        assert np.array_equal(transpose_bits(mat, m), ref)


def test_ot_extension_random_choices_several_batches():
    rng = np.random.default_rng(1)
    r, s = _ext_pair()
    for m in (1, 13, 1000, 8192):
        choices = rng.integers(0, 2, m).astype(np.uint8)
        u, t_rows, first_r = r.extend(choices)
        assert len(u) == u_bytes(m)
        q_rows, first_s = s.extend(u, m)
        assert first_r == first_s
        # the IKNP correlation q_i = t_i xor r_i * delta
        assert np.array_equal(q_rows, t_rows ^ (choices[:, None] * s.delta[None, :]))
        p0, p1 = s.pads(q_rows, first_s, 3)
        got = tccr_hash(t_rows, first_r, 3)
        chosen = np.where(choices[:, None] == 1, p1, p0)
        other = np.where(choices[:, None] == 1, p0, p1)
        assert np.array_equal(got, chosen)
        assert np.all(np.any(got != other, axis=1))
    assert r.next_index == s.next_index


def test_ot_extension_hash_depends_on_tweak():
    rows = np.zeros((2, 16), np.uint8)
    h = tccr_hash(rows, 0, 2)
    assert not np.array_equal(h[0], h[1])  # same input, different OT index
    assert not np.array_equal(h[0, :16], h[0, 16:])  # different block counter


def test_ot_extension_rejects_bad_u():
    r, s = _ext_pair()
    u, _, _ = r.extend(np.zeros(100, np.uint8))
    with pytest.raises(ProtocolError):
        s.extend(u[:-1], 100)
    with pytest.raises(ProtocolError):
        s.extend(u + b"\x00", 100)
    with pytest.raises(ProtocolError):
        s.extend(u, 0)
    with pytest.raises(ProtocolError):
        r.extend(np.array([0, 2]))
