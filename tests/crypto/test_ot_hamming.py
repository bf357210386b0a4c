"""SHADE over IKNP OT extension (crypto.ot_hamming): exactness, share distribution, validation."""

import struct

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.hamming_api import PairTranscript, plaintext_hamming, run_pair
from crypto.ot_hamming import MAGIC, VERSION, OTHamming, _decode_share

# chi-square critical values at p = 1e-4 (scipy.stats.chi2.isf(1e-4, df)), fixed here
CHI2_CRIT_1E4 = {11: 37.367, 16: 45.925}


def _bits(rng, n, L):
    return np.packbits(rng.integers(0, 2, (n, L), dtype=np.uint8), axis=1)


def _run(proto, a, b, L):
    t = PairTranscript()
    return run_pair(proto, a, b, L, t), t


def _drive(proto, a, b, L):
    """Run the parties by hand; return (share_a, share_b, list of (sender, message))."""
    pa, pb = proto.party_a(a, L), proto.party_b(b, L)
    shares, msgs, msg = {}, [], None
    for turn in range(200):
        who, party = (("a", pa), ("b", pb))[turn % 2]
        out = party.receive(msg)
        if out.to_server is not None:
            shares[who] = out.to_server
        msg = out.to_peer
        if msg is not None:
            msgs.append((who, msg))
        if pa.stage == "done" and pb.stage == "done":
            break
    return shares["a"], shares["b"], msgs


@pytest.mark.parametrize(
    "L,n_a,n_b",
    [(1, 1, 1), (1, 5, 3), (7, 4, 6), (8, 3, 3), (9, 5, 2), (63, 11, 7), (256, 24, 24), (300, 17, 5)],
)
def test_matches_plaintext_on_random_inputs(rng, L, n_a, n_b):
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    H, t = _run(OTHamming(), a, b, L)
    assert H.dtype == np.int32 and H.shape == (n_a, n_b)
    assert np.array_equal(H, plaintext_hamming(a, b))
    assert t.a_to_server > 0 and t.b_to_server > 0


