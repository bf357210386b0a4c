"""crypto/masked_hamming.py: exact distances at the candidate entries, what each party is sent, the
masks' distributions on exact integers (with planted faults the checks must catch), saved state, and the
site policy's opt-in."""

import numpy as np
import pytest
from distributions import ALPHA, chi2_uniform

from crypto import masked_hamming as mh
from crypto.errors import ProtocolError
from crypto.hamming_api import PairDriver, plaintext_hamming, run_blocks, run_pair, traits
from crypto.masked_hamming import MaskedHamming, combine_views, log_t, pair_views
from xclp.site_policy import PolicyError, SitePolicy

P = MaskedHamming()


def codes(rng, n, L):
    return np.packbits(rng.integers(0, 2, (n, L), dtype=np.uint8), axis=1)


def entries(rng, n_a, n_b, count):
    return rng.integers(0, n_a, count), rng.integers(0, n_b, count)


def run_views(bits_a, bits_b, L, i, j, keys=None, proto_a=None, proto_b=None):
    """One run over the entries (i, j) with the codes in the shares: (views, A's two outputs, B's output).
    `keys`: fixed (K_A, K_B, K_z) for a deterministic run."""
    pa, pb = proto_a or MaskedHamming(), proto_b or MaskedHamming()
    if keys is not None:
        pa._key, pb._key = keys[0], keys[1]
    va, vb = pair_views(i, j, bits_a.shape[0], bits_b.shape[0])
    a = pa.party_a_pairs(bits_a, L, va, with_codes=True)
    if keys is not None:
        a.run_key = keys[2]
    hello = a.receive(None)
    out_b = pb.party_b_pairs(bits_b, L, vb, with_codes=True).receive(hello.to_peer)
    out_a = a.receive(out_b.to_peer)
    return va, vb, (hello, out_a), out_b


def shares(run):
    va, vb, (_, out_a), out_b = run
    return out_a.to_server, out_b.to_server


@pytest.mark.parametrize("n_a,n_b,L", [(1, 1, 1), (5, 7, 13), (30, 20, 64), (17, 40, 100), (12, 9, 1023),
                                       (8, 11, 1024), (6, 5, 4095)])
def test_whole_site_runs_give_the_plaintext_matrix(n_a, n_b, L):
    rng = np.random.default_rng(L + n_a)
    a, b = codes(rng, n_a, L), codes(rng, n_b, L)
    assert np.array_equal(run_pair(P, a, b, L), plaintext_hamming(a, b, L))


@pytest.mark.parametrize("L", [7, 257, 1024])
def test_candidate_entries_and_overlapping_blocks_are_exact(L):
    rng = np.random.default_rng(L)
    a, b = codes(rng, 60, L), codes(rng, 45, L)
    full = plaintext_hamming(a, b, L)
    i, j = entries(rng, 60, 45, 400)  # with repeats: each entry once
    run = run_views(a, b, L, i, j)
    gi, gj, h = combine_views(*shares(run), run[0], run[1], L)
    assert gi.size == np.unique(i * 45 + j).size
    assert np.array_equal(h, full[gi, gj])
    # blocks as the blocked graph gives them (overlapping tables), through run_blocks
    blocks = [(rng.choice(60, rng.integers(1, 6), replace=False), rng.choice(45, rng.integers(1, 6), replace=False))
              for _ in range(30)]
    for got, (ra, rb) in zip(run_blocks(P, a, b, L, blocks), blocks):
        assert np.array_equal(got, full[np.ix_(ra, rb)])


