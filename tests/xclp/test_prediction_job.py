"""The prediction job's order (xclp/prediction_job.py), tested on the machines themselves: the rules
every driver (the simulation, the engine with its agents, Flower) runs and no driver writes."""

import numpy as np
import pytest
from prediction_rig import drive
from prediction_rig import machines as _machines

from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Inadmissible, Send
from xclp.prediction_job import MemoryMailbox, PredictCoordinator, PredictSite, PredictState, admit
from xclp.prediction_topics import Topic
from xclp.protocol import SiteSession
from xclp.refusal import REFUSE, refusal
from xclp.simulation import run_xclp
from xclp.splits import simulate_sites


@pytest.fixture(scope="module")
def ds():
    X, y = load_arrays("digits", limit=150, seed=2)
    return simulate_sites(X, y, 3, "iid", 0.2, seed=2)


def machines(ds, params):
    return _machines(ds, params, first=0)  # (this module's seeds: contributions 0, 1, 2)


def test_the_state_saves_to_bytes_and_a_restored_machine_decides_the_same(ds):
    params = JobParams(job_id="m1", n_classes=10, bits=64, k=5)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    drive(coord, sites, mail, lambda st: st.phase == "hamming")
    saved = coord.state.to_bytes()
    drive(coord, sites, mail, lambda st: st.status == "done")
    # a coordinator restarted from the bytes it saved at hamming takes the same decisions on the same mail
    again = PredictCoordinator(params, PredictState.from_bytes(saved))
    out = again.run(mail)
    assert again.state == coord.state
    assert {(m.recipient, m.topic) for m in out} == {(s, t) for s in ds.sites for t in ("influence", "sums/0")}
    assert PredictState.from_bytes(coord.state.to_bytes()) == coord.state


def test_a_refusal_in_a_masked_sum_restarts_it_without_the_site_and_fewer_than_two_fail(ds):
    params = JobParams(job_id="m2", n_classes=10, bits=64, k=5)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    drive(coord, sites, mail, lambda st: st.phase == "counts")
    mail.put(Send("site2", COORDINATOR, REFUSE, refusal("policy: no")))
    coord.run(mail)
    st = coord.state
    assert st.phase == "counts" and st.attempt == 1 and st.live == ["site0", "site1"]
    assert st.dropped == {"site2": "counts"} and coord.refusals(mail) == {"site2": "policy: no"}
    mail.put(Send("site1", COORDINATOR, REFUSE, refusal("out of memory")))
    coord.run(mail)
    assert st.status == "failed" and "site1: out of memory" in st.failure and "site2: policy: no" in st.failure


def test_a_silent_site_is_dropped_only_when_the_deadline_passes(ds):
    params = JobParams(job_id="m3", n_classes=10, bits=64, k=5)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    drive(coord, sites, mail, lambda st: st.phase == "row_sums")
    for s in ("site0", "site1"):
        sites[s].step(coord.state, mail.inbox(s), mail.put)
    assert coord.run(mail) == [] and coord.state.live == list(ds.sites)  # site2 may still come
    coord.run(mail, expired=True)
    assert coord.state.attempt == 1 and coord.state.live == ["site0", "site1"]  # fresh masks, without it


def test_the_machine_names_who_it_awaits_and_drops_a_silent_awaited_site_at_once(ds):
    params = JobParams(job_id="m5", n_classes=10, bits=64, k=5)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    assert coord.awaited(mail) == list(ds.sites)  # setup: nobody has announced
    drive(coord, sites, mail, lambda st: st.phase == "row_sums")
    for s in ("site0", "site1"):
        sites[s].step(coord.state, mail.inbox(s), mail.put)
    assert coord.awaited(mail) == ["site2"]
    # silent sites the phase does not await stay (their part is in); an awaited one leaves now, told why
    assert coord.run(mail) == [] and coord.step(mail, silent={"site0": "quiet"}) == []
    assert coord.state.live == list(ds.sites)
    out = coord.step(mail, silent={"site0": "quiet", "site2": "no contact for 301 s"})
    st = coord.state
    assert [(m.recipient, m.topic) for m in out] == [("site2", "left-out")]
    assert st.live == ["site0", "site1"] and st.attempt == 1 and st.dropped == {"site2": "row_sums"}
    for m in out:
        mail.put(m)
    assert coord.refusals(mail) == {"site2": "left out by the coordinator: no contact for 301 s"}
    assert coord.awaited(mail) == ["site0", "site1"]  # the masked sum restarts without it: fresh masks


def test_the_machines_give_the_simulations_labels(ds):
    params = JobParams(job_id="m4", n_classes=10, bits=64, k=5)
    coord, sites = machines(ds, params)
    mail = MemoryMailbox()
    drive(coord, sites, mail, lambda st: st.status == "done")
    for s in ds.sites:
        sites[s].step(coord.state, mail.inbox(s), mail.put)
    ref = run_xclp(ds, params, contributions={s: bytes([i]) * 32 for i, s in enumerate(ds.sites)})
    for s in ds.sites:
        assert np.array_equal(sites[s].result.labels, ref.predictions[s].labels)


def test_who_may_send_what_when():
    st = PredictState.new(["a", "b", "c"])
    st.phase, st.attempt = "counts", 1
    assert admit(st, "a", COORDINATOR, Topic.counts(1)) == "counts"
    for site, to, topic, conflict in [
        ("a", COORDINATOR, Topic.counts(0), True),  # a past attempt
        ("a", COORDINATOR, "rows/1", True),  # another phase
        ("a", "b", Topic.counts(1), False),  # a sum goes to the coordinator
        ("a", COORDINATOR, "nonsense", False),
    ]:
        with pytest.raises(Inadmissible) as err:
            admit(st, site, to, topic)
        assert err.value.conflict is conflict
    st.phase = "hamming"
    assert admit(st, "b", "a", Topic.pair("a", "b", 3)) == "pair"
    for site, to, topic in [("c", "a", Topic.pair("a", "b", 0)), ("a", "c", Topic.pair("a", "b", 0)),
                            ("b", "a", Topic.pair("b", "a", 0)), ("a", "b", Topic.pair("a", "b", 10 ** 9))]:
        with pytest.raises(Inadmissible):
            admit(st, site, to, topic)


