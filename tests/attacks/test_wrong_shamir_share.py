"""Attack: a site returns a wrong Shamir share of another site's self-mask seed at the unmask step
(xclp.training.double_masking). Before, the coordinator combined the first τ shares unchecked and the
round's sum came out wrong (or not at all). Now every dealer commits to its seed and to each share in
its masked upload; a share that misses its commitment is left out and its holder named (dropped from
the run), and the round decodes — exactly the plaintext sum — from the good shares that remain."""

import hashlib
import json

import numpy as np
import pytest
import torch
from training_helpers import FedAvgWork, draws, masked_federation, toy_site

from crypto.errors import ProtocolError
from crypto.keys import SiteKeyPair
from xclp.mail import COORDINATOR
from xclp.prediction_job import MemoryMailbox
from xclp.training import double_masking as dm
from xclp.training import secure_aggregation as secagg
from xclp.training.fedavg import FedAvgConfig, FedAvgStrategy, Site, aggregate, open_masked_round, site_upload
from xclp.training_job import BROADCAST, MailboxInbox, RunSpec, TrainCoordinator, TrainSite, TrainState

SITES = ["a", "b", "c", "d", "e"]  # τ = 2 of the 4 holders of each seed


def wrong(share_hex: str) -> str:
    raw = bytearray(bytes.fromhex(share_hex))
    raw[-1] ^= 1  # the same index, one bit of the share flipped
    return bytes(raw).hex()


# --- the arithmetic: double_masking alone --------------------------------------------------------------

def _round(liar_edit):
    template, states, keys = masked_federation(SITES)
    public = {s: k.public_bytes() for s, k in keys.items()}
    s = FedAvgStrategy(FedAvgConfig(algorithm="fedavg", secure_aggregation=True).validate(), 3, 12)
    bodies = {x: site_upload(s, states[x], template, {"n": 5}, planned=5, me=x, private=keys[x], public_keys=public,
                             participants=SITES, job="j", t=1, record=dm.SiteRecord()) for x in SITES}
    masked, metrics, shares = open_masked_round(s, bodies, template, SITES, t=1)
    commits = {x: metrics[x]["commit"] for x in SITES}
    relayed, rc = dm.relay(shares, SITES), dm.relay_commitments(commits, SITES)
    answers = {x: dm.unmask_answer(me=x, private=keys[x], public_keys=public, participants=SITES, survivors=SITES,
                                   sealed=relayed[x], job="j", t=1, commitments=rc[x]) for x in SITES}
    liar_edit(answers)
    plain = sum((secagg.encode_update(states[x], template) for x in SITES), np.zeros(secagg.n_values(template),
                                                                                       dtype=np.uint64))
    return masked, answers, commits, plain, template


def test_a_wrong_share_is_named_and_the_sum_is_still_the_plaintext_sum():
    def lie(answers):  # c's share of a's seed: c holds index 2 of a's, so it is among the first τ = 2
        answers["c"]["shares"]["a"] = wrong(answers["c"]["shares"]["a"])

    masked, answers, commits, plain, template = _round(lie)
    blamed = {}
    total = dm.unmasked_total(masked, answers, SITES, SITES, job="j", t=1, n=plain.size, commitments=commits,
                              blamed=blamed)
    assert set(blamed) == {"c"} and "a's self-mask" in blamed["c"]
    assert np.array_equal(total, plain)  # bit for bit: Σ enc(w_i), the wrong share never used


def test_too_few_good_shares_fail_the_round_and_still_name_the_liars():
    def lie(answers):  # three of a's four holders lie: one good share, τ = 2
        for x in "bcd":
            answers[x]["shares"]["a"] = wrong(answers[x]["shares"]["a"])

    masked, answers, commits, plain, _ = _round(lie)
    blamed = {}
    try:
        dm.unmasked_total(masked, answers, SITES, SITES, job="j", t=1, n=plain.size, commitments=commits, blamed=blamed)
    except ProtocolError as exc:
        assert "good shares of a's" in str(exc)
    else:
        raise AssertionError("a seed rebuilt from one good share of τ = 2")
    assert set(blamed) == {"b", "c", "d"}