def test_each_party_is_sent_only_what_the_construction_says():
    rng = np.random.default_rng(0)
    L, k = 100, log_t(100)
    a, b = codes(rng, 20, L), codes(rng, 30, L)
    i, j = entries(rng, 20, 30, 40)  # (some points of each site are no candidate)
    keys = (bytes(range(32)), bytes(range(1, 33)), bytes(range(2, 34)))
    va, vb, (hello, out_a), out_b = run_views(a, b, L, i, j, keys)
    head = mh._HEAD.size + mh.DIGEST
    # the peers exchange keys only: A's HELLO (its mask key and the run's z key), B's KEY
    assert len(hello.to_peer) == head + 2 * mh.KEY_BYTES and hello.to_server is None
    assert len(out_b.to_peer) == 1 + mh.KEY_BYTES and out_a.to_peer is None
    # the coordinator: one value per candidate from each site (k bits), and each site's codes once
    assert len(out_a.to_server) == head + mh.packed_size(va.candidates, k) + mh.codes_size(20, L)
    assert len(out_b.to_server) == head + mh.packed_size(vb.candidates, k) + mh.codes_size(30, L)
    va2, vb2 = pair_views(i, j, 20, 30)
    a_only = P.party_a_pairs(a, L, va2)  # the blocked job's parties: codes uploaded apart, once
    assert len(P.party_b_pairs(b, L, vb2).receive(a_only.receive(None).to_peer).to_server) == \
        head + mh.packed_size(vb.candidates, k)
    # a point of either site that is no candidate changes no per-candidate value the coordinator receives
    a2, b2 = a.copy(), b.copy()
    a2[np.setdiff1d(np.arange(20), va.rows_a), 0] ^= 0xF0
    b2[np.setdiff1d(np.arange(30), vb.rows_b), 0] ^= 0x0F
    assert va.m_a < 20 and vb.m_b < 30
    _, _, (hello2, out_a2), out_b2 = run_views(a2, b2, L, i, j, keys)
    tail = lambda share, n: share[: len(share) - mh.codes_size(n, L)]  # noqa: E731
    assert hello2.to_peer == hello.to_peer and out_b2.to_peer == out_b.to_peer
    assert tail(out_a2.to_server, 20) == tail(out_a.to_server, 20)
    assert tail(out_b2.to_server, 30) == tail(out_b.to_server, 30)
    assert set(va.arrays()) == {"meta", "rows_a", "rows_b", "ptr", "cols"}
    assert va.shape_digest == vb.shape_digest and va.digest != vb.digest


def test_shares_of_another_run_or_view_are_refused():
    rng = np.random.default_rng(1)
    L = 64
    a, b = codes(rng, 10, L), codes(rng, 12, L)
    va, vb, (hello, out_a), out_b = run_views(a, b, L, *entries(rng, 10, 12, 30))
    va2, vb2, _, out_b2 = run_views(a, b, L, *entries(rng, 10, 12, 30))
    with pytest.raises(ProtocolError):
        combine_views(out_a.to_server, out_b2.to_server, va, vb, L)
    with pytest.raises(ProtocolError):
        combine_views(out_a.to_server[:-1], out_b.to_server, va, vb, L)
    with pytest.raises(ProtocolError):  # B's view of another run refuses A's HELLO
        P.party_b_pairs(b, L, vb2).receive(hello.to_peer)
    with pytest.raises(ProtocolError):
        combine_views(out_a.to_server, out_b.to_server, va, vb, L + 1)


def test_a_share_that_does_not_combine_into_distances_is_refused():
    rng = np.random.default_rng(2)
    L = 1024  # t = 2048: a spoiled u lands above L about half the time, over 40 entries surely
    a, b = codes(rng, 10, L), codes(rng, 12, L)
    va, vb, (_, out_a), out_b = run_views(a, b, L, *entries(rng, 10, 12, 40))
    body = bytearray(out_a.to_server)
    head = mh._HEAD.size + mh.DIGEST
    for at in range(head, head + mh.packed_size(va.candidates, log_t(L))):  # every bit plane of u
        body[at] ^= 0xA5
    with pytest.raises(ProtocolError, match="exceeds L"):
        combine_views(bytes(body), out_b.to_server, va, vb, L)


# --- distributions on exact integers, with planted faults -------------------------------------------


def masked_values(L, n, key_seed, x_value):
    """The coordinator's x̃ and u of a run where every code of A is `x_value` (all 0 or all 1 bits)."""
    a = np.packbits(np.full((n, L), x_value, dtype=np.uint8), axis=1)
    b = np.packbits(np.full((n, L), 1 - x_value, dtype=np.uint8), axis=1)
    i, j = np.divmod(np.arange(n * n), n)
    keys = tuple(bytes([key_seed, x]) * 16 for x in range(3))
    va, vb, (_, out_a), _ = run_views(a, b, L, i, j, keys)
    u, carried = mh.open_share(out_a.to_server, mh.SHARE_A, va, L, True, "A's share")
    return mh.read_codes(carried, n, L).ravel(), u


