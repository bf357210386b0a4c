"""What every look at a running job computes — who its step awaits, who refused, how far its phase is —
computed once per state of the job, not once per look (issue 36, point 3).

Every agent asks its job's status on each poll, and the operator's `xclp job status` and the dashboard's
job page ask the same facts. They are functions of the job's row and its messages alone, and 50 agents
polling a job in its hamming phase asked them for one state of the job many times a second: who the
phase awaits is every pair's shares (m(m−1) rows at m sites, ~70 ms at 50 sites), and the coordinator
spent its core answering the same question (bench.poll_load, bench.fifty_agents: the operator's looks
queued behind them for seconds).

So a prediction job's facts are kept per job with the state they were computed for: the machine's bytes
in the job's row and the job's messages' count and greatest id (a message is written once and never
changed: an upload, a relayed message, a result of the coordinator's, a refusal adds a row; a prune or a
purge removes some — each moves the pair). The state is read first, then the facts: a message arriving
in between makes facts newer than their key, never older. Read from the database, the key holds for any
number of coordinator processes on it and across restarts. A training job's facts (its round's XCLP job
is a job of its own, whose awaited sites are kept so) are computed as before.

The job page adds each phase's bytes (`phase_bytes`: the job's messages' sizes by topic, ~5,000 topics
at 50 sites once the pair traffic is in, 40–110 ms a look), kept with the same key: a function of the
job's messages too, and no running prediction job's messages are deleted (the engine prunes a job once
it is over, which moves the key anyway).
"""

from __future__ import annotations

import copy
import threading

from sqlalchemy import func, or_, select

from service.db import Job, Message, PrunedBytes
from service.engine import refusals
from service.lifecycle import DbMailbox, machine_state
from service.training_engine import train_progress
from xclp.job_kinds import job_kind
from xclp.job_params import JobParams
from xclp.prediction_job import PredictCoordinator
from xclp.prediction_job import progress as phase_progress
from xclp.prediction_topics import graph_mode


class LookCache:
    """Each job's facts with the state they were computed for (only the latest state of each job)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._facts: dict[str, tuple[tuple, dict]] = {}
        self.computed = 0  # (how many times the facts were computed, for the tests)

    def get(self, job_id: str, key: tuple) -> dict | None:
        with self._lock:
            got = self._facts.get(job_id)
        return got[1] if got is not None and got[0] == key else None

    def put(self, job_id: str, key: tuple, facts: dict) -> None:
        with self._lock:
            self._facts[job_id] = (key, facts)
            self.computed += 1

    def add(self, job_id: str, key: tuple, name: str, value) -> None:
        """One more fact of the state `key` (the job page's bytes), kept if that state's facts still are."""
        with self._lock:
            got = self._facts.get(job_id)
            if got is not None and got[0] == key:
                got[1][name] = value

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._facts.pop(job_id, None)


def mail_state(db, job_id: str) -> tuple[int, int | None]:
    """(count, greatest id) of the job's messages: moves with every message written or removed."""
    count, last = db.execute(select(func.count(Message.id), func.max(Message.id)).where(Message.job_id == job_id)).one()
    return int(count), last


def job_facts(db, job: Job, page: bool = False) -> dict:
    """A job's facts, as every look reads them: 'awaited' (the sites its current step awaits: for a
    training job None — service.liveness asks its round's job), 'refusals' (service.engine.refusals) and
    'progress' (parts received of those expected); `page`: and 'bytes' (phase_bytes), for the job page.
    Remembered per state of a running prediction job when the session's maker carries a LookCache
    (service.db.make_sessionmaker's `looks`)."""
    cache: LookCache | None = db.info.get("looks")
    if cache is None or job.status != "running" or job_kind(job.kind).rounds:
        if cache is not None:
            cache.forget(job.id)  # (a job over keeps nothing here)
        return {**_compute(db, job), **({"bytes": phase_bytes(db, job)} if page else {})}
    key = (job.machine, *mail_state(db, job.id))  # (the state first, then the facts)
    facts = cache.get(job.id, key)
    if facts is None:
        facts = _compute(db, job)
        cache.put(job.id, key, facts)
    facts = copy.deepcopy(facts)  # (a caller's changes stay its own)
    if page and "bytes" not in facts:
        facts["bytes"] = phase_bytes(db, job)
        cache.add(job.id, key, "bytes", dict(facts["bytes"]))
    return facts


def _compute(db, job: Job) -> dict:
    awaited = None
    if job.status != "running":
        awaited = []
    elif not job_kind(job.kind).rounds:
        awaited = PredictCoordinator(JobParams(**job.params), machine_state(job)).awaited(DbMailbox(db, job.id))
    return {"awaited": awaited, "refusals": refusals(db, job), "progress": progress(db, job)}


def phase_bytes(db, job: Job) -> dict[str, int]:
    """Bytes of the messages each phase carried (uploads, relayed site-to-site messages, broadcasts):
    those stored, and those deleted once no step needed them (PrunedBytes)."""
    rows = db.execute(select(Message.topic, func.sum(Message.size)).where(Message.job_id == job.id)
                      .group_by(Message.topic)).all()
    out: dict[str, int] = {}
    topic_phase = job_kind(job.kind).topic_phase
    for topic, size in rows:
        phase = topic_phase(topic)
        out[phase] = out.get(phase, 0) + int(size or 0)
    for row in db.scalars(select(PrunedBytes).where(PrunedBytes.job_id == job.id)):
        out[row.phase] = out.get(row.phase, 0) + int(row.bytes)
    return out


def progress(db, job: Job) -> dict:
    """How far the current phase is: parts received out of parts expected."""
    if job_kind(job.kind).rounds:
        return train_progress(job, db)
    state = machine_state(job)
    blocked = state.phase == "hamming" and graph_mode(JobParams(**job.params), DbMailbox(db, job.id), state) == "blocked"
    expected, exact, prefixes = phase_progress(state, blocked)
    where = [Message.topic == t for t in exact] + [Message.topic.startswith(p) for p in prefixes]
    got = db.scalar(select(func.count()).where(Message.job_id == job.id, or_(*where))) if where else expected
    return {"phase": job.phase, "received": int(got or 0), "expected": expected,
            "fraction": round(min(1.0, (got or 0) / expected), 3) if expected else 1.0}