def test_a_dealer_that_commits_to_other_shares_cannot_frame_their_holder():
    """a commits to a share for b other than the one it sealed to b: b holds it back and disputes a, so
    b is not blamed; the sum still decodes from the three other shares."""
    template, states, keys = masked_federation(SITES)
    public = {s: k.public_bytes() for s, k in keys.items()}
    seed = bytes(range(16))
    sealed, commit = dm.deal(seed, me="a", private=keys["a"], public_keys=public, participants=SITES, job="j", t=1)
    commit["shares"]["b"] = hashlib.sha256(b"another share").hexdigest()
    ans = dm.unmask_answer(me="b", private=keys["b"], public_keys=public, participants=SITES, survivors=["a", "b"],
                           sealed={"a": sealed["b"]}, job="j", t=1, commitments={"a": commit["shares"]["b"]})
    assert ans["disputed"] == ["a"] and "a" not in ans["shares"]
    others = {x: {"shares": {"a": dm.open_share(sealed[x], sender="a", me=x, private=keys[x], public_keys=public,
                                                job="j", t=1)}} for x in "cde"}
    blamed = {}
    seeds = dm.rebuild_seeds({"b": ans, **others}, {"a": commit}, ["a"], tau=2, job="j", t=1, blamed=blamed)
    assert seeds == {"a": seed} and blamed == {}


def test_a_dealer_whose_shares_miss_its_seed_commitment_is_named():
    keys = {s: SiteKeyPair.generate() for s in SITES}
    public = {s: k.public_bytes() for s, k in keys.items()}
    sealed, commit = dm.deal(bytes(16), me="a", private=keys["a"], public_keys=public, participants=SITES, job="j",
                             t=1)
    commit["seed"] = dm.seed_commitment(bytes([1] * 16), dealer="a", job="j", t=1)  # committed to another seed
    answers = {x: {"shares": {"a": dm.open_share(sealed[x], sender="a", me=x, private=keys[x], public_keys=public,
                                                 job="j", t=1)}} for x in "bcde"}
    blamed = {}
    assert dm.rebuild_seeds(answers, {"a": commit}, ["a"], tau=2, job="j", t=1, blamed=blamed) == {}
    assert set(blamed) == {"a"}


# --- the training machine: the coordinator names the liar and the round goes on -----------------------

CONFIG = {"algorithm": "fedavg", "rounds": 1, "sites_per_round": 5, "local_epochs": 1, "secure_aggregation": True,
          "lr": 0.1, "seed": 3}


class Recording(FedAvgWork):
    """FedAvgWork that keeps the weights it hands its site machine: the plaintext the sum is checked against."""

    def __init__(self, site, kept):
        super().__init__(site)
        self.kept = kept

    def round(self, s, t, plan, inbox):
        w = super().round(s, t, plan, inbox)
        self.kept[self.site.name] = w.state
        return w


