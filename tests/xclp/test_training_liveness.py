"""Who a training run waits for, and its idle limit, on the core's machine in process
(xclp.training_job.TrainCoordinator.awaited and step(..., silent=...)): at each step of a run — setup's
hellos and standardisation sum, a round's masked uploads and its unmask step, a round's XCLP job, the
evaluation — the live sites whose message has not arrived, and no one while the coordinator's own
decision is next; a silent site the step awaits leaves at once (told why), one whose part is in stays,
and a run left with fewer than two sites fails naming the silence. The service's view of the same rule
end to end: tests/service/test_training_liveness_e2e.py."""

import pytest
from training_helpers import FedAvgWork, draws, toy_site

from xclp.mail import COORDINATOR
from xclp.prediction_job import MemoryMailbox
from xclp.refusal import LEFT_OUT, read_refusal
from xclp.training_job import MailboxInbox, RunSpec, StartXCLP, TrainCoordinator, TrainSite, TrainState

SITES = ["a", "b", "c"]
CONFIG = {"algorithm": "fedavg", "rounds": 2, "sites_per_round": 3, "local_epochs": 1, "secure_aggregation": True,
          "lr": 0.1, "seed": 3, "standardize": False}
WHY = "no contact for 99 s while the job awaited its part (idle limit 20 s)"


class Run:
    """The machines in memory, each site stepped on its own so that a test sees every step's wait."""

    def __init__(self, algorithm="fedavg", **config):
        self.spec = RunSpec("job", algorithm, {**CONFIG, "algorithm": algorithm, **config}, 2)
        self.mail = MemoryMailbox()
        self.coord = TrainCoordinator(self.spec, TrainState.new(SITES))
        self.sites = {x: TrainSite(x, self.spec, FedAvgWork(toy_site(x, i)), draw=draws(x), n_features=4)
                      for i, x in enumerate(SITES)}
        self.started: list[StartXCLP] = []

    @property
    def st(self) -> TrainState:
        return self.coord.state

    def site(self, x: str) -> bool:
        return self.sites[x].step(self.st, MailboxInbox(self.mail, x), self.mail.put)

    def decide(self, expired=False, running=frozenset(), silent=None):
        for m in self.coord.run(self.mail, expired, running) if silent is None else \
                self.coord.step(self.mail, expired, running, silent=silent):
            (self.started.append if isinstance(m, StartXCLP) else self.mail.put)(m)

    def awaited(self, running=frozenset(), child=None):
        return self.coord.awaited(self.mail, running, child)

    def each_site_in_turn(self, expect: list[str]) -> None:
        """Every awaited site sends its part, one at a time: the wait shrinks by exactly that site."""
        for x in list(expect):
            assert self.awaited() == expect, (self.st.phase, self.st.round, self.st.survivors)
            assert self.site(x)
            expect = [y for y in expect if y != x]
        assert self.awaited() == []


def test_each_step_of_a_masked_run_awaits_exactly_the_sites_whose_message_is_missing():
    r = Run()
    r.each_site_in_turn(SITES)  # setup: the hellos
    r.decide()
    assert (r.st.phase, r.st.round) == ("round", 1) and r.st.participants == SITES
    for t in (1, 2):
        r.each_site_in_turn(SITES)  # the masked updates
        r.decide()
        assert r.st.survivors == SITES and r.st.round == t  # the unmask step, asked of the survivors
        r.each_site_in_turn(SITES)
        r.decide()
    assert r.st.phase == "evaluate" and len(r.st.history) == 2
    r.each_site_in_turn(SITES)
    r.decide()
    assert r.st.status == "done" and r.awaited() == []


def test_setups_standardisation_sum_awaits_its_sites_shares():
    r = Run(standardize=True)
    r.each_site_in_turn(SITES)
    r.decide()
    assert r.st.phase == "setup" and r.st.stats == {"attempt": 0, "sites": SITES, "done": False}
    r.each_site_in_turn(SITES)  # their masked moments
    r.decide()
    assert r.st.stats["done"] and r.st.phase == "round"