def check_shares_uniform(alpha=ALPHA):
    """x̃ (every coordinate) and u are uniform in Z_t whatever the codes: all-zero and all-one codes alike.
    (t = 64 and 300 × 300 entries: every one of the 64 values expected ~300 times in x̃, ~1,400 in u, so
    that the χ² pools no bins — pooling would hide a parity bias.)"""
    L = 63
    for x_value in (0, 1):
        xt, u = masked_values(L, 300, 7 + x_value, x_value)
        chi2_uniform(np.bincount(xt, minlength=64), alpha / 4, f"x̃ of codes {x_value}")
        chi2_uniform(np.bincount(u, minlength=64), alpha / 4, f"u of codes {x_value}")


def check_masks_uniform(alpha=ALPHA):
    for k in (1, 8, 11, 12):
        v = mh.masks(bytes(range(32)), mh.STREAM_MASK, 400_000, k)
        assert v.dtype == np.uint16 and v.max() < 1 << k
        chi2_uniform(np.bincount(v, minlength=1 << k), alpha / 4, f"masks, k = {k}")


def test_masks_and_what_the_coordinator_receives_are_uniform():
    check_masks_uniform()
    check_shares_uniform()


def test_the_checks_catch_a_biased_mask(monkeypatch):
    real = mh.masks

    def biased(key, stream, count, k):  # the top bit of each mask set one time in ten less often
        v = real(key, stream, count, k)
        drop = real(bytes(32), 9, count, 16) < 6554
        return np.where(drop, v & np.uint16((1 << (k - 1)) - 1), v).astype(np.uint16)

    monkeypatch.setattr(mh, "masks", biased)
    with pytest.raises(AssertionError):
        check_masks_uniform()
    with pytest.raises(AssertionError):
        check_shares_uniform()


def test_the_checks_catch_a_mask_modulo_a_wrong_modulus(monkeypatch):
    real = mh.masks
    # 16 random bits mod t − 1 (not a power of two): value t − 1 never drawn, the rest slightly uneven
    monkeypatch.setattr(mh, "masks", lambda key, stream, count, k: (
        real(key, stream, count, 16) % max((1 << k) - 1, 1)).astype(np.uint16))
    with pytest.raises(AssertionError):
        check_shares_uniform()


def test_the_checks_catch_a_missing_pair_mask_z(monkeypatch):
    real = mh.masks
    # without z, u = |x| + 2⟨x̃, s⟩: its parity is |x|'s (and, over many p of one q, s follows)
    monkeypatch.setattr(mh, "masks", lambda key, stream, count, k: (
        np.zeros(count, np.uint16) if stream == mh.STREAM_Z else real(key, stream, count, k)))
    with pytest.raises(AssertionError):
        check_shares_uniform()


# --- saved state ---------------------------------------------------------------------------------------


def test_parties_restore_from_their_state_mid_run():
    rng = np.random.default_rng(3)
    L = 77
    a, b = codes(rng, 25, L), codes(rng, 18, L)
    i, j = entries(rng, 25, 18, 60)
    va, vb = pair_views(i, j, 25, 18)
    proto_a, proto_b = MaskedHamming(), MaskedHamming()

    def again(driver, proto, bits):  # saved to bytes and rebuilt (no pickle), the site's protocol too
        proto = MaskedHamming().restore(proto.state())
        return PairDriver.restore(driver.state(), lambda s: proto.restore_party(bits, L, s)), proto

    da = PairDriver(proto_a.party_a_pairs(a, L, va), first=True)
    db = PairDriver(proto_b.party_b_pairs(b, L, vb), first=False)
    da, proto_a = again(da, proto_a, a)
    db, proto_b = again(db, proto_b, b)
    (_, hello), _ = da.step(None)
    da, proto_a = again(da, proto_a, a)  # A between its HELLO and B's KEY: its run key is in its state
    db, proto_b = again(db, proto_b, b)
    (_, key_msg), share_b = db.step(hello)
    to_peer, share_a = da.step(key_msg)
    assert to_peer is None and da.done and db.done
    gi, gj, h = combine_views(share_a, share_b, va, vb, L, mh.read_codes(proto_a.codes_message(a, L), 25, L),
                              mh.read_codes(proto_b.codes_message(b, L), 18, L))
    assert np.array_equal(h, plaintext_hamming(a, b, L)[gi, gj])
    with pytest.raises(ProtocolError):  # a party restored over the wrong L
        P.restore_party(b, L + 1, P.party_b_pairs(b, L, vb).state())
    # whole-site parties save their state between messages too
    wa, wb = PairDriver(P.party_a(a, L), first=True), PairDriver(P.party_b(b, L), first=False)
    msg, got = None, {}
    for turn in range(6):
        side, bits = (wa, a) if turn % 2 == 0 else (wb, b)
        side = PairDriver.restore(side.state(), lambda s, bits=bits: P.restore_party(bits, L, s))
        if turn % 2 == 0:
            wa = side
        else:
            wb = side
        if side.done:
            break
        out, share = side.step(msg)
        if share is not None:
            got[turn % 2] = share
        msg = None if out is None else out[1]
    assert np.array_equal(P.combine(got[0], got[1], 25, 18, L), plaintext_hamming(a, b, L))


