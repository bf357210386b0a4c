"""The training run's order as machines (xclp.training_job): the coordinator's state saves to bytes and
goes on where it was, a site that misses rounds is struck and dropped by the rule, the unmask step
recovers a dropout without anyone masking again, a site refuses a second masked upload or a second
unmask, and a run with fewer than two sites left fails at once with the reason."""


import pytest
import torch
from training_helpers import FedAvgWork, draws, toy_site

from crypto.errors import ProtocolError
from xclp.mail import COORDINATOR, Send
from xclp.prediction_job import MemoryMailbox
from xclp.refusal import REFUSE, refusal
from xclp.training.messages import load_json
from xclp.training_job import BROADCAST, MailboxInbox, RunSpec, TrainCoordinator, TrainSite, TrainState

SITES = ["a", "b", "c"]
# (standardize off: these tests count the rounds' steps; setup's standardisation sum has tests of its own,
# tests/training/test_input_scaling.py)
CONFIG = {"algorithm": "fedavg", "rounds": 3, "sites_per_round": 3, "local_epochs": 1, "secure_aggregation": True,
          "lr": 0.1, "seed": 3, "standardize": False}


class Run:
    """A tiny in-memory driver: the mailbox, the coordinator, the sites; `silent` sites do nothing."""

    def __init__(self, config=None, max_missed=3, silent=()):
        self.spec = RunSpec("job", "fedavg", {**CONFIG, **(config or {})}, 2, max_missed=max_missed)
        self.mail = MemoryMailbox()
        self.coord = TrainCoordinator(self.spec, TrainState.new(SITES))
        self.sites = {x: TrainSite(x, self.spec, FedAvgWork(toy_site(SITES[i], i)), draw=draws(x), n_features=4)
                      for i, x in enumerate(SITES)}
        self.silent = set(silent)

    def sites_step(self) -> bool:
        moved = False
        for x, site in self.sites.items():
            if x not in self.silent:
                moved |= site.step(self.coord.state, MailboxInbox(self.mail, x), self.mail.put)
        return moved

    def coord_step(self, expired=False):
        for m in self.coord.run(self.mail, expired):
            self.mail.put(m)

    def until_done(self, limit=60):
        for _ in range(limit):
            if self.coord.state.status != "running":
                return
            before = self.coord.state.to_bytes()
            moved = self.sites_step()
            self.coord_step()
            if not moved and self.coord.state.to_bytes() == before:
                self.coord_step(expired=True)  # nothing moves but the clock: the step's deadline passed
        raise AssertionError("the run did not end")

    def model(self):
        s = self.coord.strategy()
        return s.load_broadcast(self.mail.body(COORDINATOR, BROADCAST, f"model/{self.coord.state.history[-1]['round']}"))


def test_settle_lets_a_steps_deadline_pass_only_when_nothing_moved():
    """A driver with no clock (the simulation, a Flower Grid round) settles the machine: the silent
    site is dropped only once neither the sites nor a decision moved anything."""
    run = Run(silent={"c"})
    run.sites_step()  # a's and b's hellos
    run.coord.settle(run.mail, True, run.mail.put)
    assert run.coord.state.phase == "setup" and run.coord.state.live == SITES  # c may still come
    run.coord.settle(run.mail, False, run.mail.put)
    st = run.coord.state
    assert st.dropped == {"c": "setup"} and (st.phase, st.round, st.history) == ("round", 1, [])  # a new step: its deadline afresh
    run.coord.settle(run.mail, False, run.mail.put)  # round 1's deadline passes only now: nobody uploaded
    assert run.coord.state.history[0]["round"] == 1 and run.coord.state.history[0]["left_out"] == ["a", "b"]


def test_a_run_goes_through_setup_rounds_evaluate_and_done():
    r = Run()
    r.until_done()
    st = r.coord.state
    assert st.status == "done" and [h["round"] for h in st.history] == [1, 2, 3]
    assert all(h["decoded"] and h["left_out"] == [] for h in st.history)
    assert st.final["not_evaluated"] == []


def test_the_state_saves_to_bytes_and_a_restored_coordinator_goes_on_to_the_same_model():
    a = Run()
    a.until_done()
    b = Run()
    for _ in range(6):  # part of the way, then a fresh machine from the saved bytes
        b.sites_step()
        b.coord_step()
    saved = b.coord.state.to_bytes()
    assert TrainState.from_bytes(saved) == b.coord.state
    b.coord = TrainCoordinator(b.spec, TrainState.from_bytes(saved))
    b.until_done()
    ma, mb = a.model(), b.model()
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_a_silent_site_is_left_out_struck_and_dropped_after_max_missed_rounds():
    r = Run(config={"rounds": 4}, max_missed=2)
    r.sites_step()
    r.coord_step()
    r.silent = {"c"}  # said hello, then vanished
    r.until_done()
    st = r.coord.state
    assert [h["left_out"] for h in st.history] == [["c"], ["c"], [], []]
    assert st.reasons == {"c": "missed 2 rounds in a row"} and st.dropped == {"c": "round"}
    assert st.history[2]["sites"] == ["a", "b"] and st.status == "done"


