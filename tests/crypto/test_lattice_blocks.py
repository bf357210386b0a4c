"""The lattice protocol's packed block mode (crypto/lattice_blocks.py): all candidate blocks of a pair in
one run, exact against the plaintext distances, against one run per block, and the coordinator
learning the candidate entries' distances only."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.hamming_api import PairTranscript, exchange, plaintext_hamming, run_blocks, run_pair
from crypto.lattice_blocks import BlockLayout, combine_values
from crypto.lattice_blocks import PackedLatticeHamming as LatticeHamming
from crypto.lattice_hamming import lattice_params


def codes(rng, n, L):
    return np.packbits(rng.integers(0, 2, (n, L), dtype=np.uint8), axis=1)


def random_blocks(rng, n_a, n_b, count, most=6):
    """Blocks of 1 … most rows a side (one-row blocks included), some sharing rows."""
    out = [(rng.choice(n_a, rng.integers(1, most + 1), replace=False),
            rng.choice(n_b, rng.integers(1, most + 1), replace=False)) for _ in range(count)]
    return out + [(np.array([n_a - 1]), np.array([0])), (np.array([0]), rng.choice(n_b, 3, replace=False))]


def packed(proto, A, B, L, blocks, transcript=None):
    sa, sb = exchange(proto.party_a_blocks(A, L, blocks, B.shape[0]),
                      proto.party_b_blocks(B, L, blocks, A.shape[0]), transcript)
    return sa, sb, proto.combine_blocks(sa, sb, blocks, A.shape[0], B.shape[0], L)


@pytest.mark.parametrize("L,n_a,n_b,count", [(64, 50, 40, 30), (16, 4200, 70, 120), (1024, 120, 90, 40)])
def test_packed_blocks_equal_the_plaintext_distances(L, n_a, n_b, count):
    # (16, 4200, …): A's points span two of its blocks of N = 4096, so the run has two groups
    rng = np.random.default_rng(L + n_a)
    A, B = codes(rng, n_a, L), codes(rng, n_b, L)
    blocks = random_blocks(rng, n_a, n_b, count)
    proto = LatticeHamming()
    _, _, out = packed(proto, A, B, L, blocks)
    H = plaintext_hamming(A, B, L)
    assert len(out) == len(blocks)
    for m, (ra, rb) in zip(out, blocks):
        assert m.shape == (ra.size, rb.size)
        np.testing.assert_array_equal(m, H[np.ix_(ra, rb)])
    layout = BlockLayout(blocks, n_a, n_b)
    assert proto.decrypted == layout.ciphertexts  # one result ciphertext per row of B and group, not per block
    assert layout.ciphertexts < sum(rb.size for _, rb in blocks)


def test_packed_run_equals_one_run_per_block_and_is_one_run():
    rng = np.random.default_rng(5)
    L, A, B = 64, codes(rng, 30, 64), codes(rng, 25, 64)
    blocks = random_blocks(rng, 30, 25, 6)
    one, each = PairTranscript(), PairTranscript()
    got = run_blocks(LatticeHamming(), A, B, L, blocks, one)
    proto = LatticeHamming()
    for g, (ra, rb) in zip(got, blocks):
        t = PairTranscript()
        np.testing.assert_array_equal(g, run_pair(proto, A[ra], B[rb], L, t))
        each.a_to_b += t.a_to_b
    assert len(one.messages) == 2  # HELLO + COLS, one RES: the whole pair in one exchange
    assert one.a_to_b < each.a_to_b / 4  # one HELLO and one set of columns, not one per block


def test_the_coordinator_learns_the_candidate_entries_only():
    rng = np.random.default_rng(7)
    L, n_a, n_b = 64, 40, 30
    A, B = codes(rng, n_a, L), codes(rng, n_b, L)
    blocks = random_blocks(rng, n_a, n_b, 5, most=3)
    layout = BlockLayout(blocks, n_a, n_b)
    cand = set(zip(*(x.tolist() for x in layout.pairs())))
    assert cand == {(int(i), int(j)) for ra, rb in blocks for i in ra for j in rb}  # the union of the rectangles
    sa, sb, _ = packed(LatticeHamming(), A, B, L, blocks)
    assert len(sa) == 6 + 17 + 32 + 2 * len(cand)  # header, sizes, digest, one u16 per candidate entry
    values = combine_values(sa, sb, layout, L)
    i, j = layout.pairs()
    np.testing.assert_array_equal(values, plaintext_hamming(A, B, L)[i, j])
    # every point of either site outside the blocks changed: what the coordinator gets is the same
    A2, B2 = A.copy(), B.copy()
    A2[np.setdiff1d(np.arange(n_a), i)] ^= 0xFF
    B2[np.setdiff1d(np.arange(n_b), j)] ^= 0xFF
    sa2, sb2, _ = packed(LatticeHamming(), A2, B2, L, blocks)
    assert len(sa2) == len(sa)
    np.testing.assert_array_equal(combine_values(sa2, sb2, layout, L), values)


def test_bad_block_lists_are_refused():
    rng = np.random.default_rng(3)
    L, A, B = 16, codes(rng, 10, 16), codes(rng, 8, 16)
    proto = LatticeHamming()
    cases = {
        "at least one block": [],
        "non-empty": [(np.array([0]), np.array([], dtype=np.int64))],
        "outside \\[0, 10\\)": [(np.array([10]), np.array([0]))],
        "outside \\[0, 8\\)": [(np.array([0]), np.array([-1]))],
        "twice": [(np.array([1, 1]), np.array([0]))],
        "integers": [(np.array([0.5]), np.array([0]))],
        "pair": [(np.array([0]),)],
    }
    for msg, blocks in cases.items():
        with pytest.raises(ProtocolError, match=msg):
            proto.party_a_blocks(A, L, blocks, 8)
        with pytest.raises(ProtocolError, match=msg):
            proto.party_b_blocks(B, L, blocks, 10)
    with pytest.raises(ProtocolError, match="no blocks"):
        run_blocks(proto, A, B, L, [])


def test_sides_with_different_block_lists_refuse():
    # the sites share only the run's shape (groups, rows of B per group): they refuse another shape in
    # A's HELLO; a list that differs where one site cannot see it (B's rows, A's positions) is refused by
    # the coordinator, which checks each share against the view it computed for that site
    rng = np.random.default_rng(4)
    L, A, B = 16, codes(rng, 10, 16), codes(rng, 8, 16)
    proto = LatticeHamming()
    mine, theirs = [(np.array([0, 1]), np.array([2]))], [(np.array([0, 1]), np.array([2, 3]))]
    with pytest.raises(ProtocolError, match="another list of blocks"):
        exchange(proto.party_a_blocks(A, L, mine, 8), proto.party_b_blocks(B, L, theirs, 10))
    sa, sb, _ = packed(proto, A, B, L, mine)
    with pytest.raises(ProtocolError, match="B's share is for another list of blocks"):
        proto.combine_blocks(sa, sb, [(np.array([0, 1]), np.array([4]))], 10, 8, L)
    with pytest.raises(ProtocolError, match="A's share is for another list of blocks"):
        proto.combine_blocks(sa, sb, [(np.array([0, 2]), np.array([2]))], 10, 8, L)
    # a site that ran another view of the same shape: A with positions {0, 2}, B as planned
    sa2, sb2 = exchange(proto.party_a_blocks(A, L, [(np.array([0, 2]), np.array([2]))], 8),
                        proto.party_b_blocks(B, L, mine, 10))
    with pytest.raises(ProtocolError, match="A's share is for another list of blocks"):
        proto.combine_blocks(sa2, sb2, mine, 10, 8, L)


def test_a_packed_run_saved_and_restored_after_every_message_gives_the_same_distances():
    rng = np.random.default_rng(9)
    L, n_a, n_b = 16, 4150, 100
    A, B = codes(rng, n_a, L), codes(rng, n_b, L)
    blocks = random_blocks(rng, n_a, n_b, 60) + [(np.array([4140, 4149]), np.array([1, 2]))]
    pa, pb = LatticeHamming(), LatticeHamming(target_message_bytes=1)  # small RES: ACKs, several messages
    a, b = pa.party_a_blocks(A, L, blocks, n_b), pb.party_b_blocks(B, L, blocks, n_a)
    out, share_b, rounds = a.receive(None), None, 0
    while True:  # each side rebuilt from its saved bytes before every message, as a Flower site is
        rounds += 1
        b = pb.restore_party(B, L, b.state())
        out = b.receive(out.to_peer)
        share_b = share_b or out.to_server
        a = pa.restore_party(A, L, a.state())
        out = a.receive(out.to_peer)
        if out.done:
            break
    assert rounds > 2 and b.finished
    got = pa.combine_blocks(out.to_server, share_b, blocks, n_a, n_b, L)
    H = plaintext_hamming(A, B, L)
    for m, (ra, rb) in zip(got, blocks):
        np.testing.assert_array_equal(m, H[np.ix_(ra, rb)])


def test_combine_pairs_gives_each_candidate_entry_once():
    rng = np.random.default_rng(11)
    L, A, B = 64, codes(rng, 20, 64), codes(rng, 15, 64)
    blocks = [(np.array([0, 1]), np.array([2, 3])), (np.array([1, 0]), np.array([3])), (np.array([5]), np.array([3]))]
    proto = LatticeHamming()
    sa, sb, _ = packed(proto, A, B, L, blocks)
    i, j, h = proto.combine_pairs(sa, sb, blocks, 20, 15, L)
    assert sorted(zip(i.tolist(), j.tolist())) == [(0, 2), (0, 3), (1, 2), (1, 3), (5, 3)]
    np.testing.assert_array_equal(h, plaintext_hamming(A, B, L)[i, j])


def test_each_site_is_given_its_view_and_no_row_of_its_peer():
    # A's view: per group the count of B's rows and each anonymous row's positions P(k, c); B's view:
    # its own rows per group. A's is the same whichever rows of B they are (an order-keeping relabelling
    # of B's rows), B's the same whichever of A's points in a group are the candidates (A's rows permuted
    # within their group of N): neither carries a row index of the peer
    from crypto.lattice_blocks import blocks_from_views

    rng = np.random.default_rng(13)
    L, n_a, n_b = 64, 4150, 60
    A, B = codes(rng, n_a, L), codes(rng, n_b, L)
    blocks = random_blocks(rng, n_a, n_b // 2, 40) + [(np.array([4100, 4149]), np.array([1, 2]))]
    layout = BlockLayout(blocks, n_a, n_b)
    va, vb = layout.view_a(), layout.view_b()
    assert set(va.arrays()) == {"meta", "ks", "counts", "keys", "key_ptr"} and set(vb.arrays()) == {"meta", "ks",
                                                                                                    "counts", "rows"}
    assert all(g.b_rows is None for g in va.groups) and all(g.keys is None for g in vb.groups)
    relabel_b = [(ra, 2 * rb + 1) for ra, rb in blocks]  # B's rows j → 2j + 1: other rows, the same order
    perm = np.r_[rng.permutation(4096), 4096 + rng.permutation(n_a - 4096)]  # A's rows, within each group
    relabel_a = [(perm[ra], rb) for ra, rb in blocks]
    same_a, same_b = BlockLayout(relabel_b, n_a, n_b).view_a(), BlockLayout(relabel_a, n_a, n_b).view_b()
    assert same_a.digest == va.digest and same_b.digest == vb.digest
    assert BlockLayout(relabel_b, n_a, n_b).view_b().digest != vb.digest  # (the views do see their own rows)
    # the run from the two views alone, exact; the coordinator rebuilds the entries from the views it sent
    proto = LatticeHamming()
    sa, sb = exchange(proto.party_a_view(A, L, va), proto.party_b_view(B, L, vb))
    rebuilt = blocks_from_views(va, vb)
    again = BlockLayout(rebuilt, n_a, n_b)
    assert (again.view_a().digest, again.view_b().digest) == (va.digest, vb.digest)
    i, j, h = proto.combine_pairs(sa, sb, rebuilt, n_a, n_b, L)
    assert set(zip(i.tolist(), j.tolist())) == set(zip(*(x.tolist() for x in layout.pairs())))
    np.testing.assert_array_equal(h, plaintext_hamming(A, B, L)[i, j])
    with pytest.raises(ProtocolError, match="A's party needs A's view"):
        proto.party_a_view(A, L, vb)
    with pytest.raises(ProtocolError, match="not of one run"):
        blocks_from_views(va, BlockLayout(blocks[:-1], n_a, n_b).view_b())


def test_the_first_packed_layout_is_kept_for_comparison_and_sends_less():
    # private=False: B is given P(k, c) and returns b at the candidates only (what the benchmark compares)
    rng = np.random.default_rng(17)
    L, A, B = 64, codes(rng, 300, 64), codes(rng, 50, 64)
    blocks = random_blocks(rng, 300, 50, 20)
    H = plaintext_hamming(A, B, L)
    sent = {}
    for private in (True, False):
        proto, t = LatticeHamming(), PairTranscript()
        sa, sb = exchange(proto.party_a_blocks(A, L, blocks, 50, private=private),
                          proto.party_b_blocks(B, L, blocks, 300, private=private), t)
        for m, (ra, rb) in zip(proto.combine_blocks(sa, sb, blocks, 300, 50, L, private=private), blocks):
            np.testing.assert_array_equal(m, H[np.ix_(ra, rb)])
        sent[private] = t.b_to_a
        if private:
            with pytest.raises(ProtocolError, match="another list of blocks"):  # a share of the other mode
                proto.combine_blocks(sa, sb, blocks, 300, 50, L, private=False)
    layout = BlockLayout(blocks, 300, 50)
    extra = layout.ciphertexts * 300 - layout.candidates  # b words at every coefficient, not the candidates'
    assert sent[True] - sent[False] == extra * lattice_params(L).log_q_out // 8
