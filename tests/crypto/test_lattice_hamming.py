"""The lattice Hamming protocol: exact against the plaintext matrix, uniform shares, flooding that
hides y in the decrypted noise, refused parameters and malformed messages."""

import numpy as np
import pytest
from scipy import stats

from crypto import lattice_hamming as lh
from crypto import rlwe
from crypto.errors import ProtocolError
from crypto.hamming_api import PairTranscript, exchange, plaintext_hamming, run_pair


def packed(rng, n, L, p=0.5):
    return np.packbits((rng.random((n, L)) < p).astype(np.uint8), axis=1)


@pytest.mark.parametrize("L, na, nb", [(1, 3, 2), (7, 1, 1), (64, 1, 9), (100, 13, 1), (255, 37, 70),
                                       (1024, 5, 3), (4096, 3, 4), (8192, 3, 2)])
def test_exact_for_random_sizes(L, na, nb):
    rng = np.random.default_rng(L * 1000 + na)
    a, b = packed(rng, na, L), packed(rng, nb, L)
    assert np.array_equal(run_pair(lh.LatticeHamming(), a, b, L), plaintext_hamming(a, b, L))


def test_exact_across_blocks_and_chunks_with_extreme_distances():
    # n_a > N: two blocks of A's points; tiny messages: many RES/ACK rounds per block.
    rng = np.random.default_rng(7)
    L = 40
    a = packed(rng, lh.rlwe.N_DEFAULT + 70, L)
    b = packed(rng, 150, L)
    b[0] = a[0]  # h = 0
    b[1] = ~a[1]  # h = L
    proto = lh.LatticeHamming(target_message_bytes=200_000)
    t = PairTranscript()
    h = run_pair(proto, a, b, L, t)
    ref = plaintext_hamming(a, b, L)
    assert np.array_equal(h, ref) and h[0, 0] == 0 and h[1, 1] == L
    assert sum(1 for d, _ in t.messages if d == "b_to_a") > 4  # really chunked
    # A's encrypted columns are reused for the next peer (one key and one encryption per job).
    c = packed(rng, 3, L)
    assert np.array_equal(run_pair(proto, a, c, L), plaintext_hamming(a, c, L))
    assert len(proto._columns) == 1


def test_bytes_per_pair_at_scale_are_small():
    # The a part of a result is N coefficients whatever the block's width: measure at full blocks.
    rng = np.random.default_rng(3)
    L, n = 256, 600
    a, b = packed(rng, n, L), packed(rng, n, L)
    t = PairTranscript()
    run_pair(lh.LatticeHamming(), a, b, L, t)
    p = lh.lattice_params(L)
    expected_b_to_a = n * (lh.rlwe.N_DEFAULT + n) * p.log_q_out // 8
    assert abs(t.b_to_a - expected_b_to_a) < 64 * 10  # headers only
    assert t.b_to_server < 100  # B's share is a 32-byte key
    assert t.a_to_server == lh._HDR.size + lh._SHARE.size + 2 * n * n  # u16 per pair


def _start(L, a_bits, b_bits, proto=None):
    proto = proto or lh.LatticeHamming()
    pa, pb = proto.party_a(a_bits, L), proto.party_b(b_bits, L)
    hello = pa.receive(None).to_peer
    return proto, pa, pb, hello


