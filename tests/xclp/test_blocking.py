"""The blocked graph (issue 23): keyed tags, candidate pairs, the kNN lists they give, and the job."""

import numpy as np
import pytest

from xclp import blocking, lsh
from xclp import graph as graphs
from xclp.job_params import JobParams
from xclp.protocol import CoordinatorSession
from xclp.simulation import run_xclp, unlabelled_accuracy
from xclp.splits import simulate_sites

SEED = bytes(range(32))
L = 256


@pytest.fixture(scope="module")
def codes(digits):
    X, _ = digits
    return lsh.hash_vectors(X[:400].astype(np.float64), SEED, L)


def exact_knn(codes, k=10):
    n = codes.shape[0]
    acc = graphs.KnnAccumulator(n, k)
    acc.add_block(np.arange(n), np.arange(n), lsh.hamming_matrix(codes, codes, L))
    return acc


def test_every_pair_a_candidate_gives_the_exact_graph(codes):
    n = codes.shape[0]
    # one table whose tag every point shares, and no cap: every pair is a candidate
    i, j = blocking.bucket_pairs(np.zeros((n, 1), dtype=np.uint64), max_bucket=n)
    assert i.size == n * (n - 1) // 2
    lists = graphs.knn_from_pairs(n, 10, i, j, blocking.pair_hamming(codes, i, j))
    acc = exact_knn(codes)
    assert np.array_equal(lists.idx, acc.idx) and np.array_equal(lists.dist, acc.dist)
    params = graphs.GraphParams()
    a = graphs.graph_from_hamming_blocks(lists, L, params)
    b = graphs.graph_from_hamming_blocks(acc, L, params)
    assert abs(a - b).max() == 0


def _some_pairs_and_their_lists(codes, rng):
    """30 % of all pairs, their distances, and the kNN lists (k = 10) of them at once."""
    n = codes.shape[0]
    i, j = blocking.bucket_pairs(np.zeros((n, 1), dtype=np.uint64), max_bucket=n)
    keep = rng.random(i.size) < 0.3
    i, j = i[keep], j[keep]
    d = blocking.pair_hamming(codes, i, j)
    return i, j, d, graphs.knn_from_pairs(n, 10, i, j, d)


def test_merging_chunks_gives_the_lists_of_all_pairs(codes, rng):
    n = codes.shape[0]
    i, j, d, whole = _some_pairs_and_their_lists(codes, rng)
    lists = graphs.knn_from_pairs(n, 10, *(np.zeros(0, np.int64),) * 3)
    for part in np.array_split(np.arange(i.size), 5):
        lists = graphs.merge_knn(lists, i[part], j[part], d[part])
    lists = graphs.merge_knn(lists, i[:50], j[:50], d[:50])  # pairs seen twice change nothing
    assert np.array_equal(lists.idx, whole.idx) and np.array_equal(lists.dist, whole.dist)


