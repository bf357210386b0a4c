"""Tests for crypto.paillier_hamming: correctness, share uniformity, and input validation.

1024-bit keys (insecure_test_key_bits=True) keep the tests fast; the protocols refuse such keys
without that flag (tested below). No test has a wall-clock threshold.
"""

import struct

import numpy as np
import pytest
from phe import paillier
from scipy import stats

from crypto.errors import ProtocolError
from crypto.hamming_api import PairTranscript, plaintext_hamming, run_pair
from crypto.paillier_hamming import PaillierHamming, PaillierNaiveHamming

TEST_BITS = 1024


@pytest.fixture(scope="module")
def keypair():
    return paillier.generate_paillier_keypair(n_length=TEST_BITS)


@pytest.fixture(scope="module")
def keypair2():
    return paillier.generate_paillier_keypair(n_length=TEST_BITS)


class WithKey:
    """Wrap a protocol so that party_a reuses a fixed keypair (what a site does within a job)."""

    def __init__(self, proto, keypair):
        self.proto = proto
        self.keypair = keypair
        self.name = proto.name

    def party_a(self, bits, n_bits):
        return self.proto.party_a(bits, n_bits, keypair=self.keypair)

    def party_b(self, bits, n_bits):
        return self.proto.party_b(bits, n_bits)

    def combine(self, *args):
        return self.proto.combine(*args)


def packed(threads=2, **kw):
    return PaillierHamming(TEST_BITS, threads=threads, insecure_test_key_bits=True, **kw)


def naive(**kw):
    return PaillierNaiveHamming(TEST_BITS, insecure_test_key_bits=True, **kw)


def rand_bits(rng, n, L):
    return np.packbits(rng.integers(0, 2, (n, L), dtype=np.uint8), axis=1)


def run_manual(proto, bits_a, bits_b, L, keypair):
    """Run one pair by hand; return (share_a, share_b, msg_a_to_b, msg_b_to_a, parties)."""
    a = proto.party_a(bits_a, L, keypair=keypair)
    b = proto.party_b(bits_b, L)
    m1 = a.receive(None)
    assert m1.to_server is None and not m1.done
    o = b.receive(m1.to_peer)
    assert o.done and o.to_server is not None
    o2 = a.receive(o.to_peer)
    assert o2.done and o2.to_peer is None
    return o2.to_server, o.to_server, m1.to_peer, o.to_peer, (a, b)


# ------------------------------------------------------------------------------- correctness

CASES = [
    (1, 3, 2),  # L = 1
    (13, 5, 7),  # L not a multiple of 8
    (8, 1, 4),  # n_a = 1
    (20, 4, 1),  # n_b = 1
    (70, 6, 5),
]


@pytest.mark.parametrize("make", [packed, naive], ids=["paillier", "paillier-naive"])
@pytest.mark.parametrize("L,n_a,n_b", CASES)
def test_matches_plaintext(make, L, n_a, n_b, keypair):
    rng = np.random.default_rng(L * 1000 + n_a * 10 + n_b)
    a, b = rand_bits(rng, n_a, L), rand_bits(rng, n_b, L)
    H = run_pair(WithKey(make(), keypair), a, b, L)
    assert H.shape == (n_a, n_b)
    np.testing.assert_array_equal(H, plaintext_hamming(a, b))


@pytest.mark.parametrize("make", [packed, naive], ids=["paillier", "paillier-naive"])
@pytest.mark.parametrize("L", [1, 11, 32])
def test_identical_and_complementary(make, L, keypair):
    rng = np.random.default_rng(L)
    raw = rng.integers(0, 2, (3, L), dtype=np.uint8)
    raw[0] = 0  # all zeros
    raw[1] = 1  # all ones
    a = np.packbits(raw, axis=1)
    b = np.packbits(np.concatenate([raw, 1 - raw]), axis=1)
    H = run_pair(WithKey(make(), keypair), a, b, L)
    np.testing.assert_array_equal(H, plaintext_hamming(a, b))
    for i in range(3):
        assert H[i, i] == 0
        assert H[i, 3 + i] == L


@pytest.mark.parametrize("threads", [1, 2])
def test_packed_more_vectors_than_slots(threads, keypair):
    L = 16
    proto = packed(threads=threads)
    a_party = proto.party_a(np.zeros((1, 2), np.uint8), L, keypair=keypair)
    slots = a_party.slots
    n_a = 2 * slots + 3  # three groups, the last one partial
    rng = np.random.default_rng(7)
    a, b = rand_bits(rng, n_a, L), rand_bits(rng, 9, L)
    t = PairTranscript()
    H = run_pair(WithKey(proto, keypair), a, b, L, transcript=t)
    np.testing.assert_array_equal(H, plaintext_hamming(a, b))
    cw = 2 * TEST_BITS // 8
    assert t.b_to_a > 3 * 9 * cw  # one result ciphertext per (group, vector of B)
    assert t.a_to_server == t.b_to_server