def test_what_the_coordinator_and_the_key_owner_see_is_uniform():
    # All distances 0: without the masks A would decrypt, and the coordinator would receive, only 0s.
    L, n = 64, 700
    bits = np.zeros((n, L // 8), dtype=np.uint8)
    proto = lh.LatticeHamming()
    share_a, share_b = exchange(proto.party_a(bits, L), proto.party_b(bits[:3], L))
    body = memoryview(share_a)[lh._HDR.size + lh._SHARE.size :]
    u = np.frombuffer(body, dtype="<u2").astype(np.int64)  # what A decrypted and sends on
    t = 1 << lh.lattice_params(L).log_t
    assert u.max() < t
    assert stats.chisquare(np.bincount(u, minlength=t)).pvalue > 1e-6
    assert len(share_b) == lh._HDR.size + lh._SHARE.size + 32  # B: only its mask key
    assert np.array_equal(proto.combine(share_a, share_b, n, 3, L), np.zeros((n, 3)))


# Flooding: A's exact decrypted noise does not depend on y (and the check fails without flooding or
# with weakened flooding): tests/crypto/test_sampler_distributions.py.


def test_parameters_below_the_standard_are_refused_by_the_evaluator():
    rng = np.random.default_rng(5)
    L = 16
    _, _, pb, hello = _start(L, packed(rng, 4, L), packed(rng, 2, L))
    weak = bytearray(hello)
    off = lh._HDR.size + 8  # L, n_a, then N
    weak[off : off + 4] = (2048).to_bytes(4, "little")
    with pytest.raises(ProtocolError, match="refused.*exceeds 54"):
        pb.receive(bytes(weak))
    with pytest.raises(ProtocolError, match="lattice protocol takes"):
        lh.lattice_params(10_000)
    with pytest.raises(ProtocolError, match="HE security standard"):
        lh.LatticeHamming(n=2048).party_a(packed(rng, 2, L), L)


def test_malformed_and_out_of_order_messages_are_refused():
    rng = np.random.default_rng(6)
    L = 16
    a_bits, b_bits = packed(rng, 5, L), packed(rng, 4, L)
    proto, pa, pb, hello = _start(L, a_bits, b_bits)
    with pytest.raises(ProtocolError, match="HELLO|COLS|short|bytes"):
        proto.party_b(b_bits, L).receive(hello[:-7])
    with pytest.raises(ProtocolError, match="magic"):
        proto.party_b(b_bits, L).receive(b"XXXX" + hello[4:])
    res = pb.receive(hello).to_peer
    with pytest.raises(ProtocolError, match="speaks first"):
        proto.party_a(a_bits, L).receive(res)  # a RES before this A said HELLO
    with pytest.raises(ProtocolError):
        pb.receive(hello)  # a replayed HELLO
    other = proto.party_a(a_bits, L)
    other.receive(None)
    with pytest.raises(ProtocolError, match="bytes"):
        other.receive(res[:-1])
    with pytest.raises(ProtocolError, match="already failed"):
        other.receive(res)


def test_combine_refuses_shares_that_do_not_fit():
    rng = np.random.default_rng(8)
    L = 32
    a, b = packed(rng, 6, L), packed(rng, 5, L)
    proto = lh.LatticeHamming()
    share_a, share_b = exchange(proto.party_a(a, L), proto.party_b(b, L))
    assert np.array_equal(proto.combine(share_a, share_b, 6, 5, L), plaintext_hamming(a, b, L))
    with pytest.raises(ProtocolError, match="6 × 5"):
        proto.combine(share_a, share_b, 5, 6, L)
    forged = bytearray(share_a)
    forged[-2:] = (int.from_bytes(forged[-2:], "little") ^ 0x20).to_bytes(2, "little")  # u off by 32 > L
    with pytest.raises(ProtocolError, match="exceeds L"):
        proto.combine(bytes(forged), share_b, 6, 5, L)
    with pytest.raises(ProtocolError):
        proto.combine(share_b, share_a, 6, 5, L)


def test_mask_streams_are_shared_by_evaluator_and_coordinator_only_through_the_key():
    key = b"k" * 32
    r = lh.rho(key, 2, 1000, 11)
    assert r.shape == (lh.SUB_BATCH, 1000) and r.max() < 2048
    assert np.array_equal(r, lh.rho(key, 2, 1000, 11))
    assert not np.array_equal(r, lh.rho(key, 3, 1000, 11))
    assert rlwe.LOG_Q == 108


def test_a_small_site_packs_its_columns_into_few_ciphertexts():
    # 500 points: 8 columns to a ciphertext, 129 ciphertexts for L + 1 = 1025 columns; a full block
    # keeps one column a ciphertext; one point puts every column into one ciphertext.
    assert lh.packing(1024, 500, rlwe.N_DEFAULT) == (8, 129)
    assert lh.packing(1024, rlwe.N_DEFAULT, rlwe.N_DEFAULT) == (1, 1025)
    assert lh.packing(1024, 2000, rlwe.N_DEFAULT) == (2, 513)
    assert lh.packing(1024, 1, rlwe.N_DEFAULT) == (1025, 1)
    rng = np.random.default_rng(12)
    L, n = 256, 500
    a, b = packed(rng, n, L), packed(rng, 9, L)
    proto = lh.LatticeHamming()
    t = PairTranscript()
    assert np.array_equal(run_pair(proto, a, b, L, t), plaintext_hamming(a, b, L))
    r, count = lh.packing(L, n, rlwe.N_DEFAULT)
    cols = proto._cols(lh.lattice_params(L), a, 0, 0, n)  # the COLS message A sent
    assert len(cols) == lh._HDR.size + lh._COLS.size + count * r * n * rlwe.COEFF_BYTES
    assert count == 33  # ⌈257 / 8⌉: one encryption for eight columns
    # a COLS message for the unpacked layout (one column a ciphertext) is refused by its length
    pb = proto.party_b(b, L)
    hello = proto.party_a(a, L).receive(None).to_peer
    _, body = lh._open(hello, (lh.HELLO,), 1 << 30)
    pb._hello(body)
    unpacked = lh._header(lh.COLS) + lh._COLS.pack(0, n) + bytes((L + 1) * n * rlwe.COEFF_BYTES)
    with pytest.raises(ProtocolError, match="COLS"):
        pb._columns(memoryview(unpacked)[lh._HDR.size :])


@pytest.mark.parametrize("L", [1, 16, 64, 1024, 4096, 8192])
def test_flooding_covers_the_rerandomisation_noise_and_every_ciphertext_of_a_job(L):
    # F ≥ σ + log2(N·(4Lη + 2(2N+1)η)) + log2(C), checked in exact integers, and the noise still decrypts.
    p = lh.lattice_params(L)
    n, eta = rlwe.N_DEFAULT, rlwe.ETA
    shift = 4 * L * eta + 2 * (2 * n + 1) * eta
    assert lh.flood_shift(L) == shift
    assert lh.MAX_CIPHERTEXTS * n * shift * 2**lh.SIGMA <= 2**p.flood_bits
    assert lh.flooding_distance_log2(p) <= -(lh.SIGMA + 1)
    w, k = p.log_t, p.log_q_out
    noise = 2**p.flood_bits + (2 * L + 1) * eta + (2 * n + 1) * eta
    assert 2 * noise * 2**k + (n + 1) * 2**rlwe.LOG_Q < 2 ** (rlwe.LOG_Q + k - w)  # < Δ'/2 after switching
    assert rlwe.LOG_Q <= rlwe.MAX_LOG_Q_128[n]


def test_the_issue_numbers_for_the_old_bound():
    # The old F (per ciphertext, without the re-randomisation noise) gave 2^-38.3 per ciphertext at L = 1024.
    import math
    old_f = math.ceil(40 + math.log2(4096 * 4 * 1024 * 21)) - 1
    assert old_f == 68
    assert abs(math.log2(4096 * lh.flood_shift(1024)) - (old_f + 1) + 38.3) < 0.05


def test_a_refuses_more_result_ciphertexts_than_the_flooding_covers(monkeypatch):
    rng = np.random.default_rng(13)
    L = 16
    a, b = packed(rng, 3, L), packed(rng, 5, L)
    proto = lh.LatticeHamming()
    assert np.array_equal(run_pair(proto, a, b, L), plaintext_hamming(a, b, L))
    assert proto.decrypted == 5  # one ciphertext per vector of B (one block of A)
    monkeypatch.setattr(lh, "MAX_CIPHERTEXTS", 7)
    with pytest.raises(ProtocolError, match="more than 7 result ciphertexts"):
        run_pair(proto, a, b, L)  # 5 + 5 > 7: the second peer is refused by A
    with pytest.raises(ProtocolError, match="flooding covers"):
        run_pair(lh.LatticeHamming(), a, packed(rng, 8, L), L)  # B alone: 8 > 7


def test_the_uniform_polynomials_are_bound_to_the_bits_they_encrypt():
    # One object encrypting two bit sets must not reuse a: b − b' would be x − x' plus small noise.
    rng = np.random.default_rng(14)
    L = 32
    x1, x2 = packed(rng, 4, L), packed(rng, 4, L)
    proto = lh.LatticeHamming()
    seeds = []
    for x in (x1, x2, x1):
        hello = proto.party_a(x, L).receive(None).to_peer
        _, body = lh._open(hello, (lh.HELLO,), 1 << 30)
        seeds.append(lh._HELLO.unpack_from(body)[-1])
    assert seeds[0] != seeds[1] and seeds[0] == seeds[2]
    y = packed(rng, 3, L)
    for x in (x1, x2):
        assert np.array_equal(run_pair(proto, x, y, L), plaintext_hamming(x, y, L))


def test_L_8192_has_parameters():
    p = lh.lattice_params(8192)
    assert (p.log_t, p.log_q_out) == (14, 32)


def test_a_job_past_the_lattice_limit_is_refused_at_validation():
    from xclp.job_params import JobParams

    JobParams(job_id="j", n_classes=2, bits=lh.MAX_BITS, crypto="lattice").validate()
    with pytest.raises(ValueError, match="lattice.*8192"):
        JobParams(job_id="j", n_classes=2, bits=lh.MAX_BITS + 1, crypto="lattice").validate()
    JobParams(job_id="j", n_classes=2, bits=lh.MAX_BITS + 1, crypto="ot").validate()