def test_the_blocked_graph_merges_its_buffer_a_chunk_at_a_time_into_the_lists_of_all_pairs(codes, rng, monkeypatch):
    """BlockedGraph merges what it buffered MERGE_CHUNK pairs at a time (the merge's temporaries bounded):
    the lists of all pairs at once, and a snapshot of them restored elsewhere is the same lists."""
    from xclp import blocked_graph

    n = codes.shape[0]
    i, j, d, whole = _some_pairs_and_their_lists(codes, rng)
    monkeypatch.setattr(blocked_graph, "MERGE_CHUNK", 997)
    monkeypatch.setattr(blocked_graph, "KNN_CHUNK", 5_000)
    g = blocked_graph.BlockedGraph(["a", "b"], [n // 2, n - n // 2], L, 10, 4, 8, 0)
    for part in np.array_split(np.arange(i.size), 7):
        g._add_global(i[part], j[part], d[part].astype(np.int64))
    got = g.knn(g.sites)
    assert np.array_equal(got.idx, whole.idx) and np.array_equal(got.dist, whole.dist)
    assert g.pair_count() == i.size
    other = blocked_graph.BlockedGraph(["a", "b"], [n // 2, n - n // 2], L, 10, 4, 8, 0)
    other._add_global(i[:10], j[:10], d[:10].astype(np.int64))  # (replaced by the snapshot)
    other.restore_lists(g.lists_snapshot())
    again = other.knn(other.sites)
    assert np.array_equal(again.idx, whole.idx) and other.pair_count() == i.size
    with pytest.raises(Exception, match="another graph"):
        blocked_graph.BlockedGraph(["a"], [n - 1], L, 10, 4, 8, 0).restore_lists(g.lists_snapshot())


def test_pair_hamming_matches_the_dense_matrix(codes, rng):
    i, j = rng.integers(0, codes.shape[0], 500), rng.integers(0, codes.shape[0], 500)
    assert np.array_equal(blocking.pair_hamming(codes, i, j), lsh.hamming_matrix(codes, codes, L)[i, j])


def test_blocking_finds_most_neighbours_with_few_pairs(codes):
    n = codes.shape[0]
    tags = blocking.substring_tags(codes, L, blocking.tag_key(SEED, "job"), tables=32)
    i, j = blocking.bucket_pairs(tags, max_bucket=16)
    lists = graphs.knn_from_pairs(n, 10, i, j, blocking.pair_hamming(codes, i, j))
    i2, j2 = blocking.neighbour_pairs(lists.idx, np.sort(i * n + j), n)
    assert not np.isin(i2 * n + j2, i * n + j).any()  # a descent round proposes only new pairs
    i, j = np.r_[i, i2], np.r_[j, j2]
    lists = graphs.knn_from_pairs(n, 10, i, j, blocking.pair_hamming(codes, i, j))
    recall = blocking.recall_at_k(lists.idx, exact_knn(codes).idx)
    assert recall >= 0.9, recall
    assert i.size < 0.6 * n * (n - 1) / 2


def test_the_coordinator_sees_keyed_tags_only(codes):
    n = codes.shape[0]
    key = blocking.tag_key(SEED, "job-1")
    tags = blocking.substring_tags(codes, L, key, tables=16)
    # the raw 16-bit substrings, as integers: no tag equals one (a tag is 64 pseudo-random bits)
    raw = np.packbits(lsh.unpack(codes, L).reshape(n, 16, 16), axis=2).view(">u2")[..., 0].astype(np.uint64)
    assert not np.isin(tags, raw).any()
    # equal substrings still give equal tags (the matching works) ...
    assert np.array_equal(tags[:, 0][:, None] == tags[:, 0][None, :], raw[:, 0][:, None] == raw[:, 0][None, :])
    # ... and tags of another seed, or of another job under the same seed, never match these
    other_seed = bytes(reversed(SEED))
    for k in (blocking.tag_key(other_seed, "job-1"), blocking.tag_key(SEED, "job-2")):
        assert not np.isin(blocking.substring_tags(codes, L, k, tables=16), tags).any()


def test_job_params_graph_option():
    assert JobParams(job_id="j", n_classes=3).graph == "exact"  # existing results do not change
    assert JobParams(job_id="j", n_classes=3, graph="auto").graph_mode(1000) == "exact"
    assert JobParams(job_id="j", n_classes=3, graph="auto").graph_mode(10**6) == "blocked"
    for bad in ({"graph": "fast"}, {"graph": "blocked", "similarity": "exact"},
                {"graph": "blocked", "blocking_tables": 0}, {"graph": "blocked", "max_bucket": 1}):
        with pytest.raises(ValueError):
            JobParams(job_id="j", n_classes=3, **bad).validate()
    with pytest.raises(Exception, match="exact"):
        CoordinatorSession(JobParams(job_id="j", n_classes=3)).candidate_blocks(["a"])


@pytest.fixture(scope="module")
def digits_sites(digits):
    X, y = digits
    return simulate_sites(X[:1000].astype(np.float64), y[:1000], 4, "dirichlet:0.5", 0.1, seed=0)


def test_blocked_job_agrees_with_the_exact_job(digits_sites):
    ds = digits_sites
    seen = []
    exact = run_xclp(ds, JobParams(job_id="j", n_classes=10, bits=L))
    blocked = run_xclp(ds, JobParams(job_id="j", n_classes=10, bits=L, graph="blocked", blocking_tables=32,
                                     max_bucket=16, influence_rank=48),
                       tap=lambda party, phase, data: seen.append((party, phase, len(data))))
    assert blocked.solver == "push+spectral" and exact.solver != "push+spectral"
    assert np.mean(blocked.labels == exact.labels) >= 0.97
    assert unlabelled_accuracy(ds, blocked.labels) >= unlabelled_accuracy(ds, exact.labels) - 0.02
    st = blocked.coordinator.blocked
    assert blocking.recall_at_k(st.knn(st.sites).idx, exact_knn_of_job(ds, st).idx) >= 0.95
    # no n × |L| matrix: each site's columns are sparse entries plus the shared n × r basis
    for cols in blocked.coordinator.influence.values():
        n, l = cols.shape
        assert cols.x.nnz < 0.25 * n * l and cols.basis.shape == (n, 48) and cols.coef.shape == (48, l)


def exact_knn_of_job(ds, st):
    """The all-pairs lists over the blocked job's own codes (the coordinator kept them: plaintext)."""
    codes = np.concatenate([st.codes[s] for s in st.sites])
    n = codes.shape[0]
    acc = graphs.KnnAccumulator(n, st.k)
    acc.add_block(np.arange(n), np.arange(n), lsh.hamming_matrix(codes, codes, st.n_bits))
    return acc


def test_packed_blocks_party_and_receive_packed_blocks_refuse_what_is_not_one_pair_of_theirs():
    from crypto.errors import ProtocolError
    from crypto.hamming_api import exchange
    from xclp.announce import decode_roster, encode_roster
    from xclp.protocol import SiteSession

    rng = np.random.default_rng(0)
    names = ("a", "b", "c")
    params = JobParams(job_id="j", n_classes=2, bits=64, k=3, crypto="lattice", graph="blocked").validate()
    sess = {s: SiteSession(params, s, rng.normal(size=(12, 5)), np.r_[0, 1, np.full(10, -1)]) for s in names}
    coord = CoordinatorSession(params)
    for s, x in sess.items():
        coord.register(s, x.announce())
    roster = encode_roster([sess[s].announce() for s in coord.order])
    for x in sess.values():
        x.set_roster(decode_roster(roster))
    out = {s: x.seed_messages() for s, x in sess.items()}
    for s, x in sess.items():
        x.receive_seed({p: out[p][s] for p in sess if p != s}, list(names))
        coord.receive_counts(s, x.counts_message(list(names)))
    for x in sess.values():
        x.receive_counts(coord.counts_total(list(names)))
    ab = [blocking.Block("a", "b", np.array([0, 3]), np.array([1])), blocking.Block("a", "b", np.array([5]), np.array([1, 2]))]
    with pytest.raises(ProtocolError, match="must all be of the pair"):
        sess["a"].packed_blocks_party("b", ab + [blocking.Block("a", "c", np.array([0]), np.array([1]))])
    with pytest.raises(ProtocolError, match="must all be of the pair"):
        sess["c"].packed_blocks_party("a", ab)
    with pytest.raises(ProtocolError, match="rows outside"):
        sess["a"].packed_blocks_party("b", [blocking.Block("a", "b", np.array([12]), np.array([1]))])
    shares = exchange(sess["a"].packed_blocks_party("b", ab), sess["b"].packed_blocks_party("a", ab))
    with pytest.raises(ProtocolError, match="several pairs"):
        coord.receive_packed_blocks(ab + [blocking.Block("a", "c", np.array([0]), np.array([1]))], *shares)
    coord.receive_packed_blocks(ab, *shares)
    assert coord.blocked.pair_count() == 4  # (0,1), (3,1), (5,1), (5,2): each once
    paillier = SiteSession(JobParams(job_id="j", n_classes=2, bits=64, crypto="paillier", graph="blocked"), "a",
                           rng.normal(size=(12, 5)), np.r_[0, 1, np.full(10, -1)])
    with pytest.raises(ProtocolError, match="one protocol per block"):
        paillier.packed_blocks_party("b", ab)


def _reference_tag(key: bytes, code: np.ndarray, n_bits: int, tables: int, t: int) -> int:
    """One tag by hand, block by block (the module docstring's definition, not its vectorised code)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    bounds = blocking.substring_bounds(n_bits, tables)
    bit_list = np.unpackbits(code, count=n_bits)[bounds[t] : bounds[t + 1]]
    s = int(bit_list.size)
    width = max(-(-(int(bounds[u + 1] - bounds[u])) // 8) for u in range(tables))
    sub = int("".join(map(str, bit_list)), 2) << (8 * width - s)  # big-endian, zero bits after
    msg = b"".join(v.to_bytes(2, "big") for v in (n_bits, tables, t, s)) + sub.to_bytes(width, "big")
    msg += bytes(-len(msg) % 16)
    state = bytes(16)
    for c in range(0, len(msg), 16):
        enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        state = enc.update(bytes(a ^ b for a, b in zip(state, msg[c : c + 16]))) + enc.finalize()
    return int.from_bytes(state[:8], "big")


@pytest.mark.parametrize("n_bits,tables", [(L, 16), (L, 3), (250, 7)])  # one block; CBC chains; unequal s
def test_tags_are_the_keyed_prf_of_table_and_substring(codes, n_bits, tables):
    key = blocking.tag_key(SEED, "job-1")
    tags = blocking.substring_tags(codes[:40], n_bits, key, tables=tables)
    for i in (0, 17, 39):
        for t in (0, tables // 2, tables - 1):
            assert int(tags[i, t]) == _reference_tag(key, codes[i], n_bits, tables, t), (i, t)


def test_equal_substrings_equal_tags_only_in_the_same_table():
    key = blocking.tag_key(SEED, "job-1")
    # two codes that agree on the first half of their bits only; and a code whose every substring is equal
    a = np.zeros((1, L // 8), np.uint8)
    b = a.copy()
    b[0, L // 16 :] = 0xFF
    tags = blocking.substring_tags(np.r_[a, b], L, key, tables=16)
    assert np.array_equal(tags[0, :8], tags[1, :8]) and not np.isin(tags[0, 8:], tags[1, 8:]).any()
    # code a: the same (all-zero) substring in every table, yet 16 different tags (t is in the message)
    assert np.unique(tags[0]).size == 16
    assert not np.isin(blocking.substring_tags(a, L, blocking.tag_key(SEED, "job-2"), tables=16), tags).any()


def _plain_chunks(tags, max_bucket):
    """The chunking rule written as a loop over buckets (what `table_chunks` vectorises)."""
    n, m = tags.shape
    out = []
    for t in range(m):
        order = np.lexsort((np.arange(n), tags[:, (t + 1) % m], tags[:, t]))
        s = 0
        while s < n:
            e = s
            while e < n and tags[order[e], t] == tags[order[s], t]:
                e += 1
            for c in range(s, e, max_bucket):
                chunk = order[c : min(e, c + max_bucket)]
                if chunk.size >= 2:
                    out.append((t, sorted(chunk.tolist())))
            s = e
    return out


def test_bucket_chunks_and_pairs_are_those_of_a_plain_loop(rng, monkeypatch):
    # few tag values: buckets of every size, many above the cap, cut into chunks
    tags = rng.integers(0, 6, (300, 4)).astype(np.uint64)
    site_of = rng.integers(0, 3, 300)
    expected = _plain_chunks(tags, 7)
    assert [(b.table, b.members.tolist()) for b in blocking.buckets(tags, 7)] == expected
    want = sorted({(i, j) for _, mem in expected for x, i in enumerate(mem) for j in mem[x + 1 :]
                   if site_of[i] != site_of[j]})
    for dedupe in (10**9, 50):  # deduplicated once at the end, and many times as the keys come
        monkeypatch.setattr(blocking, "DEDUPE_KEYS", dedupe)
        i, j = blocking.bucket_pairs(tags, 7, site_of, cross_only=True)
        assert list(zip(i.tolist(), j.tolist())) == want
