"""Who a running job waits for, when each was last heard from, and when the wait gives up.

The coordinator keeps each site's last contact — its last authenticated request of any kind: a poll
for work, an upload, a download, a status — in memory (`Contacts`; a restarted coordinator counts
from its start, so a site is never dropped for the time the coordinator itself was away). One agent
serves all of its site's jobs from one loop (and pings while a long step computes), so a site's last
contact is its contact about each of its jobs.

A site the current step awaits (its part has not arrived: the job's machine says which,
`PredictCoordinator.awaited` for a predict job, `TrainCoordinator.awaited` for a training job — while a
round's XCLP job runs, the sites that job awaits) that has been silent for longer than the job's idle
limit (`--deadline idle=SECONDS`, default 5 min) leaves the job at once, by the machine's rules of a
refusal: the job goes on without it, or fails naming it when fewer than two sites are left. A site that
keeps in contact has the step's own (long) deadline for its work.
"""

from __future__ import annotations

import datetime as dt

from service.db import Job, utcnow
from service.lifecycle import DbMailbox, idle_limit, machine_state, phase_limit
from service.training_engine import train_awaited
from xclp.job_kinds import job_kind
from xclp.job_params import JobParams
from xclp.prediction_job import PredictCoordinator


class Contacts(dict):
    """site → the time of its last authenticated request (memory only); `since`: when this coordinator
    began counting."""

    def __init__(self):
        super().__init__()
        self.since = utcnow()

    def touch(self, site: str) -> None:
        self[site] = utcnow()

    def silence(self, site: str, now: dt.datetime | None = None) -> float:
        """Seconds since the site was last heard from (at most since this coordinator started)."""
        now = now or utcnow()
        return max(0.0, (now - max(self.get(site, self.since), self.since)).total_seconds())


def _iso(when: dt.datetime) -> str:
    return when.isoformat(timespec="seconds") + "Z"


def awaited(db, job: Job) -> list[str]:
    """The live sites whose part of a running job's current step has not arrived (the job's machine decides)."""
    return _awaited(db, job)[0]


def _awaited(db, job: Job) -> tuple[list[str], Job]:
    """(the awaited sites, the job whose step they are awaited in: the job itself, or the round's XCLP
    job that a training job waits for)."""
    if job.status != "running":
        return [], job
    if job_kind(job.kind).rounds:
        sites, child = train_awaited(db, job, lambda c: awaited(db, c))
        return sites, child if child is not None else job
    machine = PredictCoordinator(JobParams(**job.params), machine_state(job))
    return machine.awaited(DbMailbox(db, job.id)), job


def silent_sites(job: Job, contacts: Contacts | None, now: dt.datetime | None = None) -> dict[str, str]:
    """The live sites silent past the job's idle limit, each with why (the machine drops those of them
    the phase awaits)."""
    if contacts is None or job.status != "running":
        return {}
    now, limit = now or utcnow(), idle_limit(job)
    out = {}
    for s in job.live:
        quiet = contacts.silence(s, now)
        if quiet > limit:
            out[s] = (f"no contact for {quiet:.0f} s while the job awaited its part of phase {job.phase} "
                      f"(idle limit {limit:g} s): its agent stopped or lost its connection")
    return out


def liveness(db, job: Job, contacts: Contacts | None, awaited: list[str] | None = None) -> dict:
    """What the operator reads of a running job's wait: `awaited` (site → its last contact and the
    seconds its silence has left before the idle limit drops it) and `deadline` (when the current step
    gives up on every site it still awaits, and the idle limit; while a training round's XCLP job runs,
    that job's phase and deadline, with its id under 'job'). Empty for a finished job. `awaited`: the
    sites a prediction job's step awaits, if the caller has them (service.looks.job_facts)."""
    if job.status != "running":
        return {"awaited": {}, "deadline": None}
    now = utcnow()
    sites, step = (awaited, job) if awaited is not None and not job_kind(job.kind).rounds else _awaited(db, job)
    limit = idle_limit(step)  # (a round's XCLP job drops its silent sites by its own limit: the run's, as a rule)
    at = step.phase_started_at + dt.timedelta(seconds=phase_limit(step))
    out = {}
    for s in sites:
        seen = contacts.get(s) if contacts is not None else None
        quiet = contacts.silence(s, now) if contacts is not None else None
        out[s] = {"last_contact": None if seen is None else _iso(seen),
                  "last_contact_s": None if seen is None else round((now - seen).total_seconds(), 1),
                  "idle_left_s": None if quiet is None else round(max(0.0, limit - quiet), 1)}
    deadline = {"phase": step.phase, "at": _iso(at), "left_s": round((at - now).total_seconds(), 1),
                "idle_limit_s": limit}
    if step is not job:
        deadline["job"] = step.id
    return {"awaited": out, "deadline": deadline}
