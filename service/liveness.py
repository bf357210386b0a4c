"""Who a running job waits for, when each was last heard from, and when the wait gives up.

The coordinator keeps each site's last contact — its last authenticated request of any kind: a poll
for work, an upload, a download, a status — in memory (`Contacts`; a restarted coordinator counts
from its start, so a site is never dropped for the time the coordinator itself was away). One agent
serves all of its site's jobs from one loop (and pings while a long step computes), so a site's last
contact is its contact about each of its jobs.

A site the current phase awaits (its part has not arrived: `PredictCoordinator.awaited`) that has been
silent for longer than the job's idle limit (`--deadline idle=SECONDS`, default 5 min) leaves the job
at once, by the rules of a refusal: the job goes on without it, or fails naming it when fewer than two
sites are left. A site that keeps in contact has the phase's own (long) deadline for its work.
"""

from __future__ import annotations

import datetime as dt

from service.db import Job, utcnow
from service.lifecycle import DbMailbox, idle_limit, machine_state, phase_limit
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
    """The live sites whose part of a running predict job's current phase has not arrived (the job's
    machine decides; a training job: none named)."""
    if not job_kind(job.kind).phase_deadlines or job.status != "running":
        return []
    machine = PredictCoordinator(JobParams(**job.params), machine_state(job))
    return machine.awaited(DbMailbox(db, job.id))


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


def liveness(db, job: Job, contacts: Contacts | None) -> dict:
    """What the operator reads of a running job's wait: `awaited` (site → its last contact and the
    seconds its silence has left before the idle limit drops it) and `deadline` (when the current phase
    gives up on every site it still awaits, and the idle limit). Empty for a finished job."""
    if job.status != "running" or not job_kind(job.kind).phase_deadlines:  # (a training job's waits: its rounds' own rules)
        return {"awaited": {}, "deadline": None}
    now = utcnow()
    limit = idle_limit(job)
    at = job.phase_started_at + dt.timedelta(seconds=phase_limit(job))
    out = {}
    for s in awaited(db, job):
        seen = contacts.get(s) if contacts is not None else None
        quiet = contacts.silence(s, now) if contacts is not None else None
        out[s] = {"last_contact": None if seen is None else _iso(seen),
                  "last_contact_s": None if seen is None else round((now - seen).total_seconds(), 1),
                  "idle_left_s": None if quiet is None else round(max(0.0, limit - quiet), 1)}
    return {"awaited": out,
            "deadline": {"phase": job.phase, "at": _iso(at), "left_s": round((at - now).total_seconds(), 1),
                         "idle_limit_s": limit}}