def test_the_coordinator_names_a_site_whose_share_is_wrong_and_decodes_the_round_exactly():
    spec = RunSpec("job", "fedavg", CONFIG, 2)
    mail, kept = MemoryMailbox(), {}
    coord = TrainCoordinator(spec, TrainState.new(SITES))
    sites = {x: TrainSite(x, spec, Recording(toy_site(SITES[i], i), kept), draw=draws(x), n_features=4) for i, x in enumerate(SITES)}

    def put(m):  # c, lying: one bit of its share of a's seed flipped on the way out
        if m.sender == "c" and m.topic.startswith("reveal/"):
            body = json.loads(m.body)
            body["shares"]["a"] = wrong(body["shares"]["a"])
            m = type(m)(m.sender, m.recipient, m.topic, json.dumps(body).encode())
        mail.put(m)

    for _ in range(40):
        if coord.state.status != "running" or coord.state.history:
            break
        for x, site in sites.items():
            if x in coord.state.live:
                site.step(coord.state, MailboxInbox(mail, x), put)
        for m in coord.run(mail):
            mail.put(m)
    st = coord.state
    assert st.history, "round 1 did not close"
    assert st.dropped == {"c": "round"} and "share of a's self-mask" in st.reasons["c"]
    row = st.history[0]
    assert row["decoded"] and row["left_out"] == [] and "commit" not in row["site_metrics"]["a"]
    s = coord.strategy()
    model = s.load_broadcast(mail.body(COORDINATOR, BROADCAST, "model/1"))
    want = aggregate([(kept[x], 1) for x in SITES], secure=True)  # c's update is in the sum: it was masked in it
    assert all(torch.equal(model[k], want[k]) for k in want)


# --- through Flower, in one process ---------------------------------------------------------------------

FEDAVG = {"rounds": 1, "sites_per_round": 3, "local_epochs": 1, "lr": 0.1, "seed": 5, "secure_aggregation": True}


def flower_federation(tmp_path):
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites

    X, y = load_arrays("digits", limit=400, seed=3)
    X = (X / 16.0).astype(np.float32)
    ds = simulate_sites(X, y, 3, "iid", 0.1, seed=3)
    configs = []
    for s in ds.sites:
        m = ds.site == s
        np.savez(tmp_path / f"{s}.npz", X=ds.X[m], y=ds.y[m], y_true=ds.y_true[m])
        configs.append({"trust-on-first-use": "true", "site": s, "data-path": str(tmp_path / f"{s}.npz"), "out": str(tmp_path / f"out-{s}")})
    return ds, configs


def test_through_flower_a_site_whose_share_is_wrong_is_named_and_the_model_is_the_simulations(tmp_path, monkeypatch):
    """site2's ClientApp lies at the unmask step (one bit of its share of site0's seed flipped): the
    ServerApp's machine names it and drops it, and the round-1 model the others keep is the simulation's,
    bit for bit (τ = 1 of 2 holders: site1's good share rebuilds site0's seed)."""
    pytest.importorskip("flwr", reason="Flower is the optional extra")
    import xclp.training_job as tj
    from xclp.training.fedavg import FedAvgConfig
    from xclp.training.simulation import run_fedavg
    from xclp_flower.client_app import app as client_app
    from xclp_flower.grid import InProcessGrid
    from xclp_flower.training import FlowerTraining

    honest = tj.unmask_answer

    def lying(**kw):
        a = honest(**kw)
        if kw["me"] == "site2" and "site0" in a["shares"]:
            a["shares"]["site0"] = wrong(a["shares"]["site0"])
        return a

    monkeypatch.setattr(tj, "unmask_answer", lying)
    ds, configs = flower_federation(tmp_path)
    said = []
    out = FlowerTraining(InProcessGrid(client_app, configs), "fedavg", FEDAVG, 10, say=said.append).run()
    assert set(out["dropped"]) == {"site2"}
    assert any("site2 left the run" in m and "share of site0's self-mask" in m for m in said), said
    assert out["history"][0]["decoded"]
    sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s], ds.y_true[ds.site == s])
             for s in ds.sites]
    want = run_fedavg(sites, (ds.X[:10].astype(np.float32), ds.y_true[:10]), 10,
                      FedAvgConfig(algorithm="fedavg", **FEDAVG))["model"].state_dict()
    from xclp.training.messages import load_state
    from xclp.training.models import build_network

    for s in ("site0", "site1"):
        with open(out["written"][s].replace(".npz", ".model.npz"), "rb") as f:
            got = load_state(f.read(), build_network("mlp", 64, 10).state_dict())[0]
        assert all(torch.equal(got[k], want[k]) for k in want), s
