"""A site's session saves to bytes and restores (SiteSession.to_bytes / from_bytes; xclp.session_state):
a job whose every site is rebuilt from its bytes before every call — as a Flower site is at every
message — gives the labels of the same job run straight through, for every protocol; the bytes hold no
pickle and no data of the site, and a restore over other data is refused."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.keys import SiteKeyPair
from xclp.announce import decode_roster, encode_roster
from xclp.job_params import JobParams
from xclp.protocol import CoordinatorSession, SiteSession

SITES = ("s0", "s1", "s2")


def _data():
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(3, 6)) * 3
    out = {}
    for s in SITES:
        lab = rng.integers(0, 3, 15)
        X = centres[lab] + rng.normal(size=(15, 6))
        y = np.where(rng.random(15) < 0.4, lab, -1)
        y[:3] = [0, 1, 2]
        out[s] = (X, y)
    return out


def _job(params: JobParams, restore: bool) -> dict:
    data = _data()
    sess = {s: SiteSession(params, s, *data[s], keypair=SiteKeyPair.from_private_bytes(bytes([i + 1]) * 32),
                           contribution=bytes([i + 7]) * 32, noise_seed=bytes([i + 9]) * 32)
            for i, s in enumerate(SITES)}

    def S(s):  # the session, rebuilt from its bytes first when `restore` (as a Flower site at each message)
        if restore:
            b = sess[s].to_bytes()
            sess[s] = SiteSession.from_bytes(b, *data[s])
            assert sess[s].to_bytes() == b
        return sess[s]

    coord = CoordinatorSession(params)
    for s in SITES:
        coord.register(s, S(s).announce())
    roster = encode_roster([S(s).announce() for s in coord.order])
    for s in SITES:
        S(s).set_roster(decode_roster(roster))
    out = {s: S(s).seed_messages() for s in SITES}
    for s in SITES:
        S(s).receive_seed({p: out[p][s] for p in SITES if p != s}, list(SITES))
    for s in SITES:
        coord.receive_counts(s, S(s).counts_message(list(SITES)))
    for s in SITES:
        S(s).receive_counts(coord.counts_total(list(SITES)))
    for s in SITES:
        coord.receive_intra(s, S(s).intra_message())
    for a, b in coord.pairs():
        shares, who, message = {}, a, None
        while True:
            peer = b if who == a else a
            to_peer, to_server = S(who).pair_driver(peer).step(message)
            if to_server is not None:
                shares[who] = to_server
            if to_peer is None:
                break
            who, message = peer, to_peer[1]
        coord.receive_pair(a, b, shares[a], shares[b])
    coord.compute_influence(coord.build_graph(list(SITES)))
    for s in SITES:
        S(s).receive_influence(coord.influence_message(s))
    coord.start_row_sums()
    for s in SITES:
        coord.receive_row_sums(s, S(s).row_sums_message(list(SITES), 0))
    back = coord.row_sums_for(list(SITES))
    return {s: S(s).receive_row_sums(back[s]).labels for s in SITES} | {"sessions": sess}


@pytest.mark.parametrize("crypto, extra", [("plaintext", {"standardize": True}), ("lattice", {"dp_noise": 0.5}),
                                           ("paillier", {}), ("ot", {"label_flip": 0.2})])
def test_a_job_restored_before_every_call_gives_the_uninterrupted_labels(crypto, extra, small_paillier):
    params = JobParams(job_id="state", n_classes=3, bits=48, k=4, crypto=crypto, key_bits=1024, **extra)
    straight, restored = _job(params, False), _job(params, True)
    for s in SITES:
        assert np.array_equal(straight[s], restored[s]), s
        assert (straight[s] >= 0).any()


def test_a_saved_session_holds_no_data_and_refuses_other_data():
    params = JobParams(job_id="state", n_classes=3, bits=48, k=4, crypto="lattice")
    X, y = _data()["s0"]
    sess = SiteSession(params, "s0", X, y)
    b = sess.to_bytes()
    assert X.tobytes() not in b and b"pickle" not in b
    assert SiteSession.from_bytes(b, X, y).my_contribution() == sess.my_contribution()
    y2 = y.copy()
    y2[5] = 2 if y2[5] != 2 else 1
    with pytest.raises(ProtocolError, match="other points or labels"):
        SiteSession.from_bytes(b, X, y2)
    with pytest.raises(ProtocolError):
        SiteSession.from_bytes(b[:-3], X, y)
