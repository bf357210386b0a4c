"""What every kind of job shares on the coordinator: its machine's state kept as opaque bytes in the
job's row (`machine_state` reads it by the job's kind, `keep` writes it back with what its summary
says, logs the events the machine emitted and runs the clock), when a phase's deadline has passed,
and how the coordinator writes a message. The predict engine (service.engine) and the training engine
(service.training_engine) both build on it; neither imports the other's internals. The transitions
themselves (a phase, a drop, a failure) are the machines' alone: nothing here makes one.
"""

from __future__ import annotations

import json
import logging
import os

from sqlalchemy import select

from service.db import Job, Message, has_messages, message_bodies, message_body, new_message, utcnow
from xclp.job_kinds import job_kind

log = logging.getLogger("xclp.engine")

# A predict job's phase deadlines, in seconds (a job stores its own, whole, at submission).
DEFAULT_DEADLINES = {"setup": 600.0, "seed": 120.0, "counts": 120.0, "hamming": 3600.0, "row_sums": 600.0}
assert tuple(DEFAULT_DEADLINES) == job_kind("predict").steps, "a deadline for every phase of a job"
# The idle limit, kept among a job's deadlines under this key (`--deadline idle=SECONDS`, a predict job's
# and a training job's alike; a training round's XCLP job takes its run's): a site the current step
# awaits that has not been heard from (no authenticated request) for this long leaves the job at once
# (service.liveness); a site that keeps in contact has the step's own deadline.
IDLE = "idle"
DEFAULT_IDLE_LIMIT = 300.0
PREDICT_DEADLINE_KEYS = (*DEFAULT_DEADLINES, IDLE)


def put_message(db, job_id: str, sender: str, recipient: str, topic: str, body: bytes) -> None:
    db.add(new_message(db, job_id, sender, recipient, topic, body))
    db.info["messages_put"] = True  # the engine wakes the long polls once its step has committed (JobEngine.tick)


def machine_state(job: Job):
    """The job's machine state, from the bytes its row keeps (its kind's loader)."""
    return job_kind(job.kind).load(job.machine)


def new_machine(kind: str, sites: list[str]) -> bytes:
    """A new job's machine state, as its row keeps it."""
    return job_kind(kind).new_state(list(sites)).to_bytes()


# The row's columns that repeat the machine's summary (for listing and querying): only `keep` writes them.
SUMMARY_COLUMNS = ("status", "phase", "attempt", "attempts", "live", "dropped", "failure", "seed_sites",
                   "graph_sites", "round")


def keep(job: Job, state, events: list[dict] = ()) -> None:
    """Store the machine's `state` in the job's row (its bytes, and its summary in the listing columns),
    log the `events` the machine emitted, and run the driver's clock: a step with a deadline of its own
    (the summary's `step` moved) counts from now; a phase that ended records the seconds it took; a job
    that ended, when."""
    summary = state.summary()
    now = utcnow()
    if summary["phase"] != job.phase and summary["status"] != "failed":
        job.timings = {**job.timings, job.phase: round((now - job.phase_started_at).total_seconds(), 3)}
    if summary["step"] != machine_state(job).summary()["step"]:
        job.phase_started_at, job.attempt = now, 0
    if summary["status"] != "running" and job.status == "running":
        job.finished_at = now
    job.machine = state.to_bytes()
    for column in SUMMARY_COLUMNS:
        if column in summary:
            setattr(job, column, summary[column])
    for e in events:
        log.info(json.dumps({**e, "job": job.id}))


def fail(job: Job, reason: str) -> None:
    """The driver ends the job (the operator cancelled it; its step raised): the machine's state says so."""
    state = machine_state(job)
    state.abort(reason)
    keep(job, state, [{"event": "job_failed", "reason": reason}])


def phase_limit(job: Job) -> float:
    """The current phase's deadline in seconds. A job's deadlines are stored whole at submission; the
    table is the fallback."""
    return float(job.deadlines.get(job.phase, DEFAULT_DEADLINES.get(job.phase, 600.0)))


def idle_limit(job: Job) -> float:
    """Seconds an awaited site may go without contact before it is dropped (a job from before the idle
    limit has the default)."""
    return float((job.deadlines or {}).get(IDLE, DEFAULT_IDLE_LIMIT))


def expired(job: Job, since=None) -> bool:
    """True once the current phase has run past its deadline, counted from `since` (default: the
    phase's start)."""
    start = job.phase_started_at if since is None else max(since, job.phase_started_at)
    return (utcnow() - start).total_seconds() > phase_limit(job)


SENDERS_PER_READ = 500  # topics in one `senders_of` read: well within SQLite's and PostgreSQL's bound parameters


class DbMailbox:
    """The job's messages in the database, as the core's machine reads them (xclp.mail.Mailbox)."""

    def __init__(self, db, job_id: str):
        self.db, self.job_id = db, job_id

    def senders(self, recipient: str, topic: str) -> set[str]:
        return has_messages(self.db, self.job_id, recipient, topic)

    def senders_of(self, recipient: str, topics: list[str]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {t: set() for t in topics}
        if len(topics) > SENDERS_PER_READ:
            # Many topics (a hamming phase's m(m−1)/2 pairs): every message of their common prefix to the
            # recipient in one read, kept if asked — a third of the time of IN lists of 500 at 50 sites,
            # and the engine asks it on each upload, every status of the phase too (service.looks).
            prefix = os.path.commonprefix(topics)
            where = [Message.job_id == self.job_id, Message.recipient == recipient]
            if prefix:
                where.append(Message.topic.startswith(prefix, autoescape=True))
            for s, t in self.db.execute(select(Message.sender, Message.topic).where(*where)).all():
                if t in out:
                    out[t].add(s)
            return out
        for s, t in self._rows_in((Message.sender, Message.topic), Message.topic, topics, Message.recipient == recipient):
            out[t].add(s)
        return out

    def _rows_in(self, columns: tuple, key, values: list, *where):
        """`columns` of the job's messages that meet `where` and whose `key` is one of `values`, read in IN
        lists of SENDERS_PER_READ (a bounded number of parameters per read)."""
        for i in range(0, len(values), SENDERS_PER_READ):
            yield from self.db.execute(select(*columns).where(
                Message.job_id == self.job_id, *where, key.in_(values[i:i + SENDERS_PER_READ]))).all()

    def recipients(self, sender: str, topic: str) -> set[str]:
        return {r for (r,) in self.db.execute(select(Message.recipient).where(
            Message.job_id == self.job_id, Message.sender == sender, Message.topic == topic)).all()}

    def recipients_of(self, senders: list[str], topic: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {s: set() for s in senders}
        for s, r in self._rows_in((Message.sender, Message.recipient), Message.sender, senders, Message.topic == topic):
            out[s].add(r)
        return out

    def body(self, sender: str, recipient: str, topic: str) -> bytes | None:
        return message_body(self.db, self.job_id, sender, recipient, topic)

    def bodies_from(self, senders: list[str], recipient: str, topic: str) -> dict[str, bytes | None]:
        return message_bodies(self.db, self.job_id, senders, recipient, topic)