def test_an_unmasked_round_awaits_its_planned_sites_uploads():
    r = Run(secure_aggregation=False)
    r.each_site_in_turn(SITES)
    r.decide()
    r.each_site_in_turn(SITES)
    r.decide()
    assert len(r.st.history) == 1 and r.st.round == 2


def test_while_the_rounds_xclp_job_runs_the_run_awaits_the_sites_that_job_awaits():
    r = Run("fedavg-xclp")
    r.each_site_in_turn(SITES)
    r.decide()
    child = r.started[0].job_id
    asked = []

    def child_awaits(job_id):
        asked.append(job_id)
        return ["c", "gone-from-the-run", "b"]  # (the child's machine's order; only the run's live sites count)

    assert r.awaited({child}, child_awaits) == ["b", "c"] and asked == [child]
    assert r.awaited({child}) == []  # a driver that runs the job in place names no one
    # silent while the XCLP job runs: that job's machine drops it by the same rule, the run does not
    r.decide(running={child}, silent={"c": WHY})
    assert r.st.live == SITES
    assert r.st.waiting_xclp and r.awaited() == []  # the job ended: the coordinator's decision is next
    assert r.coord.step(r.mail) == [] and not r.st.waiting_xclp  # the round's own step begins (its deadline afresh)
    assert r.awaited() == SITES


def test_a_silent_site_the_step_awaits_leaves_at_once_and_the_run_goes_on_without_it():
    r = Run()
    r.each_site_in_turn(SITES)
    r.decide()
    r.site("a"), r.site("b")
    assert r.awaited() == ["c"]
    r.decide(silent={"a": WHY, "c": WHY})  # a's upload is in: it stays; c's is awaited: it leaves now
    assert r.st.live == ["a", "b"] and r.st.dropped == {"c": "round"} and r.st.reasons == {"c": WHY}
    assert read_refusal(r.mail.body(COORDINATOR, "c", LEFT_OUT)) == WHY  # (the operator reads it among the refusals)
    for _ in range(10):  # no deadline needed: the unmask step and the rounds go on over a and b
        for x in ("a", "b"):
            r.site(x)
        r.decide()
    assert r.st.status == "done" and r.st.history[0]["left_out"] == ["c"] and r.st.history[0]["decoded"]
    assert r.st.history[1]["sites"] == ["a", "b"]


def test_a_silent_site_in_the_standardisation_sum_restarts_it_at_once_over_the_others():
    r = Run(standardize=True)
    r.each_site_in_turn(SITES)
    r.decide()
    r.site("a"), r.site("b")
    r.decide(silent={"c": WHY})
    r.decide()
    assert r.st.dropped == {"c": "setup"} and r.st.stats == {"attempt": 1, "sites": ["a", "b"], "done": False}
    assert r.awaited() == ["a", "b"]


@pytest.mark.parametrize("phase", ["setup", "evaluate"])
def test_a_run_left_with_one_site_by_the_idle_limit_fails_naming_the_silence(phase):
    r = Run(rounds=1)
    if phase == "evaluate":
        for _ in range(3):
            for x in SITES:
                r.site(x)
            r.decide()
        assert r.st.phase == "evaluate"
    r.site("a")
    r.decide(silent={"b": WHY, "c": WHY})
    assert r.st.status == "failed" and WHY in r.st.failure and r.st.dropped == {"b": phase, "c": phase}
    assert r.awaited() == []


def test_a_site_sees_whether_its_own_model_collapsed_not_the_others():
    st = TrainState.new(SITES)
    st.final = {"collapsed": ["a", "c"], "site_metrics": {x: {"eval_n": 1} for x in SITES}}
    assert st.view_for("a").final["collapsed"] == ["a"] and st.view_for("b").final["collapsed"] == []
    assert st.shown()["final"]["collapsed"] == ["a", "c"]  # the operator's view keeps the list
    assert st.shown("c")["final"]["collapsed"] == ["c"]
    assert st.final["collapsed"] == ["a", "c"]  # (the view is a copy)
