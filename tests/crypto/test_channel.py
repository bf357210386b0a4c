"""End-to-end channel between two sites (crypto.channel)."""

import json

import pytest

from crypto.channel import Channel
from crypto.errors import IntegrityError, ProtocolError

KEY = bytes(range(32))


def _pair(job="job-1", key=KEY, **kw):
    return Channel(key, job=job, me="alice", peer="bob", **kw), Channel(key, job=job, me="bob", peer="alice", **kw)


def test_round_trip_both_directions():
    a, b = _pair()
    for i in range(3):
        m = a.seal("hamming", b"hello %d" % i)
        assert b"hello" not in m
        assert b.open("hamming", m) == b"hello %d" % i
        r = b.seal("hamming", b"reply %d" % i)
        assert a.open("hamming", r) == b"reply %d" % i
    assert a.open("empty", b.seal("empty", b"")) == b""


def test_directions_use_distinct_keys():
    a, b = _pair()
    m = a.seal("p", b"x")
    # a message from alice cannot be opened as if it came from bob (reflection): misaddressed
    with pytest.raises(IntegrityError, match="misaddressed"):
        a.open("p", m)


def test_tamper_every_ciphertext_byte():
    a, b = _pair()
    m = a.seal("p", b"some payload bytes")
    header_len = len(m) - len(b"some payload bytes") - 16
    for i in range(len(m)):
        bad = bytearray(m)
        bad[i] ^= 0x01
        with pytest.raises(ProtocolError):
            b.open("p", bytes(bad))
        if i >= header_len:
            with pytest.raises(IntegrityError, match="tampered"):
                b.open("p", bytes(bad))
    assert b.open("p", m) == b"some payload bytes"  # rejected messages changed nothing


def test_tamper_nonce_is_integrity_error():
    a, b = _pair()
    m = bytearray(a.seal("p", b"abc"))
    m[len(m) - 3 - 16 - 1] ^= 0x80  # last nonce byte
    with pytest.raises(IntegrityError, match="tampered"):
        b.open("p", bytes(m))


def test_replay():
    a, b = _pair()
    m = a.seal("p", b"once")
    assert b.open("p", m) == b"once"
    with pytest.raises(IntegrityError, match="replay"):
        b.open("p", m)


def test_reorder():
    a, b = _pair()
    m0, m1 = a.seal("p", b"0"), a.seal("p", b"1")
    with pytest.raises(IntegrityError, match="reordered"):
        b.open("p", m1)
    assert b.open("p", m0) == b"0"
    assert b.open("p", m1) == b"1"


def test_wrong_recipient():
    a, _ = _pair()
    carol = Channel(KEY, job="job-1", me="carol", peer="alice")
    with pytest.raises(IntegrityError, match="misaddressed"):
        carol.open("p", a.seal("p", b"for bob"))


def test_wrong_sender():
    a, _ = _pair()
    bob_from_carol = Channel(KEY, job="job-1", me="bob", peer="carol")
    with pytest.raises(IntegrityError, match="misaddressed"):
        bob_from_carol.open("p", a.seal("p", b"x"))


def test_wrong_phase():
    a, b = _pair()
    m = a.seal("hamming", b"x")
    with pytest.raises(IntegrityError, match="wrong phase"):
        b.open("row-sums", m)
    assert b.open("hamming", m) == b"x"


def test_wrong_job():
    a, _ = _pair(job="job-1")
    _, b2 = _pair(job="job-2")
    with pytest.raises(IntegrityError, match="wrong job"):
        b2.open("p", a.seal("p", b"x"))


def test_wrong_key():
    a, _ = _pair()
    _, b = _pair(key=bytes(32))
    with pytest.raises(IntegrityError, match="tampered"):
        b.open("p", a.seal("p", b"x"))


def test_header_swap_detected():
    # an attacker rewriting the header fields (e.g. phase) is caught by the tag (header = AD)
    a, b = _pair()
    m = a.seal("aaaa", b"x")
    forged = m.replace(b"aaaa", b"bbbb", 1)
    with pytest.raises(IntegrityError, match="tampered"):
        b.open("bbbb", forged)


def test_truncated_and_malformed():
    a, b = _pair()
    m = a.seal("p", b"payload")
    for cut in (0, 1, 3, 10, len(m) - len(b"payload") - 16 - 1):
        with pytest.raises(ProtocolError) as exc:
            b.open("p", m[:cut])
        assert not isinstance(exc.value, IntegrityError)
    with pytest.raises(ProtocolError):
        b.open("p", b"\x02" + m[1:])  # unknown version
    with pytest.raises(ProtocolError):
        b.open("p", "not bytes")
    # cutting into the ciphertext/tag: fails authentication
    with pytest.raises(IntegrityError):
        b.open("p", m[:-1])


def test_max_message_bytes():
    a, b = _pair(max_message_bytes=200)
    a.seal("p", b"x" * 100)
    with pytest.raises(ProtocolError, match="max_message_bytes"):
        a.seal("p", b"x" * 300)
    big_a, _ = _pair()
    with pytest.raises(ProtocolError, match="max_message_bytes"):
        b.open("p", big_a.seal("p", b"x" * 300))


def test_bad_constructor_arguments():
    with pytest.raises(ProtocolError):
        Channel(b"short", job="j", me="a", peer="b")
    with pytest.raises(ProtocolError):
        Channel(KEY, job="j", me="a", peer="a")
    with pytest.raises(ProtocolError):
        Channel(KEY, job="", me="a", peer="b")


def test_state_export_import_continues():
    a, b = _pair()
    assert b.open("p", a.seal("p", b"1")) == b"1"
    assert a.open("p", b.seal("p", b"2")) == b"2"
    saved = json.loads(json.dumps(a.state()))
    assert KEY.hex() not in json.dumps(saved)
    a2 = Channel.from_state(KEY, saved)
    assert (a2.send_seq, a2.recv_seq) == (1, 1)
    assert b.open("p", a2.seal("p", b"3")) == b"3"
    assert a2.open("p", b.seal("p", b"4")) == b"4"


def test_state_rollback_fails_closed():
    a, b = _pair()
    saved = a.state()
    assert b.open("p", a.seal("p", b"1")) == b"1"
    stale = Channel.from_state(KEY, saved)
    with pytest.raises(IntegrityError, match="replay"):
        b.open("p", stale.seal("p", b"again"))


def test_state_with_wrong_key_or_garbage():
    a, _ = _pair()
    with pytest.raises(ProtocolError, match="does not belong"):
        Channel.from_state(bytes(32), a.state())
    bad = a.state()
    bad["send_seq"] = -1
    with pytest.raises(ProtocolError):
        Channel.from_state(KEY, bad)
    with pytest.raises(ProtocolError):
        Channel.from_state(KEY, {"version": 99})
    with pytest.raises(ProtocolError):
        Channel.from_state(KEY, {"version": 1})
