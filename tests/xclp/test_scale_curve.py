"""Scale (issue 23): the streamed coordinator state gives the lists of all pairs at once; the bench's
plaintext pipeline gives the job's labels (xclp.simulation.run_xclp); the synthetic data's sites do not depend on each other."""

import numpy as np
import pytest

from bench.scale_curve import blocked_pipeline
from bench.synthetic import clustered
from crypto.errors import ProtocolError
from xclp import blocked_graph, blocking, lsh
from xclp import graph as graphs
from xclp.job_params import JobParams
from xclp.simulation import run_xclp as run_blocked  # the blocked job through the machines

L = 256
SEED = bytes(range(32))


@pytest.fixture(scope="module")
def small():
    ds = clustered(sites=4, per_site=150, labelled=0.05, seed=3)
    sites = ds.sites
    codes = np.concatenate([lsh.hash_vectors(ds.X[ds.site == s].astype(np.float64), SEED, L) for s in sites])
    tags = blocking.substring_tags(codes, L, blocking.tag_key(SEED, "job"), tables=16)
    return ds, sites, codes, tags


def state(sites, codes, tags, rounds=1):
    st = blocked_graph.BlockedGraph(sites, [150] * 4, L, 10, 16, 8, rounds)
    for a, s in enumerate(sites):
        st.receive_tags(s, tags[a * 150 : (a + 1) * 150])
        st.codes[s] = codes[a * 150 : (a + 1) * 150]
    return st


