"""Double masking (xclp.training.double_masking): a round's masked sum decodes to the simulation's
mean bit for bit, with or without dropouts, while a server that lies about who dropped, or asks a site
again, learns nothing about any site's weights."""

import numpy as np
import pytest
import torch
from training_helpers import masked_federation

from crypto.errors import IntegrityError, ProtocolError
from crypto.keys import SiteKeyPair
from xclp.training import double_masking as dm
from xclp.training import secure_aggregation as secagg
from xclp.training.fedavg import FedAvgConfig, FedAvgStrategy, aggregate

SITES = ["a", "b", "c", "d"]


@pytest.fixture
def fed():
    template, states, keys = masked_federation(SITES)
    public = {s: k.public_bytes() for s, k in keys.items()}
    s = FedAvgStrategy(FedAvgConfig(algorithm="fedavg", secure_aggregation=True).validate(), 3, 12)
    records = {x: dm.SiteRecord() for x in SITES}
    return template, states, keys, public, s, records


def upload(fed, me, participants, t=1):
    from xclp.training.fedavg import site_upload

    template, states, keys, public, s, records = fed
    return site_upload(s, states[me], template, {"n": 5}, planned=len(participants), me=me, private=keys[me],
                       public_keys=public, participants=participants, job="j", t=t, record=records[me])


def answer(fed, me, participants, survivors, shares_by_sender, t=1):
    template, states, keys, public, s, records = fed
    records[me].claim_unmask(me, t, participants, survivors)
    relayed = dm.relay(shares_by_sender, survivors)[me]
    return dm.unmask_answer(me=me, private=keys[me], public_keys=public, participants=participants,
                            survivors=survivors, sealed=relayed, job="j", t=t)


def run_round(fed, participants, survivors, answering=None):
    from xclp.training.fedavg import decode_masked_round, open_masked_round

    template, states, keys, public, s, records = fed
    bodies = {x: upload(fed, x, participants) for x in participants}
    masked, metrics, shares = open_masked_round(s, {x: bodies[x] for x in survivors}, template, participants, t=1)
    answers = {x: answer(fed, x, participants, survivors, shares) for x in (answering or survivors)}
    return decode_masked_round(s, masked, metrics, answers, template, participants, survivors, job="j", t=1,
                               planned=len(participants))


def test_no_dropout_decodes_the_simulations_mean(fed):
    template, states, *_ = fed
    model, decoded = run_round(fed, SITES, SITES)
    want = aggregate([(states[x], 1) for x in SITES], secure=True)
    assert decoded and all(torch.equal(model[k], want[k]) for k in want)


def test_a_dropout_is_recovered_without_anyone_masking_again(fed):
    template, states, *_ = fed
    model, decoded = run_round(fed, SITES, ["a", "b", "d"])  # c's upload never arrived
    want = aggregate([(states[x], 1) for x in "abd"], secure=True)
    assert decoded and all(torch.equal(model[k], want[k]) for k in want)


def test_a_survivor_silent_at_unmask_is_rebuilt_from_shares_when_no_one_dropped(fed):
    template, states, *_ = fed
    model, decoded = run_round(fed, SITES, SITES, answering=["a", "b", "c"])  # d said nothing more
    want = aggregate([(states[x], 1) for x in SITES], secure=True)
    assert decoded and all(torch.equal(model[k], want[k]) for k in want)


def test_too_few_answers_keep_the_previous_model(fed):
    template, *_ = fed
    model, decoded = run_round(fed, SITES, ["a", "b", "d"], answering=["a", "b"])  # d's key with c is gone
    assert not decoded and all(torch.equal(model[k], template[k]) for k in template)
    model, decoded = run_round_fresh(fed, SITES, SITES, answering=["a"])  # one share of each seed: τ = 2
    assert not decoded and all(torch.equal(model[k], template[k]) for k in template)


def run_round_fresh(fed, participants, survivors, answering):
    template, states, keys, public, s, records = fed
    for x in SITES:
        records[x] = dm.SiteRecord()
    return run_round(fed, participants, survivors, answering)


def test_a_site_masks_a_round_once_whatever_the_server_asks(fed):
    upload(fed, "a", SITES)
    with pytest.raises(ProtocolError, match="masks each round's weights once"):
        upload(fed, "a", ["a", "b", "d"])  # the subtraction attack's second sum
    with pytest.raises(ProtocolError, match="masks each round's weights once"):
        upload(fed, "a", SITES)  # the averaging attack's fresh noise
    upload(fed, "a", SITES, t=2)  # the next round is a new sum


