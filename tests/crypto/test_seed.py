"""Shared LSH seed agreement (crypto.seed)."""

import hashlib

import pytest

from crypto.channel import Channel
from crypto.errors import IntegrityError, ProtocolError
from crypto.keys import SiteKeyPair, pairwise_key
from crypto.seed import SeedAgreement, commitment, derive_seed, new_contribution, seed_fingerprint

SITES = ["s1", "s2", "s3", "s4"]
JOB = "job-seed"


def _kp(name):
    return SiteKeyPair.from_private_bytes(hashlib.sha256(b"seed-test/" + name.encode()).digest())


def _channels(me):
    out = {}
    for peer in SITES:
        if peer != me:
            key = pairwise_key(
                _kp(me), _kp(peer).public_bytes(), job=JOB, purpose="channel", attempt=0, me=me, peer=peer
            )
            out[peer] = Channel(key, job=JOB, me=me, peer=peer)
    return out


def _contribution(name, salt=b""):
    return hashlib.sha256(b"contrib/" + name.encode() + salt).digest()


def _commitments(contributions, me):
    return {s: commitment(c, JOB, s) for s, c in contributions.items() if s != me}


def _agent(me, contributions, **kw):
    return SeedAgreement(me, SITES, JOB, _channels(me), commitments=_commitments(contributions, me),
                         contribution=contributions[me], **kw)


def _run(contributions, drop=()):
    agents = {s: _agent(s, contributions) for s in SITES}
    mail = {s: agents[s].outgoing() for s in SITES}
    for sender in SITES:
        if sender in drop:
            continue
        for recipient, message in mail[sender].items():
            agents[recipient].receive(sender, message)
    return agents


def test_every_site_gets_the_same_seed():
    contributions = {s: _contribution(s) for s in SITES}
    agents = _run(contributions)
    seeds = {s: agents[s].seed() for s in SITES}
    assert len(set(seeds.values())) == 1
    seed = seeds["s1"]
    assert len(seed) == 32
    assert seed == derive_seed(contributions, SITES, JOB)
    assert len({seed_fingerprint(seeds[s], JOB) for s in SITES}) == 1


def test_seed_changes_when_one_contribution_changes():
    contributions = {s: _contribution(s) for s in SITES}
    changed = dict(contributions, s3=_contribution("s3", b"other"))
    assert derive_seed(contributions, SITES, JOB) != derive_seed(changed, SITES, JOB)
    assert _run(changed)["s1"].seed() != _run(contributions)["s1"].seed()


def test_seed_depends_on_job_and_order_and_membership():
    c = {s: _contribution(s) for s in SITES}
    base = derive_seed(c, SITES, JOB)
    assert derive_seed(c, SITES, "other-job") != base
    assert derive_seed(c, list(reversed(SITES)), JOB) != base
    assert derive_seed({k: v for k, v in c.items() if k != "s2"}, SITES, JOB) != base


def test_missing_peer_is_excluded():
    contributions = {s: _contribution(s) for s in SITES}
    agents = _run(contributions, drop=("s4",))
    expected = derive_seed({s: contributions[s] for s in ["s1", "s2", "s3"]}, SITES, JOB)
    for s in ["s1", "s2", "s3"]:
        assert agents[s].received_from == [p for p in SITES if p not in (s, "s4")]
        assert agents[s].seed() == expected
    # the coordinator announces the final participant set: everyone derives over it
    final = ["s1", "s2", "s3"]
    assert {agents[s].seed(participants=final) for s in final} == {expected}
    with pytest.raises(ProtocolError):
        agents["s1"].seed(participants=SITES)  # s4's contribution never arrived


def test_fresh_contributions_are_random():
    assert new_contribution() != new_contribution()
    assert len(new_contribution()) == 32
    anything = {s: bytes(32) for s in SITES}
    a = SeedAgreement("s1", SITES, JOB, _channels("s1"), commitments=anything)
    b = SeedAgreement("s1", SITES, JOB, _channels("s1"), commitments=anything)
    assert a.contribution != b.contribution


def test_contribution_length_validated():
    with pytest.raises(ProtocolError):
        new_contribution(b"short")
    with pytest.raises(ProtocolError):
        derive_seed({"s1": bytes(31)}, SITES, JOB)
    with pytest.raises(ProtocolError):
        derive_seed({"s9": bytes(32)}, SITES, JOB)
    with pytest.raises(ProtocolError):
        derive_seed({}, SITES, JOB)
    with pytest.raises(ProtocolError):
        SeedAgreement("s1", SITES, JOB, _channels("s1"), commitments={s: bytes(32) for s in SITES},
                      contribution=bytes(16))


def test_peer_sending_wrong_length_is_rejected():
    ch1, ch2 = _channels("s1"), _channels("s2")
    agent = SeedAgreement("s1", SITES, JOB, ch1, commitments={s: bytes(32) for s in SITES},
                          contribution=_contribution("s1"))
    with pytest.raises(ProtocolError, match="expected 32"):
        agent.receive("s2", ch2["s1"].seal("lsh-seed", b"x" * 31))


def test_relay_cannot_tamper_or_replay():
    contributions = {s: _contribution(s) for s in SITES}
    agents = {s: _agent(s, contributions) for s in SITES}
    m = agents["s2"].outgoing()["s1"]
    bad = bytearray(m)
    bad[-1] ^= 1
    with pytest.raises(IntegrityError):
        agents["s1"].receive("s2", bytes(bad))
    agents["s1"].receive("s2", m)
    with pytest.raises(ProtocolError):
        agents["s1"].receive("s2", m)
    with pytest.raises(ProtocolError):
        agents["s1"].outgoing(), agents["s1"].outgoing()


def test_a_site_cannot_steer_the_seed_after_seeing_the_others():
    """Commit, then reveal: s4 committed to one contribution, read the others', and sends another
    one chosen to steer the seed. Every peer refuses it; the committed one is taken."""
    contributions = {s: _contribution(s) for s in SITES}
    agents = {s: _agent(s, contributions) for s in SITES}
    steered = SeedAgreement("s4", SITES, JOB, _channels("s4"), commitments=_commitments(contributions, "s4"),
                            contribution=_contribution("s4", b"chosen after reading the others"))
    with pytest.raises(ProtocolError, match="does not match the commitment"):
        agents["s1"].receive("s4", steered.outgoing()["s1"])
    assert agents["s1"].received_from == []
    fresh = _agent("s1", contributions)  # (a channel opens each sequence number once)
    fresh.receive("s4", agents["s4"].outgoing()["s1"])
    assert fresh.received_from == ["s4"]


def test_commitments_are_bound_to_job_and_site_and_required():
    c = _contribution("s1")
    assert commitment(c, JOB, "s1") != commitment(c, JOB, "s2") != commitment(c, "other-job", "s1")
    assert commitment(c, JOB, "s1") == commitment(c, JOB, "s1") and len(commitment(c, JOB, "s1")) == 32
    with pytest.raises(ProtocolError, match="commitment"):
        SeedAgreement("s1", SITES, JOB, _channels("s1"), commitments={"s2": bytes(32)})