@pytest.mark.parametrize("chunk,block_values", [(1, 1 << 17), (2, 1 << 17), (3, 7), (4, 100), (5, 1000)])
def test_several_chunks_and_blocks(rng, chunk, block_values):
    L, n_a, n_b = 37, 9, 11
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    for threads in (1, 2):
        proto = OTHamming(chunk, block_values=block_values, threads=threads)
        H, t = _run(proto, a, b, L)
        assert np.array_equal(H, plaintext_hamming(a, b))
        assert len(t.messages) == 3 + 2 * -(-n_b // chunk)


def test_identical_and_complementary_vectors(rng):
    for L in (1, 10, 64, 129):
        x = rng.integers(0, 2, (6, L), dtype=np.uint8)
        a = np.packbits(x, axis=1)
        comp = np.packbits(1 - x, axis=1)
        H = run_pair(OTHamming(), a, a, L)
        assert np.all(np.diag(H) == 0)
        assert np.array_equal(H, plaintext_hamming(a, a))
        H2 = run_pair(OTHamming(), a, comp, L)
        assert np.all(np.diag(H2) == L)
        zeros = np.zeros((1, (L + 7) // 8), np.uint8)
        ones = np.packbits(np.ones((1, L), np.uint8), axis=1)
        assert run_pair(OTHamming(), zeros, ones, L)[0, 0] == L
        assert run_pair(OTHamming(), ones, ones, L)[0, 0] == 0


def test_automatic_chunking_fits_run_pair(rng):
    L, n_a, n_b = 16, 3, 200
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    proto = OTHamming(target_message_bytes=64)  # tiny target: the message limit decides the chunk
    H, t = _run(proto, a, b, L)
    assert np.array_equal(H, plaintext_hamming(a, b))
    assert len(t.messages) <= 64


def _share_values(share, L, n_a, n_b, t):
    from crypto.ot_hamming import T_SHARE_A, T_SHARE_B

    return _decode_share(share, T_SHARE_A if t == "a" else T_SHARE_B, n_a, n_b, L, 1 << 30)[1]


def test_server_share_r_is_uniform_and_fresh(rng):
    L, n_a, n_b = 11, 60, 50  # q = 12, 3000 values per run
    q = L + 1
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    proto = OTHamming()
    runs = []
    for _ in range(3):
        sa, sb, _ = _drive(proto, a, b, L)
        r = _share_values(sa, L, n_a, n_b, "a")
        t = _share_values(sb, L, n_a, n_b, "b")
        assert np.array_equal(H := (t.astype(int) - r.astype(int)) % q, plaintext_hamming(a, b))
        assert H.max() <= L
        runs.append(r)
    for vals in (runs[0], np.concatenate([r.ravel() for r in runs])):
        counts = np.bincount(vals.ravel(), minlength=q)
        assert counts.size == q
        expected = vals.size / q
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < CHI2_CRIT_1E4[q - 1], chi2
    # same inputs, different runs: R changes (equal in fewer than ~1/q of the places by chance)
    assert np.mean(runs[0] == runs[1]) < 0.2
    assert np.mean(runs[1] == runs[2]) < 0.2


def test_shares_of_all_zero_inputs_still_uniform():
    L, n_a, n_b = 16, 40, 40  # q = 17
    a = np.zeros((n_a, 2), np.uint8)
    b = np.zeros((n_b, 2), np.uint8)
    sa, sb, _ = _drive(OTHamming(), a, b, L)
    r = _share_values(sa, L, n_a, n_b, "a")
    t = _share_values(sb, L, n_a, n_b, "b")
    assert np.array_equal(r, t)  # h = 0 everywhere
    counts = np.bincount(r.ravel(), minlength=17)
    chi2 = float(((counts - r.size / 17) ** 2 / (r.size / 17)).sum())
    assert chi2 < CHI2_CRIT_1E4[16]


# ----------------------------------------------------------------------------- validation


def _corrupt_cases():
    def set_byte(pos, val):
        return lambda m: m[:pos] + bytes([val]) + m[pos + 1 :]

    return {
        "truncated-header": lambda m: m[:3],
        "truncated-body": lambda m: m[:-1],
        "trailing-byte": lambda m: m + b"\x00",
        "bad-magic": set_byte(0, ord("Y")),
        "bad-version": set_byte(4, VERSION + 1),
        "bad-type": set_byte(5, 99),
        "wrong-known-type": set_byte(5, 6),
        "empty": lambda m: b"",
        "none": lambda m: None,
        "not-bytes": lambda m: [1, 2, 3],
    }


def _produce(proto, a, b, L, upto):
    pa, pb = proto.party_a(a, L), proto.party_b(b, L)
    msgs = [pa.receive(None).to_peer]
    turn = 1
    while len(msgs) <= upto:
        party = (pa, pb)[turn % 2]
        msgs.append(party.receive(msgs[-1]).to_peer)
        turn += 1
    return pa, pb, msgs


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("case", list(_corrupt_cases()))
def test_malformed_messages_raise(rng, index, case):
    """Every peer message (HELLO, BASE1, BASE2, EXT, CORR, EXT, CORR), corrupted, is refused."""
    L = 12
    a, b = _bits(rng, 3, L), _bits(rng, 4, L)
    pa, pb, msgs = _produce(OTHamming(2), a, b, L, index)
    receiver = pb if index % 2 == 0 else pa
    with pytest.raises(ProtocolError):
        receiver.receive(_corrupt_cases()[case](msgs[index]))


def test_wrong_l_and_oversized_and_bad_points(rng):
    L = 12
    a, b = _bits(rng, 3, L), _bits(rng, 4, L)
    proto = OTHamming(2)
    # HELLO for another L
    pa, _, msgs = _produce(proto, a, b, L, 0)
    hello = bytearray(msgs[0])
    struct.pack_into(">I", hello, 6 + 16, L + 1)
    with pytest.raises(ProtocolError, match="L ="):
        proto.party_b(b, L).receive(bytes(hello))
    # B built for another L
    with pytest.raises(ProtocolError):
        proto.party_b(_bits(rng, 4, 13), 13).receive(msgs[0])
    # oversized
    small = OTHamming(2, max_message_bytes=20)
    with pytest.raises(ProtocolError, match="exceeds"):
        small.party_b(b, L).receive(msgs[0])
    # invalid curve point in BASE1 (B's Chou-Orlandi point) and BASE2 (A's points)
    pa, pb, msgs = _produce(proto, a, b, L, 2)
    base1 = msgs[1]
    for bad in (b"\x01" + b"\x00" * 31, b"\xff" * 31 + b"\x7f", b"\x02" + b"\x00" * 31):
        pa2, _, m2 = _produce(proto, a, b, L, 1)
        with pytest.raises(ProtocolError, match="point|identity"):
            pa2.receive(m2[1][:-32] + bad)
    assert base1[:4] == MAGIC
    base2 = bytearray(msgs[2])
    base2[6 + 5 * 32 : 6 + 6 * 32] = b"\x01" + b"\x00" * 31
    _, pb3, m3 = _produce(proto, a, b, L, 1)
    with pytest.raises(ProtocolError, match="point"):
        pb3.receive(bytes(base2))


def test_bad_counts_chunks_and_values(rng):
    L = 12
    a, b = _bits(rng, 3, L), _bits(rng, 4, L)
    proto = OTHamming(2)
    # BASE1 with chunk > n_b, n_b = 0
    for n_b, chunk in ((4, 5), (0, 1), (4, 0)):
        pa, _, msgs = _produce(proto, a, b, L, 1)
        m = bytearray(msgs[1])
        struct.pack_into(">II", m, 6, n_b, chunk)
        with pytest.raises(ProtocolError):
            pa.receive(bytes(m))
    # EXT with a wrong chunk index / count
    for off, val in ((6, 1), (10, 3)):
        pa, _, msgs = _produce(proto, a, b, L, 3)
        m = bytearray(msgs[3])
        struct.pack_into(">I", m, off, val)
        with pytest.raises(ProtocolError, match="chunk"):
            pa.receive(bytes(m))
    # CORR with a value outside Z_q, and with a wrong chunk index
    _, pb, msgs = _produce(proto, a, b, L, 4)
    m = bytearray(msgs[4])
    m[-1] = L + 1
    with pytest.raises(ProtocolError, match="outside"):
        pb.receive(bytes(m))
    _, pb, msgs = _produce(proto, a, b, L, 4)
    m = bytearray(msgs[4])
    struct.pack_into(">I", m, 6, 1)
    with pytest.raises(ProtocolError):
        pb.receive(bytes(m))
    # a failed party stays failed; a finished party accepts nothing more
    with pytest.raises(ProtocolError):
        pb.receive(msgs[4])
    pa = proto.party_a(a, L)
    pa.receive(None)
    with pytest.raises(ProtocolError):
        pa.receive(None)
    with pytest.raises(ProtocolError):
        proto.party_a(a, L).receive(b"hello")


def test_session_id_binding(rng):
    L = 12
    a, b = _bits(rng, 2, L), _bits(rng, 2, L)
    H = run_pair(OTHamming(session_id=b"job1/0-1/attempt0"), a, b, L)
    assert np.array_equal(H, plaintext_hamming(a, b))
    hello = OTHamming(session_id=b"job1").party_a(a, L).receive(None).to_peer
    with pytest.raises(ProtocolError, match="session"):
        OTHamming(session_id=b"job2").party_b(b, L).receive(hello)


def test_combine_validates_shares(rng):
    L, n_a, n_b = 12, 3, 4
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    proto = OTHamming(2)
    sa, sb, _ = _drive(proto, a, b, L)
    assert np.array_equal(proto.combine(sa, sb, n_a, n_b, L), plaintext_hamming(a, b))
    sa2, sb2, _ = _drive(proto, a, b, L)
    with pytest.raises(ProtocolError, match="sessions"):
        proto.combine(sa, sb2, n_a, n_b, L)
    with pytest.raises(ProtocolError):
        proto.combine(sb, sa, n_a, n_b, L)  # swapped types
    with pytest.raises(ProtocolError, match="L ="):
        proto.combine(sa, sb, n_a, n_b, L + 1)
    with pytest.raises(ProtocolError):
        proto.combine(sa, sb, n_a + 1, n_b, L)
    with pytest.raises(ProtocolError):
        proto.combine(sa[:-1], sb, n_a, n_b, L)
    with pytest.raises(ProtocolError):
        proto.combine(sa, sb + b"\x00", n_a, n_b, L)
    bad = bytearray(sa)
    bad[-1] = L + 1
    with pytest.raises(ProtocolError, match="outside"):
        proto.combine(bytes(bad), sb, n_a, n_b, L)
    with pytest.raises(ProtocolError, match="exceeds"):
        OTHamming(max_message_bytes=10).combine(sa, sb, n_a, n_b, L)


def test_rejects_bad_inputs(rng):
    proto = OTHamming()
    with pytest.raises(ProtocolError):
        proto.party_a(np.zeros((2, 2), np.int64), 12)
    with pytest.raises(ProtocolError):
        proto.party_a(np.full((2, 2), 0xFF, np.uint8), 12)  # padding bits set
    with pytest.raises(ProtocolError):
        proto.party_b(np.zeros((0, 2), np.uint8), 12)  # no vectors
    with pytest.raises(ProtocolError):
        OTHamming(chunk_vectors=0)


# ----------------------------------------------------------------------------- packed CORR values


@pytest.mark.parametrize("L,n_a,n_b,chunk,block_values", [
    (256, 7, 5, 2, 1000),   # 9 bits per value, blocks that split vectors at odd value offsets
    (300, 3, 4, None, 7),   # tiny blocks: every block starts mid-byte in the bit plane
    (1000, 5, 3, 1, 1 << 17),  # 10 bits
    (2047, 2, 3, 2, 333),   # 11 bits
    (65535, 1, 2, None, 1 << 15),  # 16 bits: eight bit planes
])
def test_packed_values_exact(rng, L, n_a, n_b, chunk, block_values):
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    for threads in (1, 2):
        H, t = _run(OTHamming(chunk, block_values=block_values, threads=threads), a, b, L)
        assert np.array_equal(H, plaintext_hamming(a, b))


def test_packed_corr_size_and_malformed(rng):
    L, n_a, n_b = 300, 3, 5  # q = 301: 9 bits per value, one bit plane; m = 5·300·3 values in one CORR
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    proto = OTHamming()
    _, pb, msgs = _produce(proto, a, b, L, 4)
    m = n_b * L * n_a
    corr = msgs[4]
    assert len(corr) == 6 + 8 + m + -(-m // 8)  # header, chunk header, low bytes, one bit plane
    # a value of 301 or more: low byte 0xFF with the high bit set
    planes_at = 6 + 8 + m
    bad = bytearray(corr)
    bad[6 + 8] = 0xFF
    bad[planes_at] |= 1
    with pytest.raises(ProtocolError, match="outside"):
        pb.receive(bytes(bad))
    # truncated bit plane / extra byte
    for bad in (corr[:-1], corr + b"\x00"):
        _, pb, _ = _produce(proto, a, b, L, 3)
        with pytest.raises(ProtocolError, match="CORR body"):
            pb.receive(bad)


def test_packed_corr_padding_bits_refused(rng):
    L, n_a, n_b = 300, 1, 1  # m = 300 values: the plane's last byte has 4 padding bits
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    proto = OTHamming()
    _, pb, msgs = _produce(proto, a, b, L, 4)
    bad = bytearray(msgs[4])
    bad[-1] |= 0x80
    with pytest.raises(ProtocolError, match="padding"):
        pb.receive(bytes(bad))


def _sparse_corr(rng, L=256, n_a=40, n_b=30):
    """A CORR at L = 256 (q = 257: the positions of the values equal to 256) and B ready for it."""
    a, b = _bits(rng, n_a, L), _bits(rng, n_b, L)
    _, pb, msgs = _produce(OTHamming(), a, b, L, 4)
    m = n_b * L * n_a
    (count,) = struct.unpack_from(">I", msgs[4], 14 + m)
    spots = np.frombuffer(msgs[4], "<u4", offset=18 + m)
    return pb, msgs[4], m, count, spots, (a, b, L)


def test_sparse_corr_size_and_malformed(rng):
    pb, corr, m, count, spots, (a, b, L) = _sparse_corr(rng)
    assert len(corr) == 6 + 8 + m + 4 + 4 * count and count == spots.size
    assert 0 < count < 3 * m / 257  # about m / 257 values equal 256
    assert np.all(np.diff(spots.astype(np.int64)) > 0) and spots[-1] < m
    low = np.frombuffer(corr, np.uint8, offset=14, count=m)
    assert np.all(low[spots] == 0)  # 256 + low < 257

    def fresh():
        return _produce(OTHamming(), a, b, L, 3)[1]

    cases = {
        "value 257": lambda c: c[:14 + int(spots[0])] + b"\x01" + c[15 + int(spots[0]):],
        "out of order": lambda c: c[:18 + m] + spots[::-1].astype("<u4").tobytes(),
        "duplicate": lambda c: c[:18 + m] + np.concatenate([spots[:1], spots[:-1]]).astype("<u4").tobytes(),
        "out of range": lambda c: c[:-4] + struct.pack("<I", m),
        "count too large": lambda c: c[:14 + m] + struct.pack(">I", count + 1) + c[18 + m:],
        "truncated": lambda c: c[:-1],
        "no count": lambda c: c[:14 + m + 2],
    }
    for corrupt in cases.values():
        with pytest.raises(ProtocolError):
            fresh().receive(corrupt(corr))
    # an honest CORR with none of its values ≥ 256 is valid: count 0
    H = run_pair(OTHamming(), a, b, L)
    assert np.array_equal(H, plaintext_hamming(a, b))


@pytest.mark.parametrize("L", [256, 260, 263, 264, 265])
def test_sparse_and_plane_forms_around_the_switch(rng, L):
    a, b = _bits(rng, 9, L), _bits(rng, 7, L)
    for threads, block_values in ((1, 1 << 17), (2, 97)):
        H = run_pair(OTHamming(3, block_values=block_values, threads=threads), a, b, L)
        assert np.array_equal(H, plaintext_hamming(a, b))