def test_the_unmask_step_recovers_a_site_that_vanished_after_masking():
    r = Run(config={"rounds": 1})
    for _ in range(2):
        r.sites_step()
        r.coord_step()
    # every masked update is in: the unmask step is asked of all three; c vanishes before answering
    assert r.coord.state.survivors == SITES and not r.mail.senders(COORDINATOR, "reveal/1")
    r.silent = {"c"}
    r.until_done()
    h = r.coord.state.history[0]
    assert h["decoded"] and h["trained"] == SITES and h["left_out"] == []
    # the recovered sum is the three sites' mean: the same as a run in which c answered
    full = Run(config={"rounds": 1})
    full.until_done()
    ma, mb = r.model(), full.model()
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_a_site_masks_a_round_and_answers_its_unmask_once_whatever_the_server_asks():
    r = Run(config={"rounds": 1})
    for _ in range(2):
        r.sites_step()
        r.coord_step()
    r.sites_step()  # the unmask answers
    st = r.coord.state
    assert st.survivors == SITES and r.mail.senders(COORDINATOR, "reveal/1") == set(SITES)
    site = r.sites["a"]
    # a server that starts round 1 again over fewer sites: the site sends the kept body, never a new masking
    again = TrainState.from_bytes(st.to_bytes())
    again.survivors, again.participants = [], ["a", "b"]
    site.record.pop("sent:coordinator:update/1/0")
    sent = []
    site.step(again, MailboxInbox(r.mail, "a"), sent.append)
    assert [m.body for m in sent] == [r.mail.body("a", COORDINATOR, "update/1/0")]
    site.keep.pop("update/1/0")
    site.record.pop("sent:coordinator:update/1/0")
    with pytest.raises(ProtocolError, match="masked update was made already"):
        site.step(again, MailboxInbox(r.mail, "a"), sent.append)
    # and an unmask step asked again (say, naming c dropped): refused
    site.record.pop("sent:coordinator:reveal/1")
    site.keep.pop("reveal/1")
    with pytest.raises(ProtocolError, match="unmask step was answered already"):
        site.step(st, MailboxInbox(r.mail, "a"), sent.append)


def test_fewer_than_two_sites_left_fail_the_run_at_once_with_the_reason():
    r = Run()
    r.mail.put(Send("b", COORDINATOR, REFUSE, refusal("b's policy refuses FedAvg")))
    r.mail.put(Send("c", COORDINATOR, REFUSE, refusal("c's data file is gone")))
    r.coord_step()
    st = r.coord.state
    assert st.status == "failed" and "fewer than 2 sites" in st.failure
    assert "b's policy refuses FedAvg" in st.failure and "c's data file is gone" in st.failure
    # one missing hello past setup's deadline leaves two sites: the run goes on
    q = Run(silent={"c"})
    q.sites_step()
    q.coord_step(expired=True)
    assert q.coord.state.phase == "round" and q.coord.state.live == ["a", "b"]


def test_a_run_that_cannot_learn_fails_at_setup_with_the_reason():
    r = Run()
    for i, x in enumerate(SITES):
        d = toy_site(SITES[i], i)
        d.y[:] = -1
        r.sites[x].work = FedAvgWork(d)
    r.sites_step()
    r.coord_step()
    assert r.coord.state.status == "failed" and r.coord.state.failure == "no site holds labels: nothing to learn from"


def test_a_round_where_one_masked_update_arrived_is_never_summed():
    r = Run(config={"rounds": 2}, silent={"b", "c"})
    r.sites["b"].step(r.coord.state, MailboxInbox(r.mail, "b"), r.mail.put)
    r.sites["c"].step(r.coord.state, MailboxInbox(r.mail, "c"), r.mail.put)
    r.sites_step()
    r.coord_step()  # setup done, round 1 planned
    r.sites_step()  # only a uploads
    r.coord_step(expired=True)
    h = r.coord.state.history[0]
    # a "sum" of a's update alone would be a's weights: no unmask step, the round keeps the model
    assert h["decoded"] is False and h["left_out"] == SITES and not r.mail.senders(COORDINATOR, "reveal/1")
    assert load_json(r.mail.body(COORDINATOR, BROADCAST, "plan/1"))["sites"] == SITES
    m0 = r.coord.strategy().load_broadcast(r.mail.body(COORDINATOR, BROADCAST, "model/0"))
    m1 = r.model()
    assert all(torch.equal(m0[k], m1[k]) for k in m0)


def test_the_runs_model_is_the_broadcast_of_its_last_closed_round():
    state = TrainState.new(["a", "b"])
    state.history = [{}, {}]
    assert TrainCoordinator(RunSpec("job", "fedavg", {}, 2), state).model_topic() == "model/2"
    assert TrainCoordinator(RunSpec("job", "fedct", {}, 2), state).model_topic() is None  # models stay at the sites
