"""A masked blocked job's coordinator plans from the candidate entries (blocking.split_by_site over
bucket_pairs, BlockedGraph.candidate_site_pairs / descent_site_pairs), not from a block per bucket chunk:
the same entries in the same order as the blocks' (`block_pairs`), the same PairViews, the same plan
messages byte for byte, and the same job — on random bucket layouts with empty tables, one-point
buckets, points in many buckets and pairs repeated across buckets."""

import numpy as np
import pytest
from prediction_rig import drive, finish, machines

from xclp import blocking
from xclp.block_protocol import encode_plan, plans
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.prediction_job import MemoryMailbox
from xclp.protocol import CoordinatorSession
from xclp.splits import simulate_sites

from .test_blocked_job import BLOCKED
from .test_blocking import _plain_chunks


def _layout(rng, n_sites: int, tables: int, cap: int):
    """Tags with every kind of bucket: per table, few values (big buckets, cut at the cap), all distinct
    (a table without a bucket), or mostly distinct (one-point buckets beside small ones); a clique of
    points with one tag in every table (their pairs repeat in every table's chunks)."""
    sizes = rng.integers(1, 40, n_sites)
    sizes[0] = 1  # a site of one point
    n = int(sizes.sum())
    tags = np.empty((n, tables), np.uint64)
    for t in range(tables):
        kind = rng.integers(0, 3)
        values = (rng.integers(0, 4, n) if kind == 0 else np.arange(n) if kind == 1 else rng.integers(0, n, n))
        tags[:, t] = values.astype(np.uint64) + np.uint64(t << 32)
    clique = rng.choice(n, min(n, cap + 3), replace=False)
    tags[clique] = np.uint64(1 << 62)
    sites = [f"s{x}" for x in range(n_sites)]
    site_of = np.repeat(np.arange(n_sites), sizes)
    offsets = dict(zip(sites, np.r_[0, np.cumsum(sizes)[:-1]].tolist()))
    return tags, site_of, sites, offsets, dict(zip(sites, sizes.tolist()))


def _plain_entries(tags, site_of, sites, offsets, cap):
    """Per pair of sites, the distinct entries of every chunk, by a loop over chunks and points."""
    out: dict = {}
    for _, mem in _plain_chunks(tags, cap):
        for x, p in enumerate(mem):
            for q in mem[x + 1 :]:
                if site_of[p] != site_of[q]:
                    a, b = sites[site_of[p]], sites[site_of[q]]
                    out.setdefault((a, b), set()).add((p - offsets[a], q - offsets[b]))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("seed", range(12))
def test_entries_views_and_plans_equal_the_blocks_ones_on_random_layouts(seed):
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(2, 9))
    tags, site_of, sites, offsets, sizes = _layout(rng, int(rng.integers(2, 6)), int(rng.integers(1, 6)), cap)
    blocks = blocking.candidate_blocks(tags, site_of, sites, offsets, cap)
    entries = blocking.split_by_site(*blocking.bucket_pairs(tags, cap, site_of, cross_only=True),
                                     site_of, sites, offsets)
    assert sorted(entries) == sorted(blocks)
    want = _plain_entries(tags, site_of, sites, offsets, cap)
    assert sorted(want) == sorted(entries)
    for (a, b), bl in blocks.items():
        i, j = blocking.block_pairs(bl, sizes[a], sizes[b])
        got = entries[(a, b)]
        # the same entries in the same order (sorted by (i, j), each once) as the blocks', and a plain loop's
        assert np.array_equal(got.i, i) and np.array_equal(got.j, j), (a, b)
        assert list(zip(got.i.tolist(), got.j.tolist())) == want[(a, b)]
    old, new = plans(blocks, sizes, None, pairs=True), plans(entries, sizes, None, pairs=True)
    assert sorted(old) == sorted(new)
    for s in old:
        assert encode_plan(new[s]) == encode_plan(old[s])  # every message the sites get, byte for byte


def test_no_pairs_no_entries_and_entries_plan_only_a_run_over_entries():
    site_of = np.array([0, 1, 1])
    assert blocking.split_by_site(np.zeros(0, np.int64), np.zeros(0, np.int64), site_of, ["a", "b"],
                                  {"a": 0, "b": 1}) == {}
    with pytest.raises(ValueError, match="one site"):
        blocking.split_by_site(np.array([1]), np.array([2]), site_of, ["a", "b"], {"a": 0, "b": 1})
    entries = {("a", "b"): blocking.SitePairs(np.array([0]), np.array([1]))}
    with pytest.raises(ValueError, match="only a run over candidate entries"):
        plans(entries, {"a": 1, "b": 2}, None)


@pytest.fixture(scope="module")
def ds():
    X, y = load_arrays("digits", limit=300, seed=5)
    return simulate_sites(X, y, 3, "iid", 0.2, seed=5)


def test_a_masked_job_planned_from_entries_sends_the_plans_of_blocks(ds, monkeypatch):
    params = JobParams(job_id="sp", crypto="masked", **{**BLOCKED, "descent_rounds": 2})

    def run():
        coord, sites = machines(ds, params)
        mail = MemoryMailbox()
        drive(coord, sites, mail, lambda st: st.reached("row_sums"))
        assert coord.state.attempts["hamming"] == 3 and not coord.state.dropped  # the candidates and two descent rounds
        planned = {k: v for k, v in mail.messages.items() if k[2].startswith("blocks/")}
        labels = finish(coord, sites, mail)
        # every distance in, the rounds' decoded plans and combined distances were let go (_release_rounds)
        assert coord._plans == {} and coord._pair_cache == {} and coord.coordinator.masked_codes == {}
        return planned, labels

    new_plans, new_labels = run()
    # the bookkeeping before: a block per bucket chunk (round 1), one-row blocks (descent rounds)
    monkeypatch.setattr(CoordinatorSession, "candidate_site_pairs", CoordinatorSession.candidate_blocks)
    monkeypatch.setattr(CoordinatorSession, "descent_site_pairs", CoordinatorSession.descent_blocks)
    old_plans, old_labels = run()
    assert sorted(new_plans) == sorted(old_plans) and len(new_plans) == 9
    assert all(new_plans[k] == old_plans[k] for k in old_plans)
    assert sorted(new_labels) == sorted(old_labels) and all(np.array_equal(new_labels[s], old_labels[s]) for s in old_labels)
