"""The site session is a state machine with an explicit phase: each message moves it on, and a call
out of its phase is refused with the phase it is in (the agent and the simulation drive the same one)."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.hamming_api import exchange
from xclp.announce import decode_roster, encode_roster
from xclp.job_params import JobParams
from xclp.prediction_job import restart_without
from xclp.protocol import JOB_PHASES, CoordinatorSession, SiteSession


def test_each_message_moves_the_session_on_and_out_of_order_calls_are_refused():
    rng = np.random.default_rng(0)
    params = JobParams(job_id="j", n_classes=2, bits=64, k=3, crypto="lattice").validate()
    y = {s: np.where(rng.random(12) < 0.5, rng.integers(0, 2, 12), -1) for s in ("a", "b")}
    for s in y:
        y[s][:2] = [0, 1]
    sess = {s: SiteSession(params, s, rng.normal(size=(12, 5)), y[s]) for s in ("a", "b")}
    coord = CoordinatorSession(params)
    seen = []

    def phases():
        return {sess["a"].phase, sess["b"].phase}

    a = sess["a"]
    with pytest.raises(ProtocolError, match="needs phase seed.*is in setup"):
        a.seed_messages()
    for s, x in sess.items():
        coord.register(s, x.announce())
    roster = encode_roster([sess[s].announce() for s in coord.order])
    for x in sess.values():
        x.set_roster(decode_roster(roster))
    seen.append(phases())
    with pytest.raises(ProtocolError, match="needs phase setup"):
        a.announce()
    out = {s: x.seed_messages() for s, x in sess.items()}
    with pytest.raises(ProtocolError, match="needs phase counts"):
        a.counts_message(["a", "b"])
    for s, x in sess.items():
        x.receive_seed({p: out[p][s] for p in sess if p != s}, ["a", "b"])
    seen.append(phases())
    for s, x in sess.items():
        coord.receive_counts(s, x.counts_message(["a", "b"]))
    with pytest.raises(ProtocolError, match="needs phase hamming"):
        a.hash()
    for x in sess.values():
        x.receive_counts(coord.counts_total(["a", "b"]))
    seen.append(phases())
    for s, x in sess.items():
        coord.receive_intra(s, x.intra_message())
    coord.receive_pair("a", "b", *exchange(a.hamming_party("b"), sess["b"].hamming_party("a")))
    with pytest.raises(ProtocolError, match="needs phase row_sums"):
        a.row_sums_message(["a", "b"], 0)
    coord.compute_influence(coord.build_graph(["a", "b"]))
    for s, x in sess.items():
        x.receive_influence(coord.influence_message(s))
    seen.append(phases())
    coord.start_row_sums()
    for s, x in sess.items():
        coord.receive_row_sums(s, x.row_sums_message(["a", "b"], 0))
        x.row_sums_message(["a", "b"], 0)  # asked again (a new attempt, a restart): allowed in its phase
    back = coord.row_sums_for(["a", "b"])
    for s, x in sess.items():
        x.receive_row_sums(back[s])
    seen.append(phases())
    assert seen == [{p} for p in JOB_PHASES[1:]]
    with pytest.raises(ProtocolError, match="is in done"):
        a.receive_row_sums(back["a"])


def test_a_sum_restarts_without_the_missing_sites_under_a_new_attempt():
    assert restart_without(["a", "b", "c"], {"b"}, 0) == (["a", "c"], 1)
    assert restart_without(["a", "c"], [], 1) == (["a", "c"], 2)  # a new attempt even with no one missing


def test_a_site_takes_part_in_few_restarts_of_a_sum_each_over_fewer_sites(monkeypatch):
    """The core's restart rule for the counts and row sums, the same for every driver: a sum's message
    again for the same attempt and sites, or a later attempt over strictly fewer sites, at most
    MAX_SUM_RESTARTS times (a server colluding with one site differences nested restarts)."""
    import xclp.protocol as protocol

    rng = np.random.default_rng(1)
    names = ["a", "b", "c", "d"]
    params = JobParams(job_id="j", n_classes=2, bits=64, k=3, crypto="lattice").validate()
    sess = {s: SiteSession(params, s, rng.normal(size=(8, 5)), np.array([0, 1, -1, -1, 0, 1, -1, -1])) for s in names}
    roster = encode_roster([sess[s].announce() for s in names])
    for x in sess.values():
        x.set_roster(decode_roster(roster))
    out = {s: x.seed_messages() for s, x in sess.items()}
    for s, x in sess.items():
        x.receive_seed({p: out[p][s] for p in sess if p != s}, names)
    a = sess["a"]
    first = a.counts_message(names, 0)
    assert a.counts_message(names, 0) == first  # asked again: the same message
    for participants, attempt in ((names, 1), (names[:3], 0), (["a", "b", "c", "d"], 2)):
        with pytest.raises(ProtocolError, match="later attempt than 0 over fewer sites"):
            a.counts_message(participants, attempt)
    a.counts_message(names[:3], 1)
    with pytest.raises(ProtocolError, match="over fewer sites"):
        a.counts_message(names, 2)  # a site added back: the difference would be that site's counts
    monkeypatch.setattr(protocol, "MAX_SUM_RESTARTS", 1)
    with pytest.raises(ProtocolError, match="at most 1 restarts of one sum"):
        a.counts_message(names[:2], 2)


def test_the_data_contract_leaves_out_a_site_whose_columns_differ():
    """Every driver's coordinator leaves out a site with another number of features (schema_outliers),
    and a site refuses a roster that mixes them whatever the coordinator does."""
    from xclp.announce import schema_outliers

    rng = np.random.default_rng(2)
    params = JobParams(job_id="j", n_classes=2, bits=64, k=3, crypto="lattice").validate()
    y = np.array([0, 1, -1, -1, 0, 1])
    sess = {s: SiteSession(params, s, rng.normal(size=(6, d)), y) for s, d in (("a", 30), ("b", 30), ("c", 29))}
    entries = decode_roster(encode_roster([x.announce() for x in sess.values()]))
    assert [e.features for e in entries] == [30, 30, 29]
    why = schema_outliers(entries)
    assert list(why) == ["c"] and "29 features" in why["c"] and "have 30" in why["c"]
    assert schema_outliers([e for e in entries if e.site != "c"]) == {}
    with pytest.raises(ProtocolError, match="mixes feature counts"):
        sess["a"].set_roster(entries)
