"""A's kept results of a packed lattice run (crypto/lattice_kept.py): a later round's entries answered
from them equal the plaintext distances, the coordinator gets exactly the view's entries, and a view,
share or kept store of another run is refused."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.hamming_api import exchange, plaintext_hamming
from crypto.lattice_blocks import BlockLayout
from crypto.lattice_blocks import PackedLatticeHamming as LatticeHamming
from crypto.lattice_hamming import lattice_params
from crypto.lattice_kept import KeptResults, KeptView, combine_kept, kept_view


def codes(rng, n, L):
    return np.packbits(rng.integers(0, 2, (n, L), dtype=np.uint8), axis=1)


def first_run(rng, L, n_a, n_b, count=40):
    """A packed run over random one-row blocks, A keeping its results: (layout, kept, B's share)."""
    A, B = codes(rng, n_a, L), codes(rng, n_b, L)
    blocks = [(rng.choice(n_a, rng.integers(1, 6), replace=False), np.array([j]))
              for j in rng.choice(n_b, count, replace=False)]
    blocks.append((np.array([n_a - 1]), np.array([blocks[0][1][0]])))  # A's last group too
    proto = LatticeHamming()
    layout = BlockLayout(blocks, n_a, n_b)
    keep = KeptResults(layout.view_a())
    sa, sb = exchange(proto.party_a_view(A, L, layout.view_a(), keep), proto.party_b_view(B, L, layout.view_b()))
    i, j, h = proto.combine_pairs(sa, sb, blocks, n_a, n_b, L)
    H = plaintext_hamming(A, B, L)
    np.testing.assert_array_equal(h, H[i, j])  # keeping changes nothing of the run itself
    assert keep.complete
    return A, B, H, layout, keep, sb


@pytest.mark.parametrize("L,n_a,n_b", [(64, 60, 50), (16, 4200, 40)])
def test_a_later_rounds_entries_answered_from_kept_results_equal_the_plaintext_distances(L, n_a, n_b):
    # (16, 4200, …): A's points span two groups of N = 4096
    rng = np.random.default_rng(L + n_a)
    A, B, H, layout, keep, sb = first_run(rng, L, n_a, n_b, count=min(n_b, 40))
    va, vb = layout.view_a(), layout.view_b()
    # a later round's entries: every pair of a row of B answered in the group that holds the point of A,
    # plus some that were not (a row of B with no candidate there)
    i = rng.integers(0, n_a, 400)
    j = rng.integers(0, n_b, 400)
    kept, fresh = kept_view(va, vb, i, j)
    answered = {(int(g.start + p), int(r)) for g in vb.groups for r in g.b_rows for p in range(g.width)}
    assert [(int(x), int(y)) in answered for x, y in zip(i, j)] == list(~fresh)
    assert fresh.any() and (~fresh).any()
    share = keep.answer(KeptView(keep.view, kept.keys, kept.ptr), lattice_params(L).log_t)
    ki, kj, kh = combine_kept(share, sb, kept, vb, L)
    np.testing.assert_array_equal(kh, H[ki, kj])
    # exactly the round's kept entries, each once: nothing else reaches the coordinator
    assert sorted(zip(ki.tolist(), kj.tolist())) == sorted({(int(x), int(y)) for x, y, f in zip(i, j, fresh) if not f})
    assert len(share) == len(share[: -2 * kept.count]) + 2 * kept.count


def test_a_view_share_or_store_of_another_run_is_refused():
    rng = np.random.default_rng(3)
    L = 64
    A, B, H, layout, keep, sb = first_run(rng, L, 50, 40, count=25)
    _, _, _, other, other_keep, other_sb = first_run(rng, L, 50, 40, count=25)  # other rows of B
    va, vb = layout.view_a(), layout.view_b()
    kept, _ = kept_view(va, vb, np.arange(50), np.full(50, int(vb.groups[0].b_rows[0])))
    with pytest.raises(ProtocolError, match="another run"):  # A's store is of another run
        other_keep.answer(kept, lattice_params(L).log_t)
    share = keep.answer(kept, lattice_params(L).log_t)
    with pytest.raises(ProtocolError, match="another view"):  # B's share of another run (a replay)
        combine_kept(share, other_sb, kept, vb, L)
    with pytest.raises(ProtocolError, match="not of the same run"):
        combine_kept(share, sb, kept, va, L)
    fewer = KeptView(va, kept.keys[1:], np.r_[0, kept.ptr[1:] - 1])
    with pytest.raises(ProtocolError, match="another view|values"):  # a share for another list of entries
        combine_kept(share, sb, fewer, vb, L)
    u = np.frombuffer(share[-2 * kept.count :], dtype="<u2")
    bad = share[: -2 * kept.count] + ((u + 64) % 128).astype("<u2").tobytes()  # h + 64 mod t = 128: above L for h > 0
    with pytest.raises(ProtocolError, match="exceeds L"):
        combine_kept(bytes(bad), sb, kept, vb, L)
    with pytest.raises(ProtocolError, match="increasing"):
        KeptView(va, kept.keys[::-1], kept.ptr)


def test_kept_results_are_refused_before_the_run_is_through_and_saved_and_restored():
    rng = np.random.default_rng(4)
    L = 64
    A, B, H, layout, keep, sb = first_run(rng, L, 45, 30, count=30)
    va, vb = layout.view_a(), layout.view_b()
    kept, _ = kept_view(va, vb, np.repeat(np.arange(45), 30), np.tile(np.arange(30), 45))
    again = KeptResults.restore(keep.state())
    assert again.answer(kept, lattice_params(L).log_t) == keep.answer(kept, lattice_params(L).log_t)
    empty = KeptResults(va)
    with pytest.raises(ProtocolError, match="not finished"):
        empty.answer(kept, lattice_params(L).log_t)
    i, j, h = combine_kept(again.answer(kept, lattice_params(L).log_t), sb, kept, vb, L)
    np.testing.assert_array_equal(h, H[i, j])
    assert i.size == sum(g.count * g.width for g in va.groups)  # every coefficient of the run is kept


def test_a_padded_group_runs_all_of_bs_rows_so_a_later_round_needs_no_fresh_run():
    from crypto.lattice_blocks import combine_values

    rng = np.random.default_rng(9)
    L, n_a, n_b = 64, 60, 50
    A, B = codes(rng, n_a, L), codes(rng, n_b, L)
    blocks = [(rng.choice(n_a, 4, replace=False), np.array([j])) for j in rng.choice(n_b, 30, replace=False)]
    plain = BlockLayout(blocks, n_a, n_b)
    layout = BlockLayout(blocks, n_a, n_b, pad=0.5)  # 30 of 50 rows met the group: all 50 run
    assert plain.groups[0].count == 30 and layout.groups[0].count == n_b
    assert layout.candidates == plain.candidates  # the same candidate entries reach the coordinator
    assert BlockLayout(blocks, n_a, n_b, pad=0.7).groups[0].count == 30  # below the fraction: not padded
    proto = LatticeHamming()
    va, vb = layout.view_a(), layout.view_b()
    keep = KeptResults(va)
    sa, sb = exchange(proto.party_a_view(A, L, va, keep), proto.party_b_view(B, L, vb))
    both = BlockLayout.from_views(va, vb)  # the coordinator's combine, from the two views it sent
    h = combine_values(sa, sb, both, L)
    i, j = both.pairs()
    H = plaintext_hamming(A, B, L)
    np.testing.assert_array_equal(h, H[i, j])
    assert sorted(zip(i.tolist(), j.tolist())) == sorted(zip(*(x.tolist() for x in plain.pairs())))
    # every (row of B, point of A) is kept: a later round's entries are all answered, none fresh
    kept, fresh = kept_view(va, vb, rng.integers(0, n_a, 300), rng.integers(0, n_b, 300))
    assert not fresh.any()
    ki, kj, kh = combine_kept(keep.answer(kept, lattice_params(L).log_t), sb, kept, vb, L)
    np.testing.assert_array_equal(kh, H[ki, kj])
