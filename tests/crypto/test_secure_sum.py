"""SecureRowSums and shared-mask secure sums (crypto.secure_sum)."""

import hashlib

import numpy as np
import pytest
from scipy.stats import chi2

from crypto.errors import ProtocolError
from crypto.fixedpoint import check_bound, encode
from crypto.keys import SiteKeyPair, pairwise_keys
from crypto.secure_sum import (
    mask_rows,
    mask_vector,
    prg_uint64,
    server_sum,
    shared_mask_key,
    site_mask,
    unmask_rows,
    unmask_total,
)
from xclp.wire import dump_array, load_array

JOB = "job-rows"
SITES = ["s1", "s2", "s3", "s4"]
F = 32
P_MIN = 1e-4


def _kp(name):
    return SiteKeyPair.from_private_bytes(hashlib.sha256(b"sum-test/" + name.encode()).digest())


PUBLIC = {s: _kp(s).public_bytes() for s in SITES}


def _pair_keys(me, order, attempt, purpose="row-sums"):
    return pairwise_keys(_kp(me), PUBLIC, job=JOB, purpose=purpose, attempt=attempt, me=me, peers=order)


def _masks(order, shape, attempt=0, purpose="row-sums"):
    return {s: site_mask(s, _pair_keys(s, order, attempt, purpose), order, shape) for s in order}


def _chi2_p(values: np.ndarray, byte: int) -> float:
    b = ((values.ravel() >> np.uint64(8 * byte)) & np.uint64(0xFF)).astype(np.int64)
    counts = np.bincount(b, minlength=256)
    expected = b.size / 256
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, 255))


def _run_row_sums(order, n, C, attempt, rng):
    owner = rng.integers(0, len(SITES), size=n)  # rows partitioned among ALL sites
    rows = {s: np.flatnonzero(owner == SITES.index(s)) for s in SITES}
    contrib = {s: rng.normal(scale=5.0, size=(n, C)) for s in order}
    check_bound(np.max(np.abs(np.stack(list(contrib.values())))), F, len(order))
    masks = _masks(order, (n, C), attempt)
    sent, kept = {}, {}
    for s in order:
        sent[s], kept[s] = mask_rows(contrib[s], rows[s], masks[s], F)
        assert np.all(sent[s][rows[s]] == 0)
    # sent over the wire and back
    wire = [load_array(dump_array(sent[s]), dtype=np.uint64, shape=(n, C)) for s in order]
    total = server_sum(wire)
    true = sum(contrib.values())
    out = {s: unmask_rows(total[rows[s]], kept[s], F) for s in order}
    return true, rows, out, sent, masks


def test_masks_cancel():
    masks = _masks(SITES, (30, 5))
    assert np.all(server_sum(list(masks.values())) == 0)
    assert all(np.count_nonzero(m) > 140 for m in masks.values())


def test_every_site_recovers_its_own_row_sums():
    rng = np.random.default_rng(0)
    true, rows, out, _, _ = _run_row_sums(SITES, 200, 6, 0, rng)
    for s in SITES:
        assert out[s].shape == (rows[s].size, 6)
        assert np.max(np.abs(out[s] - true[rows[s]])) <= len(SITES) * 2.0**-F


def test_restart_with_fresh_masks_over_three_sites():
    rng = np.random.default_rng(1)
    survivors = ["s1", "s2", "s4"]
    true, rows, out, _, masks1 = _run_row_sums(survivors, 120, 4, 1, rng)
    for s in survivors:
        assert np.max(np.abs(out[s] - true[rows[s]])) <= len(survivors) * 2.0**-F
    masks0 = _masks(SITES, (120, 4), attempt=0)
    for s in survivors:
        assert np.mean(masks1[s] == masks0[s]) < 0.01
    # and the underlying pairwise streams differ too (no mask reuse across attempts)
    k0 = _pair_keys("s1", SITES, 0)["s2"]
    k1 = _pair_keys("s1", survivors, 1)["s2"]
    assert k0 != k1
    assert not np.any(prg_uint64(k0, 100) == prg_uint64(k1, 100))