def test_a_site_answers_the_unmask_step_once_and_checks_what_it_is_told(fed):
    template, states, keys, public, s, records = fed
    bodies = {x: upload(fed, x, SITES) for x in SITES}
    from xclp.training.fedavg import open_masked_round

    _, _, shares = open_masked_round(s, bodies, template, SITES, t=1)
    answer(fed, "a", SITES, SITES, shares)
    with pytest.raises(ProtocolError, match="answers it once"):
        answer(fed, "a", SITES, ["a", "b", "d"], shares)  # now told that c dropped
    with pytest.raises(ProtocolError, match="masked over"):
        records["b"].claim_unmask("b", 1, ["a", "b"], ["a", "b"])
    with pytest.raises(ProtocolError, match="fewer than two"):
        records["b"].claim_unmask("b", 1, SITES, ["b"])
    relayed = dm.relay(shares, SITES)["b"]
    relayed["a"] = dm.relay(shares, SITES)["c"]["a"]  # a's share addressed to c, relayed to b
    with pytest.raises(IntegrityError, match="does not authenticate"):
        dm.unmask_answer(me="b", private=keys["b"], public_keys=public, participants=SITES, survivors=SITES,
                         sealed=relayed, job="j", t=1)


def test_a_server_that_claims_a_live_site_dropped_learns_nothing_of_it(fed):
    """The subtraction attack of the old restart rule, played against double masking: the server tells
    every other site that c dropped (so it gets their pairwise keys with c) and keeps c's upload. It
    strips c's pairwise masks, but c's self-mask stays: the difference says nothing about c."""
    from xclp.training.fedavg import open_masked_round

    template, states, keys, public, s, records = fed
    bodies = {x: upload(fed, x, SITES) for x in SITES}
    masked, metrics, shares = open_masked_round(s, bodies, template, SITES, t=1)
    liars = ["a", "b", "d"]
    answers = {x: answer(fed, x, SITES, liars, shares) for x in liars}
    n = secagg.n_values(template)
    y = masked["c"].copy()
    mine = SITES.index("c")
    for j in liars:  # the pairwise masks of c, every one revealed
        stream = dm.prg_uint64(bytes.fromhex(answers[j]["pairwise"]["c"]), n)
        y = y - stream if SITES.index(j) > mine else y + stream
    plain = secagg.encode_update(states["c"], template)
    assert np.mean(y == plain) < 0.01  # still uniformly masked by PRG(b_c)
    # and no answer holds a share of c's seed: the b-shares went only with "c survived"
    assert all("c" not in a["shares"] for a in answers.values())
    # the honest decode of the lie is the sum of a, b, d — c's weights are in no released value
    model, decoded = (None, None)
    from xclp.training.fedavg import decode_masked_round

    model, decoded = decode_masked_round(s, {x: masked[x] for x in liars}, metrics, answers, template, SITES, liars,
                                         job="j", t=1, planned=4)
    want = aggregate([(states[x], 1) for x in liars], secure=True)
    assert decoded and all(torch.equal(model[k], want[k]) for k in want)


def test_shamir_threshold_is_half_the_other_participants():
    assert [dm.threshold(n) for n in (2, 3, 4, 5, 10)] == [1, 1, 2, 2, 5]
    seed = bytes(range(16))
    keys = {s: SiteKeyPair.generate() for s in "abcde"}
    public = {s: k.public_bytes() for s, k in keys.items()}
    sealed = dm.seal_shares(seed, me="a", private=keys["a"], public_keys=public, participants=list("abcde"),
                            job="j", t=3)
    opened = {h: bytes.fromhex(dm.open_share(sealed[h], sender="a", me=h, private=keys[h], public_keys=public,
                                             job="j", t=3)) for h in "bcde"}
    from Crypto.Protocol.SecretSharing import Shamir

    pts = [(int.from_bytes(v[:2], "big"), v[2:]) for v in opened.values()]
    assert Shamir.combine(pts[:2], ssss=False) == seed  # τ = 2 of 4 holders
    assert Shamir.combine(pts[2:], ssss=False) == seed
    assert all(Shamir.combine([p], ssss=False) != seed for p in pts)  # one says nothing of it
