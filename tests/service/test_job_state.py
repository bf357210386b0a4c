"""A job's machine state is kept whole, as the bytes its machine writes: the row's listing columns are
only what the machine's summary says, written together with the bytes; a field the machine has and the
service never named survives a store and a load; the driver's failure (a cancel) goes through the
machine's state, so the bytes and the columns never disagree."""

from service.db import Job, utcnow
from service.lifecycle import fail, keep, machine_state, new_machine
from xclp.job_kinds import job_kind


def _job(kind: str, **kw) -> Job:
    return Job(id="j", kind=kind, params={}, sites=["a", "b", "c"], live=["a", "b", "c"], status="running",
               phase="setup", attempt=0, round=0, timings={}, attempts={}, dropped={},
               machine=new_machine(kind, ["a", "b", "c"]), **kw)


def test_a_training_state_is_stored_as_its_bytes_and_the_columns_are_its_summary():
    job = _job("train")
    job.phase_started_at = utcnow()
    state = machine_state(job)
    state.phase, state.round, state.clock = "round", 2, 3  # (as the machine moves them)
    state.live, state.dropped = ["a", "b"], {"c": "setup"}
    state.history = [{"round": 1, "site_metrics": {"a": {"n": 1}, "b": {"n": 2}}}]
    state.strikes = {"a": 1}
    keep(job, state)
    assert (job.phase, job.round, job.live, job.dropped, job.status) == ("round", 2, ["a", "b"], {"c": "setup"},
                                                                         "running")
    again = machine_state(job)
    assert again == state and job.machine == state.to_bytes()  # whole, not field by field
    assert job.timings == {"setup": job.timings["setup"]}  # the phase that ended: its seconds, the driver's clock
    # a site is shown its own metrics and strikes only, in the same wire form
    seen = job_kind("train").load(again.view_for("a").to_bytes())
    assert seen.history[0]["site_metrics"] == {"a": {"n": 1}} and seen.strikes == {"a": 1} and seen.labelled == []


def test_a_cancel_fails_the_machines_state_and_the_row_alike():
    job = _job("predict")
    job.phase_started_at = utcnow()
    fail(job, "cancelled by the operator")
    state = machine_state(job)
    assert (state.status, state.failure) == ("failed", "cancelled by the operator")
    assert (job.status, job.failure) == ("failed", "cancelled by the operator") and job.finished_at is not None
