"""Pairwise key derivation (crypto.keys)."""

import hashlib

import pytest

from crypto.errors import ProtocolError
from crypto.keys import SiteKeyPair, pairwise_info, pairwise_key, pairwise_keys


def _kp(name: str) -> SiteKeyPair:
    return SiteKeyPair.from_private_bytes(hashlib.sha256(b"test-key/" + name.encode()).digest())


def _key(a, b, **over):
    args = dict(job="job-1", purpose="row-sums", attempt=0)
    args.update(over)
    return pairwise_key(_kp(a), _kp(b).public_bytes(), me=a, peer=b, **args)


def test_generate_and_persist():
    kp = SiteKeyPair.generate()
    assert len(kp.public_bytes()) == 32
    again = SiteKeyPair.from_private_bytes(kp.private_bytes())
    assert again.public_bytes() == kp.public_bytes()
    assert kp.private_bytes().hex() not in repr(kp)


def test_agree_both_ways():
    k_ab = _key("alice", "bob")
    k_ba = _key("bob", "alice")
    assert k_ab == k_ba and len(k_ab) == 32
    assert len(_key("alice", "bob", length=16)) == 16


def test_fresh_generated_pairs_agree():
    a, b = SiteKeyPair.generate(), SiteKeyPair.generate()
    kw = dict(job="j", purpose="channel", attempt=3)
    assert pairwise_key(a, b.public_bytes(), me="a", peer="b", **kw) == pairwise_key(
        b, a.public_bytes(), me="b", peer="a", **kw
    )


@pytest.mark.parametrize(
    "change",
    [dict(job="job-2"), dict(purpose="channel"), dict(attempt=1), dict(peer="carol")],
)
def test_differs_when_context_differs(change):
    base = _key("alice", "bob")
    peer = change.pop("peer", "bob")
    assert _key("alice", peer, **change) != base


def test_info_is_unambiguous():
    pk1, pk2 = _kp("x").public_bytes(), _kp("y").public_bytes()
    i1 = pairwise_info(job="ab", purpose="c", attempt=0, me="s1", peer="s2", me_public=pk1, peer_public=pk2)
    i2 = pairwise_info(job="a", purpose="bc", attempt=0, me="s1", peer="s2", me_public=pk1, peer_public=pk2)
    assert i1 != i2
    # canonical order: swapping the roles gives the same info
    i3 = pairwise_info(job="ab", purpose="c", attempt=0, me="s2", peer="s1", me_public=pk2, peer_public=pk1)
    assert i1 == i3


def test_pairwise_keys_dict():
    names = ["s1", "s2", "s3"]
    pubs = {n: _kp(n).public_bytes() for n in names}
    keys = pairwise_keys(_kp("s1"), pubs, job="j", purpose="p", attempt=0, me="s1")
    assert set(keys) == {"s2", "s3"}
    assert keys["s2"] == pairwise_keys(_kp("s2"), pubs, job="j", purpose="p", attempt=0, me="s2")["s1"]


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), b"\x01" * 64])
def test_wrong_length_public_key(bad):
    with pytest.raises(ProtocolError):
        pairwise_key(_kp("a"), bad, job="j", purpose="p", attempt=0, me="a", peer="b")


LOW_ORDER_POINTS = [
    bytes(32),  # 0
    (1).to_bytes(32, "little"),  # 1
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),  # order 8
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),  # order 8
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),  # p - 1
]


@pytest.mark.parametrize("point", LOW_ORDER_POINTS)
def test_low_order_point_rejected(point):
    with pytest.raises(ProtocolError):
        pairwise_key(_kp("a"), point, job="j", purpose="p", attempt=0, me="a", peer="b")


def test_bad_parameters():
    pub = _kp("b").public_bytes()
    for kw in (
        dict(me="a", peer="a"),
        dict(me="", peer="b"),
        dict(me="a", peer="b", attempt=-1),
        dict(me="a", peer="b", attempt=True),
        dict(me="a", peer="b", length=8),
    ):
        args = dict(job="j", purpose="p", attempt=0)
        args.update(kw)
        with pytest.raises(ProtocolError):
            pairwise_key(_kp("a"), pub, **args)
    with pytest.raises(ProtocolError):
        SiteKeyPair.from_private_bytes(b"short")
