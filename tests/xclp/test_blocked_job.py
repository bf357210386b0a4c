"""A blocked-graph job in the one order (issue 23): its hamming rounds run by the machines of
xclp/prediction_job.py — round 0's tags and within-site lists, rounds of candidate blocks each run as
one pair protocol per pair of sites (xclp/block_protocol.py), then the graph — with the exact graph's
blame, a state that saves to bytes mid-phase, and labels that do not depend on the protocol."""

import numpy as np
import pytest
from prediction_rig import drive, finish, labels_equal_plaintext, machines, round_views

from crypto import lattice_blocks, lattice_hamming
from xclp import graph as graphs
from xclp import lsh
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Inadmissible, Send
from xclp.prediction_job import MemoryMailbox, PredictCoordinator, PredictState, admit
from xclp.simulation import run_xclp
from xclp.splits import simulate_sites

BLOCKED = dict(n_classes=10, bits=64, k=5, graph="blocked", blocking_tables=4, max_bucket=6, influence_rank=0,
               descent_rounds=1)


@pytest.fixture(scope="module")
def ds():
    X, y = load_arrays("digits", limit=90, seed=3)
    return simulate_sites(X, y, 3, "iid", 0.2, seed=3)


def test_every_pair_a_candidate_gives_the_exact_graph_through_the_machines(ds, monkeypatch):
    # one table whose tag every point shares and a cap above n: one block per pair of sites, run by the
    # lattice protocol in the machines' round 1; the kNN lists are those of all pairs of the same codes
    from xclp import blocking

    monkeypatch.setattr(blocking, "substring_tags", lambda bits, n_bits, key, tables: np.zeros(
        (bits.shape[0], tables), np.uint64))
    params = JobParams(job_id="all", crypto="lattice", **{**BLOCKED, "blocking_tables": 1, "max_bucket": 1000})
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    finish(coord, sites, mail)
    # round 1 (every pair's one block), then at most the descent rounds: the coordinator keeps kNN lists,
    # not every measured pair (O(n·k) memory), so a descent round may re-measure a pair outside the lists
    assert 1 <= coord.state.attempts["hamming"] <= 1 + params.descent_rounds
    st = coord.coordinator.blocked
    codes = np.concatenate([sites[s].session.bits for s in st.sites])
    acc = graphs.KnnAccumulator(ds.n, params.k)
    acc.add_block(np.arange(ds.n), np.arange(ds.n), lsh.hamming_matrix(codes, codes, params.bits))
    lists = st.knn(st.sites)
    assert np.array_equal(lists.dist, acc.dist)
    assert st.pair_count() >= sum(  # measurements: every cross-site pair, some again in a descent round
        int((ds.site == a).sum() * (ds.site == b).sum()) for i, a in enumerate(ds.sites) for b in ds.sites[i + 1:])


def test_lattice_labels_equal_plaintext_and_a_saved_state_goes_on_mid_phase(ds):
    params = JobParams(job_id="blk", crypto="lattice", **BLOCKED)
    plain = run_xclp(ds, JobParams(job_id="blk", **BLOCKED))
    assert plain.solver == "push+spectral" and plain.job.attempts["hamming"] == 0  # plaintext: round 0 only
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    drive(coord, sites, mail, lambda st: st.phase == "hamming" and st.attempt == 1)  # the tags' blocks sent
    # a coordinator restarted mid-phase from its saved state: the round, and the rest from the mailbox
    saved = coord.state.to_bytes()
    assert len(saved) < 1000
    coord = PredictCoordinator(params, PredictState.from_bytes(saved))
    labels = finish(coord, sites, mail)
    assert coord.state.attempts["hamming"] >= 1 and coord.state.dropped == {}
    ref = run_xclp(ds, JobParams(job_id="blk", **BLOCKED),
                   contributions={s: sites[s].session.my_contribution() for s in ds.sites})
    for s, got in labels.items():
        assert np.array_equal(got, ref.predictions[s].labels), s


def test_a_pair_whose_blocks_do_not_combine_is_blamed_and_the_job_goes_on(ds):
    params = JobParams(job_id="bad", crypto="lattice", **BLOCKED)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()

    def send(m: Send):  # site2 spoils its shares of round 1 (its pairs with both others)
        if m.sender == "site2" and m.topic.startswith("bshare/1/"):
            # the first byte of the blocks' digest each share carries: the coordinator finds a share for
            # another list of blocks, always. (Zeroing payload bytes instead changed the masks, and a
            # pair with few candidates still combined into values ≤ L about one run in twelve.)
            at = lattice_hamming._HDR.size + lattice_blocks._SHARE.size  # (the share's layout: its header, then these)
            body = bytearray(m.body)
            body[at] ^= 0xFF
            m = Send(m.sender, m.recipient, m.topic, bytes(body))
        mail.put(m)

    drive(coord, sites, mail, lambda st: bool(st.dropped) or st.reached("row_sums"), send=send)
    assert coord.state.dropped == {"site2": "hamming"}  # the site in both incomplete pairs
    finish(coord, sites, mail)
    assert coord.state.graph_sites == ["site0", "site1"]