# --- registry and the site's policy ----------------------------------------------------------------------


def test_registry_traits_and_the_site_policy_opt_in():
    t = traits("masked")
    assert t.secure and t.runs_pairs and t.trusts_coordinator and not t.packs_blocks
    assert not any(traits(n).trusts_coordinator for n in ("lattice", "ot", "paillier", "plaintext"))
    status = {"kind": "predict", "sites": ["a", "b"], "params": {"crypto": "masked", "bits": 64}}
    with pytest.raises(PolicyError, match="allow-trusted-coordinator"):
        SitePolicy().check("j", status)
    SitePolicy(allow_trusted_coordinator=True).check("j", status)
    SitePolicy().check("j", {**status, "params": {"crypto": "lattice", "bits": 64}})


@pytest.mark.parametrize("L", [1, 7, 13, 64, 100, 1023, 1024])
def test_a_runs_row_masks_are_those_rows_of_the_whole_expansion(L):
    """row_masks expands the stream from a run's first row to its last only (AES-CTR started at the first
    row's block): the same values as the whole stream's rows, whatever L's offset of a row within its
    block; rows not increasing are refused."""
    key, n = bytes(range(32)), 70
    full = mh.point_masks(key, n, L)
    rng = np.random.default_rng(L)
    for rows in (np.arange(n), np.sort(rng.choice(n, 17, replace=False)), np.array([0]), np.array([n - 1]),
                 np.array([3, 4, 5]), np.zeros(0, np.int64)):
        got = mh.row_masks(key, rows, L)
        assert got.dtype == np.uint16 and got.shape == (rows.size, L)
        assert np.array_equal(got, full[rows]), rows
    with pytest.raises(ProtocolError, match="increasing"):
        mh.row_masks(key, np.array([5, 3]), L)


def _reference_digests(n_a, n_b, rows_a, rows_b, ptr, cols):
    """The view digests by the construction's formula, written out: SHA-256 over the sizes and each array
    as little-endian int64 (prefixed by its length); each side's digest over the shape's."""
    import hashlib
    import struct

    h = hashlib.sha256(b"xclp/masked/shape/v2" + struct.pack("<QQ", n_a, n_b))
    for x in (rows_a, rows_b, ptr, cols):
        x = np.asarray(x, dtype=np.int64)
        h.update(struct.pack("<Q", x.size) + x.astype("<i8").tobytes())
    shape = h.digest()
    return shape, {s: hashlib.sha256(shape + b"view " + s.encode()).digest() for s in "ab"}


def test_a_views_twin_is_the_other_sides_view_hashed_once():
    """pair_views makes B's view as A's twin (checked and hashed once): the digests are the formula's, and
    B's view equals one made on its own from the same arrays."""
    rng = np.random.default_rng(3)
    for n_a, n_b, count in ((5, 7, 20), (40, 30, 300), (1, 1, 1), (300, 2, 50)):
        va, vb = pair_views(*entries(rng, n_a, n_b, count), n_a, n_b)
        shape, digest = _reference_digests(n_a, n_b, va.rows_a, va.rows_b, va.ptr, va.cols)
        assert (va.side, vb.side) == ("a", "b")
        assert va.shape_digest == vb.shape_digest == shape
        assert (va.digest, vb.digest) == (digest["a"], digest["b"])
        alone = mh.PairView("b", n_a, n_b, va.rows_a, va.rows_b, va.ptr, va.cols)
        assert alone.digest == vb.digest and alone.shape_digest == vb.shape_digest
        for name in ("rows_a", "rows_b", "ptr", "cols"):
            assert np.array_equal(getattr(alone, name), getattr(vb, name))
        assert (vb.m_a, vb.m_b, vb.candidates) == (alone.m_a, alone.m_b, alone.candidates)
        assert vb.twin().digest == va.digest and vb.twin().side == "a"