def test_packed_larger_random(keypair):
    rng = np.random.default_rng(99)
    L = 200
    a, b = rand_bits(rng, 70, L), rand_bits(rng, 33, L)
    H = run_pair(WithKey(packed(), keypair), a, b, L)
    np.testing.assert_array_equal(H, plaintext_hamming(a, b))


def test_fresh_key_without_keypair():
    rng = np.random.default_rng(5)
    a, b = rand_bits(rng, 3, 10), rand_bits(rng, 4, 10)
    H = run_pair(packed(), a, b, 10)
    np.testing.assert_array_equal(H, plaintext_hamming(a, b))


def test_key_reuse_across_pairs(keypair):
    proto = packed()
    rng = np.random.default_rng(6)
    a = rand_bits(rng, 4, 24)
    for _ in range(3):
        b = rand_bits(rng, 5, 24)
        np.testing.assert_array_equal(run_pair(WithKey(proto, keypair), a, b, 24), plaintext_hamming(a, b))


# ------------------------------------------------------------------------------- server's view

P_MIN = 1e-4


def low_byte_pvalue(values):
    counts = np.bincount(np.asarray(values, dtype=np.int64) & 0xFF, minlength=256)
    return stats.chisquare(counts).pvalue


def test_packed_server_shares_uniform_and_fresh(keypair):
    proto = packed()
    rng = np.random.default_rng(11)
    L = 64
    n_a, n_b = 30, 40
    a, b = rand_bits(rng, n_a, L), rand_bits(rng, n_b, L)
    w = proto.party_a(a, L, keypair=keypair).w
    runs = []
    for _ in range(4):
        sa, sb, *_ = run_manual(proto, a, b, L, keypair)
        np.testing.assert_array_equal(proto.combine(sa, sb, n_a, n_b, L), plaintext_hamming(a, b))
        hdr = len(sb) - n_a * n_b * 8
        v = np.frombuffer(sb[hdr:], dtype=">u8")
        u = np.frombuffer(sa[hdr:], dtype=">u8")
        runs.append((u, v))
    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            assert not np.array_equal(runs[i][1], runs[j][1])  # new masks every run
            assert not np.array_equal(runs[i][0], runs[j][0])
    # Both shares are uniform on [0, 2^w): B's is ρ, A's is ρ + h + carry mod 2^w.
    for k in (0, 1):
        values = np.concatenate([r[k] for r in runs]).astype(np.int64)
        assert values.max() < 1 << w
        counts = np.bincount(values, minlength=1 << w)
        assert stats.chisquare(counts).pvalue > P_MIN


def test_naive_server_shares_uniform_and_fresh(keypair):
    proto = naive()
    rng = np.random.default_rng(12)
    L = 3
    a, b = rand_bits(rng, 30, L), rand_bits(rng, 40, L)
    n = keypair[0].n
    kb = (n.bit_length() + 7) // 8
    runs = []
    for _ in range(2):
        sa, sb, *_ = run_manual(proto, a, b, L, keypair)
        body = sb[len(sb) - 1200 * kb:]
        R = [int.from_bytes(body[i * kb:(i + 1) * kb], "big") for i in range(1200)]
        runs.append(R)
    assert all(x != y for x, y in zip(runs[0], runs[1]))
    allR = runs[0] + runs[1]
    assert low_byte_pvalue([r & 0xFF for r in allR]) > P_MIN
    assert stats.kstest(np.array([r / n for r in allR]), "uniform").pvalue > P_MIN


# ------------------------------------------------------------------------------- validation

HDR = 7  # magic(4) version(1) protocol(1) type(1)
KEYS = struct.Struct(">16sHIIBBHI")
RESULT = struct.Struct(">16sIIII")