def test_a_site_silent_in_a_round_is_dropped_at_its_deadline(ds):
    params = JobParams(job_id="gone", crypto="lattice", **BLOCKED)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    drive(coord, sites, mail, lambda st: st.phase == "hamming" and st.attempt == 1)
    drive(coord, sites, mail, lambda st: bool(st.dropped) or st.reached("row_sums"), silent={"site1"})
    assert coord.state.dropped == {"site1": "hamming"}
    labels = finish(coord, sites, mail)
    assert sorted(labels) == ["site0", "site2"]


def test_admit_the_blocked_topics():
    st = PredictState(sites=["a", "b", "c"], live=["a", "b", "c"], phase="hamming", attempt=1)
    assert admit(st, "a", "b", "bpair/1/a/b/0", blocked=True) == "bpair"
    assert admit(st, "b", COORDINATOR, "bshare/1/a/b", blocked=True) == "bshare"
    for site, to, topic, conflict in (("a", COORDINATOR, "tags", True),  # round 0's, in round 1
                                      ("a", COORDINATOR, "bshare/2/a/b", True),  # a later round
                                      ("a", COORDINATOR, "intra", False),  # the exact graph's
                                      ("c", "a", "bpair/1/a/b/0", False),  # not its pair
                                      ("a", "a", "bpair/1/a/b/0", False),  # to itself
                                      ("b", COORDINATOR, "bshare/1/b/a", False),  # out of roster order
                                      ("a", "b", "bpair/0/a/b/0", False)):
        with pytest.raises(Inadmissible) as exc:
            admit(st, site, to, topic, blocked=True)
        assert exc.value.conflict == conflict, topic
    with pytest.raises(Inadmissible):
        admit(st, "a", COORDINATOR, "tags", blocked=False)


def test_each_site_is_planned_its_view_of_each_pair_and_no_row_of_its_peer(ds):
    # lattice: the coordinator's blocks/1 message gives each site, per peer, its view of the pair's ONE
    # packed run — A (earlier in the order): per group the count of B's rows and each anonymous row's
    # positions among A's points; B: its own rows — and a site refuses a view that is not its own
    from crypto.errors import ProtocolError
    from crypto.lattice_blocks import BlockLayout, BlockView
    from xclp.prediction_job import KEEP_PAD

    params = JobParams(job_id="views", crypto="lattice", **BLOCKED)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    drive(coord, sites, mail, lambda st: st.phase == "hamming" and st.attempt == 1)
    order = coord.state.order
    n, pairs = round_views(ds, coord, mail)
    for a, b, va, vb in pairs:
        assert isinstance(va, BlockView) and isinstance(vb, BlockView) and (va.side, vb.side) == ("a", "b")
        assert set(va.arrays()) == {"meta", "ks", "counts", "keys", "key_ptr"}  # no row of b's
        assert set(vb.arrays()) == {"meta", "ks", "counts", "rows"}  # its own rows only
        assert (va.n_a, va.n_b) == (vb.n_a, vb.n_b) == (n[a], n[b])
        # the coordinator combines the round from the views it sent; they are a function of the
        # candidate entries and the padding rule (round 1: a group met by ≥ KEEP_PAD of B's rows runs
        # all of them, for the descent rounds' kept results)
        run = coord._plan(mail, 1, order)[(a, b)]
        assert (run.view_a.digest, run.view_b.digest) == (va.digest, vb.digest)
        layout = BlockLayout([(x.rows_a, x.rows_b) for x in run.blocks()], n[a], n[b], pad=KEEP_PAD)
        assert (layout.view_a().digest, layout.view_b().digest) == (va.digest, vb.digest)
        with pytest.raises(ProtocolError, match="not ours"):
            sites[a].session.blocks_party(b, vb)
        with pytest.raises(ProtocolError, match="not ours"):
            sites[b].session.blocks_party(a, va)
    assert len(pairs) >= 2
    labels_equal_plaintext(ds, sites, finish(coord, sites, mail), JobParams(job_id="views", **BLOCKED))


def test_a_protocol_that_does_not_pack_runs_one_run_per_block_in_the_machines(ds):
    # OT: each site is planned its own rows of each block (the per-block BlockParty); the labels are the
    # plaintext job's
    from xclp.block_protocol import decode_plan
    from xclp.prediction_job import Topic

    params = JobParams(job_id="ot", crypto="ot", **BLOCKED)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    drive(coord, sites, mail, lambda st: st.phase == "hamming" and st.attempt == 1)
    s = coord.state.order[0]
    plan = decode_plan(mail.inbox(s).get(Topic.blocks(1)), int((ds.site == s).sum()), coord.state.order)
    assert plan and all(isinstance(v, list) for v in plan.values())
    labels_equal_plaintext(ds, sites, finish(coord, sites, mail), JobParams(job_id="ot", **BLOCKED))