def test_a_site_whose_columns_are_another_order_or_others_is_left_out_naming_the_difference(ds):
    # The data contract: a swapped pair of columns has the right count and would give wrong labels
    # silently; the coordinator's machine leaves the site out, the reason naming the difference.
    params = JobParams(job_id="m5", n_classes=10, bits=64, k=5)
    names = tuple(f"px{j}" for j in range(ds.X.shape[1]))
    swapped = (names[1], names[0], *names[2:])
    renamed = (*names[:-1], "mrn")
    for odd, why in ((swapped, "another order (column 1 is 'px1', theirs 'px0')"), (renamed, "it has ['mrn']")):
        headers = {"site0": names, "site1": names, "site2": odd}
        sessions = {s: SiteSession(params, s, ds.X[ds.site == s], ds.y[ds.site == s], columns=headers[s])
                    for s in ds.sites}
        coord = PredictCoordinator(params, PredictState.new(list(ds.sites)))
        mail = MemoryMailbox()
        for s, sess in sessions.items():
            mail.put(Send(s, COORDINATOR, "announce", sess.announce()))
        out = coord.run(mail)
        for m in out:
            mail.put(m)
        assert coord.state.live == ["site0", "site1"] and coord.state.phase == "seed"
        reason = coord.refusals(mail)["site2"]
        assert "feature columns differ" in reason and why in reason, reason
        assert {m.recipient for m in out if m.topic == "roster"} == {"site0", "site1"}
        # ... and a site checks the roster itself: one that mixes headers is refused
        roster = [m.body for m in out if m.topic == "roster"][0]
        from xclp.announce import decode_roster, encode_roster

        mixed = encode_roster([mail.body(s, COORDINATOR, "announce") for s in ds.sites])
        with pytest.raises(Exception, match="mixes feature columns"):
            sessions["site0"].set_roster(decode_roster(mixed))
        sessions["site1"].set_roster(decode_roster(roster))  # the agreed one is taken


def test_a_site_runs_at_most_max_b_runs_pairs_as_b_and_max_a_runs_as_a_and_pair_messages_are_released_once_taken():
    # 5 sites: the last is B of 4 pairs, the first A of 4. A site starts a pair as B only while fewer than
    # MAX_B_RUNS are under way (its peers' columns are held for a run's length), as A while fewer than
    # MAX_A_RUNS (its columns wait in the mailbox for B), and the labels are the simulation's. The mailbox
    # keeps every pair message's key (who sent what) but not its body once its recipient took it: in a
    # secure job those bodies are nearly all the bytes.
    from crypto.lattice_blocks import PackedLatticeHamming
    from xclp import prediction_job

    X, y = load_arrays("digits", limit=400, seed=5)
    ds5 = simulate_sites(X, y, 5, "iid", 0.2, seed=5)
    params = JobParams(job_id="bruns", n_classes=10, bits=64, k=5, crypto="lattice")
    # small RES messages: a B run takes several turns (SUB_BATCH = 32 of its ~80 rows each)
    sites = {s: PredictSite(SiteSession(params, s, ds5.X[ds5.site == s], ds5.y[ds5.site == s],
                                        contribution=bytes([i]) * 32,
                                        hamming=PackedLatticeHamming(target_message_bytes=1)))
             for i, s in enumerate(ds5.sites)}
    coord = PredictCoordinator(params, PredictState.new(list(ds5.sites)))
    mail = MemoryMailbox()
    most = {s: 0 for s in ds5.sites}
    most_a = {s: 0 for s in ds5.sites}

    def under_way(s, as_b=True):
        order = list(ds5.sites)
        return sum(1 for peer, drv in sites[s].session.pair_drivers.items()
                   if (order.index(peer) < order.index(s)) == as_b and (drv.got if as_b else drv.sent)
                   and not drv.done)

    st = coord.state
    for _ in range(400):
        if st.status == "done":
            break
        moved = False
        for s in list(st.live):
            moved |= sites[s].step(st, mail.inbox(s), mail.put)
            most[s] = max(most[s], under_way(s))
            most_a[s] = max(most_a[s], under_way(s, as_b=False))
        coord.settle(mail, moved)
    assert st.status == "done" and st.dropped == {}
    assert most[ds5.sites[-1]] == prediction_job.MAX_B_RUNS == 1  # 4 pairs as B, one at a time
    assert most_a[ds5.sites[0]] == prediction_job.MAX_A_RUNS == 2  # 4 pairs as A, two at a time
    pair_keys = [k for k in mail.messages if Topic.is_pair_message(k[2])]
    assert pair_keys and all(mail.messages[k] is None for k in pair_keys)  # every one taken, then released
    assert all(b is not None for k, b in mail.messages.items() if not Topic.is_pair_message(k[2]))
    first = pair_keys[0]
    assert not mail.put(Send(first[0], first[1], first[2], b"again"))  # a repeat is still refused
    for s in ds5.sites:
        sites[s].step(st, mail.inbox(s), mail.put)
    ref = run_xclp(ds5, params, contributions={s: bytes([i]) * 32 for i, s in enumerate(ds5.sites)})
    for s in ds5.sites:
        assert np.array_equal(sites[s].result.labels, ref.predictions[s].labels), s