def setup_pair(proto, keypair, L=12, n_a=3, n_b=4, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rand_bits(rng, n_a, L), rand_bits(rng, n_b, L)
    pa = proto.party_a(a, L, keypair=keypair)
    m1 = pa.receive(None).to_peer
    return a, b, pa, m1


def keys_patch(m1, **fields):
    names = ["session", "key_bits", "L", "n_a", "sigma", "w", "slots", "n_groups"]
    vals = dict(zip(names, KEYS.unpack_from(m1, HDR)))
    vals.update(fields)
    return m1[:HDR] + KEYS.pack(*[vals[k] for k in names]) + m1[HDR + KEYS.size:]


def set_ct(msg, offset, index, value, width):
    start = offset + index * width
    return msg[:start] + value.to_bytes(width, "big") + msg[start + width:]


@pytest.fixture(params=["paillier", "paillier-naive"])
def proto(request):
    return packed() if request.param == "paillier" else naive()


def ct_offset(proto, key_bits):
    """Offset of the first per-bit ciphertext in A's key message."""
    kb, cw = (key_bits + 7) // 8, (2 * key_bits + 7) // 8
    return HDR + KEYS.size + kb + (cw if proto.name == "paillier" else 0)


@pytest.mark.parametrize("mutate,match", [
    (lambda m: b"XXXX" + m[4:], "magic"),
    (lambda m: m[:4] + bytes([9]) + m[5:], "version"),
    (lambda m: m[:6] + bytes([2]) + m[7:], "type"),
    (lambda m: m[:5], "truncated"),
    (lambda m: m[:-1], "truncated"),
    (lambda m: m + b"\0", "oversized"),
    (lambda m: "not bytes", "expected bytes"),
])
def test_bad_key_message(proto, keypair, mutate, match):
    a, b, pa, m1 = setup_pair(proto, keypair)
    with pytest.raises(ProtocolError, match=match):
        proto.party_b(b, 12).receive(mutate(m1))


def test_wrong_protocol_id(keypair):
    _, b, _, m1 = setup_pair(packed(), keypair)
    with pytest.raises(ProtocolError, match="protocol id"):
        naive().party_b(b, 12).receive(m1)


def test_mismatched_L(proto, keypair):
    a, b, pa, m1 = setup_pair(proto, keypair, L=12)
    with pytest.raises(ProtocolError, match="mismatched L"):
        proto.party_b(np.zeros((2, 2), np.uint8), 13).receive(m1)


def test_declared_counts_checked(proto, keypair):
    _, b, _, m1 = setup_pair(proto, keypair)
    for patch in ({"n_a": 1000}, {"n_a": 0}, {"n_groups": 2}, {"slots": 3}, {"w": 60}):
        with pytest.raises(ProtocolError):
            proto.party_b(b, 12).receive(keys_patch(m1, **patch))
    # A count that still fits the declared sizes is caught by A when B's answer comes back.
    a2, b2, pa2, m2 = setup_pair(proto, keypair, n_a=3)
    if proto.name == "paillier":
        o = proto.party_b(b2, 12).receive(keys_patch(m2, n_a=4))
        with pytest.raises(ProtocolError, match="vectors"):
            pa2.receive(o.to_peer)


def test_small_key_refused_without_flag(keypair):
    with pytest.raises(ProtocolError, match="below the minimum"):
        PaillierHamming(1024)
    with pytest.raises(ProtocolError, match="below the minimum"):
        PaillierNaiveHamming(1024)
    secure_b = PaillierHamming(2048)
    rng = np.random.default_rng(1)
    with pytest.raises(ProtocolError, match="below the minimum"):
        secure_b.party_a(rand_bits(rng, 2, 8), 8, keypair=keypair)
    _, b, _, m1 = setup_pair(packed(), keypair, L=8)
    with pytest.raises(ProtocolError, match="below the minimum"):
        secure_b.party_b(b, 8).receive(m1)
    for p in (secure_b, PaillierNaiveHamming()):
        with pytest.raises(ProtocolError, match="below the minimum"):
            p.party_b(b, 8).receive(keys_patch(m1, key_bits=TEST_BITS) if p is secure_b else
                                    m1[:5] + bytes([1]) + m1[6:])


def test_bad_keypair():
    with pytest.raises(ProtocolError, match="keypair"):
        packed().party_a(np.zeros((1, 1), np.uint8), 8, keypair="nope")


def test_bad_public_modulus(proto, keypair):
    _, b, _, m1 = setup_pair(proto, keypair)
    off = HDR + KEYS.size
    kb = TEST_BITS // 8
    even = m1[:off] + (keypair[0].n - 1).to_bytes(kb, "big") + m1[off + kb:]
    with pytest.raises(ProtocolError, match="modulus"):
        proto.party_b(b, 12).receive(even)


@pytest.mark.parametrize("which", ["zero", "too_big", "not_coprime"])
def test_bad_ciphertext_from_a(proto, keypair, which):
    _, b, _, m1 = setup_pair(proto, keypair)
    n = keypair[0].n
    value = {"zero": 0, "too_big": n * n, "not_coprime": keypair[1].p * 7}[which]
    cw = 2 * TEST_BITS // 8
    bad = set_ct(m1, ct_offset(proto, TEST_BITS), 2, value, cw)
    with pytest.raises(ProtocolError, match="ciphertext"):
        proto.party_b(b, 12).receive(bad)
    if proto.name == "paillier":  # h_s too
        bad = set_ct(m1, HDR + KEYS.size + TEST_BITS // 8, 0, value, cw)
        with pytest.raises(ProtocolError, match="h_s"):
            proto.party_b(b, 12).receive(bad)


def test_max_bytes_guard(keypair):
    for p in (packed(max_message_bytes=500), naive(max_message_bytes=500)):
        _, b, _, m1 = setup_pair(p, keypair)
        with pytest.raises(ProtocolError, match="cap"):
            p.party_b(b, 12).receive(m1)


def b_response(proto, keypair):
    a, b, pa, m1 = setup_pair(proto, keypair)
    o = proto.party_b(b, 12).receive(m1)
    return a, b, pa, o


@pytest.mark.parametrize("mutate,match", [
    (lambda m: m[:-1], "truncated"),
    (lambda m: m + b"\0", "oversized"),
    (lambda m: m[:6] + bytes([1]) + m[7:], "type"),
    (lambda m: m[:HDR] + bytes(16) + m[HDR + 16:], "session"),
    (lambda m: m[:HDR + 16] + struct.pack(">I", 13) + m[HDR + 20:], "L = 13"),
    (lambda m: m[:HDR + 20] + struct.pack(">I", 4) + m[HDR + 24:], "vectors"),
])
def test_bad_result_message(proto, keypair, mutate, match):
    _, _, pa, o = b_response(proto, keypair)
    with pytest.raises(ProtocolError, match=match):
        pa.receive(mutate(o.to_peer))


@pytest.mark.parametrize("which", ["zero", "too_big", "not_coprime"])
def test_bad_ciphertext_from_b(proto, keypair, which):
    _, _, pa, o = b_response(proto, keypair)
    n = keypair[0].n
    value = {"zero": 0, "too_big": n * n + 1, "not_coprime": keypair[1].q}[which]
    bad = set_ct(o.to_peer, HDR + RESULT.size, 1, value, 2 * TEST_BITS // 8)
    with pytest.raises(ProtocolError, match="ciphertext"):
        pa.receive(bad)


def test_packed_result_with_bits_above_slots(keypair):
    proto = packed()
    _, _, pa, o = b_response(proto, keypair)
    n = keypair[0].n
    forged = pow(n + 1, n - 1, n * n)  # a valid encryption of N - 1 (randomness 1): overflows every slot
    bad = set_ct(o.to_peer, HDR + RESULT.size, 0, forged, 2 * TEST_BITS // 8)
    with pytest.raises(ProtocolError, match="above"):
        pa.receive(bad)


def test_state_machine_misuse(proto, keypair):
    a, b, pa, o = b_response(proto, keypair)
    with pytest.raises(ProtocolError):
        proto.party_a(a, 12, keypair=keypair).receive(b"hello")  # A speaks first
    with pytest.raises(ProtocolError):
        proto.party_b(b, 12).receive(None)
    pa.receive(o.to_peer)
    with pytest.raises(ProtocolError, match="done"):
        pa.receive(o.to_peer)


def test_bad_shares(proto, keypair):
    rng = np.random.default_rng(3)
    L = 12
    a, b = rand_bits(rng, 3, L), rand_bits(rng, 4, L)
    sa, sb, *_ = run_manual(proto, a, b, L, keypair)
    np.testing.assert_array_equal(proto.combine(sa, sb, 3, 4, L), plaintext_hamming(a, b))
    with pytest.raises(ProtocolError, match="truncated"):
        proto.combine(sa[:-1], sb, 3, 4, L)
    with pytest.raises(ProtocolError, match="oversized"):
        proto.combine(sa, sb + b"\0", 3, 4, L)
    with pytest.raises(ProtocolError, match="vectors"):
        proto.combine(sa, sb, 4, 4, L)
    with pytest.raises(ProtocolError, match="L ="):
        proto.combine(sa, sb, 3, 4, L + 1)
    with pytest.raises(ProtocolError, match="type"):
        proto.combine(sb, sa, 3, 4, L)  # swapped roles
    sa2, sb2, *_ = run_manual(proto, a, b, L, keypair)
    with pytest.raises(ProtocolError, match="different protocol runs"):
        proto.combine(sa, sb2, 3, 4, L)
    # A corrupted value gives an error, never a wrong distance.
    corrupt = sa[:-1] + bytes([sa[-1] ^ 0x40])
    with pytest.raises(ProtocolError, match="distance|range"):
        proto.combine(corrupt, sb, 3, 4, L)


def test_bad_bits():
    with pytest.raises(ProtocolError):
        packed().party_b(np.zeros((2, 3), np.uint8), 8)
    with pytest.raises(ProtocolError):
        packed().party_b(np.full((2, 1), 1, np.uint8), 7)  # padding bit set