@pytest.mark.parametrize("crypto", ["plaintext", "lattice"])
def test_a_site_that_has_sent_its_part_long_polls_for_the_coordinators_next_message_and_fetches_it_once(ds, crypto):
    # A driver's view of the job lags the coordinator (an agent reads the job's status, then its messages):
    # a site that has sent its part asks for the coordinator's next message with wait (one long poll, not
    # one poll per interval from every site while the slowest site or the coordinator computes), and the
    # body it got is the one it takes once the view moves on: each of the coordinator's messages (the
    # influence columns among them) is fetched once. The labels are the simulation's.
    params = JobParams(job_id="lp", crypto=crypto, **BLOCKED)
    coord, sites = machines(ds, params)
    mail, got = MemoryMailbox(), []

    class Recording:
        def __init__(self, site):
            self.inbox, self.site = mail.inbox(site), site

        def get(self, topic, sender=COORDINATOR, wait=False):
            body = self.inbox.get(topic, sender, wait)
            if sender == COORDINATOR:
                got.append((self.site, topic, wait, body is not None))
            return body

    st = coord.state
    view = PredictState.from_bytes(st.to_bytes())
    for _ in range(400):
        if view.status != "running":
            break
        for s in list(view.live):
            sites[s].step(view, Recording(s), mail.put)
        view = PredictState.from_bytes(st.to_bytes())  # what the sites read before the coordinator's decision
        coord.settle(mail, True)  # (no deadline: a lagging view is no silent site)
    assert st.status == "done", st.failure
    for s in st.live:
        sites[s].step(st, Recording(s), mail.put)
    topics = {t for (_, t, _, _) in got}
    assert {"roster", "influence", "counts-total/0", "sums/0"} <= topics
    assert crypto == "plaintext" or "blocks/1" in topics
    for s in ds.sites:
        for t in topics - {"blocks/" + str(st.attempts["hamming"] + 1)}:  # (the blocks that never came)
            fetched = [w for (site, topic, w, ok) in got if site == s and topic == t and ok]
            # once, by the long poll; (lattice) but the influence columns, which come where the site waited
            # for the likelier next round's blocks, and which it then takes once the view moves on
            assert fetched == ([False] if crypto == "lattice" and t == "influence" else [True]), (s, t, fetched)
    ref = run_xclp(ds, JobParams(job_id="lp", **BLOCKED),
                   contributions={s: sites[s].session.my_contribution() for s in ds.sites})
    for s in ds.sites:
        assert np.array_equal(sites[s].result.labels, ref.predictions[s].labels), s


def test_descent_rounds_are_answered_from_the_first_rounds_kept_results(ds):
    # lattice: A keeps its decrypted results of round 1 with each peer (crypto.lattice_kept); a descent
    # round's entries found there are sent to A alone as a KeptPlan, B takes no part in a pair answered
    # wholly so, and the labels are the plaintext job's — with fewer bytes than every round afresh
    from crypto.lattice_blocks import BlockView
    from xclp.block_protocol import KeptPlan, decode_plan
    from xclp.prediction_topics import Topic

    params = JobParams(job_id="kept", crypto="lattice", **{**BLOCKED, "descent_rounds": 2})
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    labels = finish(coord, sites, mail)
    kept = kept_only = 0
    for r in range(2, coord.state.attempts["hamming"] + 1):
        for a in ds.sites:
            plan = decode_plan(mail.body(COORDINATOR, a, Topic.blocks(r)), int((ds.site == a).sum()), list(ds.sites))
            for b, part in plan.items():
                assert not isinstance(part, KeptPlan) or list(ds.sites).index(a) < list(ds.sites).index(b)
                if isinstance(part, KeptPlan):
                    kept += 1
                    theirs = decode_plan(mail.body(COORDINATOR, b, Topic.blocks(r)), int((ds.site == b).sum()),
                                         list(ds.sites)).get(a)
                    assert isinstance(theirs, BlockView) == (part.view is not None)  # B: a view only for a fresh run
                    if part.view is None:
                        kept_only += 1
                        assert mail.senders(COORDINATOR, Topic.block_share(r, a, b)) == {a}
    assert kept >= 1 and kept_only >= 1
    plain = run_xclp(ds, JobParams(job_id="kept", **{**BLOCKED, "descent_rounds": 2}),
                     contributions={s: sites[s].session.my_contribution() for s in ds.sites})
    for s, got in labels.items():
        assert np.array_equal(got, plain.predictions[s].labels), s
    fresh = run_xclp(ds, JobParams(job_id="kept", crypto="lattice", keep_first_round=False,
                                   **{**BLOCKED, "descent_rounds": 2}),
                     contributions={s: sites[s].session.my_contribution() for s in ds.sites})
    again = run_xclp(ds, params, contributions={s: sites[s].session.my_contribution() for s in ds.sites})
    assert np.array_equal(fresh.labels, again.labels)
    assert again.bytes["by_phase"]["hamming"] < fresh.bytes["by_phase"]["hamming"]