def test_candidates_by_table_group_and_descent_in_parts_give_the_lists_of_all_pairs_at_once(small, monkeypatch):
    ds, sites, codes, tags = small
    n = codes.shape[0]
    # reference: every candidate at once (the state before the coordinator streamed them)
    i, j = state(sites, codes, tags).candidate_pairs(sites)
    whole = graphs.knn_from_pairs(n, 10, i, j, blocking.pair_hamming(codes, i, j))
    i2, j2 = blocking.neighbour_pairs(whole.idx, np.sort(i * n + j), n, np.repeat(np.arange(4), 150))
    whole = graphs.merge_knn(whole, i2, j2, blocking.pair_hamming(codes, i2, j2))
    # streamed: 3 tables a group, merges of 500 pairs, the descent round in 4 parts
    monkeypatch.setattr(blocked_graph, "GROUP_PAIRS", 3 * n * 7 // 2)
    monkeypatch.setattr(blocked_graph, "KNN_CHUNK", 500)
    st = state(sites, codes, tags)
    assert len(st.table_groups()) == 6
    st.measure_candidates(sites)
    assert st.measure_descent(sites, parts=4) > 0 and st.measure_descent(sites) == 0
    got = st.knn(sites)
    assert np.array_equal(got.idx, whole.idx) and np.array_equal(got.dist, whole.dist)
    assert st.pair_count() >= i.size + i2.size  # measurements, repeats counted
    with pytest.raises(ProtocolError, match="already hold pairs"):
        st.knn(sites[:3])  # the lists cannot forget a site whose pairs they merged


def test_candidate_table_groups_on_a_pool_or_dask_give_the_serial_lists(small, monkeypatch):
    """The candidate step's table groups as executor tasks, each starting from the lists as they
    are (the within-site lists here): the same lists as one process, entry for entry."""
    distributed = pytest.importorskip("distributed")
    from xclp.executor import make_executor

    ds, sites, codes, tags = small
    n = codes.shape[0]
    monkeypatch.setattr(blocked_graph, "GROUP_PAIRS", 3 * n * 7 // 2)  # groups of 3 tables; 8 tables a worker
    site_of = np.repeat(np.arange(4), 150)

    def run(live, executor=None):
        st = state(sites, codes, tags)
        for a, s in enumerate(live):  # each site's own lists first, by its own pairs
            own = blocked_graph.local_knn(codes[a * 150 : (a + 1) * 150], L, tags[a * 150 : (a + 1) * 150], 6, 8, 0)
            st.receive_intra_knn(s, own.idx, np.where(own.idx >= 0, own.dist, 0))
        count = st.measure_candidates(live, executor)
        return st.knn(live), count, st.pair_count()

    serial, count, measured = run(sites)
    assert count > 0 and np.isin(site_of[serial.idx[serial.idx >= 0]], [0]).mean() < 0.9  # pairs across sites
    with make_executor("process", workers=2) as ex:
        pool = run(sites, ex)
        part_serial, part_pool = run(sites[:3]), run(sites[:3], ex)  # one site absent: its points join no pair
    with distributed.LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client, make_executor("dask", client=client) as ex:
        assert ex.workers == 2
        dask = run(sites, ex)
    for got, want in ((pool, (serial, count, measured)), (dask, (serial, count, measured)), (part_pool, part_serial)):
        assert np.array_equal(got[0].idx, want[0].idx) and np.array_equal(got[0].dist, want[0].dist)
        # measurements: a pair found in two groups counts twice, and a worker's groups are cut from its
        # own run of tables, so the count differs from the serial grouping's while the lists do not
        assert got[1] == got[2] > 0


def test_the_bench_pipeline_gives_the_labels_of_run_blocked():
    ds = clustered(sites=4, per_site=150, labelled=0.05, seed=1)
    p = JobParams(job_id="scale-test", n_classes=10, bits=L, graph="blocked", blocking_tables=16, max_bucket=16,
                  influence_rank=16)
    ref = run_blocked(ds, p, seed=0)
    got = blocked_pipeline(ds, p, seed=0)
    assert np.array_equal(got["labels"], ref.labels)
    assert set(got["sizes"]["site0"]) >= {"tags", "influence", "row_sums_up"}


def test_the_bench_pipeline_on_a_process_pool_gives_the_same_labels(monkeypatch):
    """Sites' steps in pool workers, the coordinator's candidate step on the same pool."""
    from xclp.executor import make_executor

    ds = clustered(sites=4, per_site=150, labelled=0.05, seed=1)
    p = JobParams(job_id="scale-test", n_classes=10, bits=L, graph="blocked", blocking_tables=16, max_bucket=16,
                  influence_rank=16)
    monkeypatch.setattr(blocked_graph, "GROUP_PAIRS", 3 * 600 * 15 // 2)  # groups of 3 tables: the step splits
    ref = blocked_pipeline(ds, p, seed=0)
    with make_executor("process", workers=2) as ex:
        got = blocked_pipeline(ds, p, seed=0, executor=ex)
    assert "sites_lsh_tags_within_site_pool" in got["timings"] and len(got["coordinator"].blocked.table_groups()) > 1
    assert np.array_equal(got["labels"], ref["labels"])
    assert got["sizes"] == ref["sizes"]


def test_synthetic_sites_are_their_own_and_labelled_as_asked():
    a = clustered(sites=3, per_site=400, labelled=0.01, seed=5)
    b = clustered(sites=5, per_site=400, labelled=0.01, seed=5)
    assert a.X.shape == (1200, 128) and a.X.dtype == np.float32
    assert np.array_equal(a.X, b.X[:1200]) and np.array_equal(a.y_true, b.y_true[:1200])
    assert [int((a.y[a.site == s] >= 0).sum()) for s in a.sites] == [4, 4, 4]
    labelled = a.y >= 0
    assert np.array_equal(a.y[labelled], a.y_true[labelled])


def test_a_live_site_without_codes_is_refused_on_a_pool_only_where_it_has_a_pair(small, monkeypatch):
    """The pool's candidate step refuses a site's missing codes as the serial one does: only when one of
    its points is in a candidate pair (a site whose points share no bucket with another site's has none
    to measure), with the serial lists otherwise."""
    from xclp.executor import make_executor

    ds, sites, codes, tags = small
    monkeypatch.setattr(blocked_graph, "GROUP_PAIRS", 3 * codes.shape[0] * 7 // 2)  # several groups a worker
    alone = tags.copy()  # the last site's tags are its own: its points join no cross-site bucket
    alone[450:] = np.arange(450, 600, dtype=np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15) + np.uint64(7)

    def run(tags, executor=None):
        st = state(sites, codes, tags)
        del st.codes[sites[-1]]  # live, but it sent no codes
        count = st.measure_candidates(sites, executor)
        return st.knn(sites), count

    serial, count = run(alone)
    assert count > 0
    with make_executor("process", workers=2) as ex:
        pool, _ = run(alone, ex)
        assert np.array_equal(pool.idx, serial.idx) and np.array_equal(pool.dist, serial.dist)
        for executor in (None, ex):  # with its own tags it has pairs: both refuse, and say whose codes
            with pytest.raises(ProtocolError, match=r"codes missing from \['site3'\]"):
                run(tags, executor)