def test_server_view_looks_uniform():
    rng = np.random.default_rng(2)
    n, C = 800, 10
    _, rows, _, sent, _ = _run_row_sums(SITES, n, C, 0, rng)
    for s in SITES:
        others = np.setdiff1d(np.arange(n), rows[s])
        seen = sent[s][others]
        assert seen.size > 4000
        for byte in (0, 7):
            assert _chi2_p(seen, byte) > P_MIN, (s, byte)
    total = server_sum(list(sent.values()))
    for byte in (0, 7):
        assert _chi2_p(total, byte) > P_MIN


def test_unmasked_inputs_fail_the_same_uniformity_test():
    rng = np.random.default_rng(3)
    enc = encode(rng.normal(scale=5.0, size=(800, 10)), F)
    assert _chi2_p(enc, 7) < P_MIN  # top byte of small numbers: 0x00 or 0xFF
    enc_counts = encode(rng.integers(0, 50, size=(800, 10)).astype(float), 0)
    assert _chi2_p(enc_counts, 0) < P_MIN


def test_server_view_differs_when_inputs_differ():
    rng = np.random.default_rng(4)
    n, C = 50, 3
    rows = np.arange(10)
    masks = _masks(SITES, (n, C))
    x = rng.normal(size=(n, C))
    y = x.copy()
    y[20, 1] += 1.0
    sx, _ = mask_rows(x, rows, masks["s1"], F)
    sy, _ = mask_rows(y, rows, masks["s1"], F)
    diff = sx != sy
    assert diff[20, 1] and diff.sum() == 1


def test_prg_full_length_key_only():
    key = bytes(range(32))
    a = prg_uint64(key, 10_000)
    assert a.dtype == np.uint64 and a.shape == (10_000,)
    assert np.array_equal(a, prg_uint64(key, 10_000))
    assert np.array_equal(a[:3], prg_uint64(key, 3))  # prefix-consistent across chunk boundaries
    big = prg_uint64(key, 3 * 8192 + 5)  # several 64 KiB chunks
    assert np.array_equal(big[: a.size], a)
    assert not np.array_equal(prg_uint64(key, 100, stream=1), a[:100])
    assert prg_uint64(key, 0).size == 0
    for bad in (bytes(16), bytes(31), bytes(33), b""):
        with pytest.raises(ProtocolError):
            prg_uint64(bad, 10)
    with pytest.raises(ProtocolError):
        prg_uint64(key, -1)


def test_prg_is_aes256_ctr():
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = bytes(range(32))
    enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    ks = enc.update(bytes(80)) + enc.finalize()
    assert np.array_equal(prg_uint64(key, 10), np.frombuffer(ks, dtype="<u8"))


def test_site_mask_validation():
    keys = _pair_keys("s1", SITES, 0)
    with pytest.raises(ProtocolError, match="do not match"):
        site_mask("s1", {k: v for k, v in keys.items() if k != "s2"}, SITES, (3, 3))
    with pytest.raises(ProtocolError):
        site_mask("s9", keys, SITES, (3, 3))
    with pytest.raises(ProtocolError):
        site_mask("s1", keys, SITES + ["s1"], (3, 3))
    with pytest.raises(ProtocolError):
        site_mask("s1", dict(keys, s2=bytes(16)), SITES, (3, 3))


def test_mask_rows_and_server_sum_validation():
    m = np.zeros((4, 2), dtype=np.uint64)
    with pytest.raises(ProtocolError):
        mask_rows(np.zeros((4, 3)), [0], m, F)
    with pytest.raises(ProtocolError):
        mask_rows(np.zeros((4, 2)), [4], m, F)
    with pytest.raises(ProtocolError):
        mask_rows(np.zeros((4, 2)), [1, 1], m, F)
    with pytest.raises(ProtocolError):
        mask_rows(np.full((4, 2), np.nan), [0], m, F)
    to_server, keep = mask_rows(np.ones((4, 2)), np.array([True, False, True, False]), m, F)
    assert keep.shape == (2, 2) and np.all(to_server[[0, 2]] == 0)
    with pytest.raises(ProtocolError):
        server_sum([])
    with pytest.raises(ProtocolError):
        server_sum([m, np.zeros((4, 3), dtype=np.uint64)])
    with pytest.raises(ProtocolError):
        server_sum([m, np.zeros((4, 2), dtype=np.int64)])
    with pytest.raises(ProtocolError):
        unmask_rows(m, m[:2], F)


def test_shared_mask_secure_sum():
    rng = np.random.default_rng(5)
    C = 1000
    counts = {s: rng.integers(0, 40, size=C).astype(float) for s in SITES}
    masks = _masks(SITES, (C,), purpose="class-counts")
    seed = hashlib.sha256(b"the agreed lsh seed").digest()
    shared = prg_uint64(shared_mask_key(seed, job=JOB, purpose="class-counts", attempt=0), C)
    parts = [mask_vector(counts[s], masks[s], 0, shared_mask=shared if s == SITES[0] else None) for s in SITES]
    server_total = server_sum([load_array(dump_array(p), dtype=np.uint64) for p in parts])
    true = sum(counts.values())
    # every site recovers the exact total
    assert np.array_equal(unmask_total(server_total, 0, shared_mask=shared), true)
    # the server's total is uniform-looking, unlike the plain total
    for byte in (0, 7):
        assert _chi2_p(server_total, byte) > P_MIN
    assert _chi2_p(encode(true, 0), 7) < P_MIN
    # without the shared mask the server would learn the total: that is the ordinary secure sum
    plain = server_sum([mask_vector(counts[s], masks[s], 0) for s in SITES])
    assert np.array_equal(unmask_total(plain, 0), true)
    # a fresh attempt gives a fresh shared mask
    k1 = shared_mask_key(seed, job=JOB, purpose="class-counts", attempt=1)
    assert not np.any(prg_uint64(k1, C) == shared)


def test_masked_sums_travel_exactly_in_the_one_wire_format():
    """Masked values use all 64 bits: the .npy format (xclp.wire) carries them exactly and refuses a
    truncated, padded, retyped, reshaped or oversized body."""
    a = np.arange(12, dtype=np.uint64).reshape(3, 4) * np.uint64(2**60)
    data = dump_array(a)
    b = load_array(data, dtype=np.uint64, shape=(3, 4))
    assert np.array_equal(a, b) and b.dtype == np.uint64
    assert load_array(dump_array(np.zeros((0, 5), dtype=np.uint64)), dtype=np.uint64).shape == (0, 5)
    for bad, kwargs in [(data[:-1], {}), (data + b"\x00", {}), (b"XX" + data[2:], {}), (data[:5], {}),
                        (data, {"shape": (4, 3)}), (data, {"max_bytes": 50}), (dump_array(a.astype(np.int64)), {})]:
        with pytest.raises(ProtocolError):
            load_array(bad, **{"dtype": np.uint64, **kwargs})


def test_mask_rows_sends_only_the_rows_asked_for():
    rng = np.random.default_rng(11)
    n, C = 9, 3
    m = _masks(["s1", "s2"], (n, C))["s1"]
    x = rng.normal(size=(n, C))
    own, send = np.array([0, 1, 2]), np.array([3, 4, 5])  # rows 6..8: a site not in this attempt
    to_server, keep = mask_rows(x, own, m, F, send_rows=send)
    full, keep_full = mask_rows(x, own, m, F)
    assert np.array_equal(keep, keep_full)
    assert np.array_equal(to_server[send], full[send])
    assert np.all(to_server[own] == 0) and np.all(to_server[6:] == 0) and np.all(full[6:] != 0)
    with pytest.raises(ProtocolError, match="own rows"):
        mask_rows(x, own, m, F, send_rows=np.array([2, 3]))
