"""The job engine: moves jobs through their phases, one decision at a time.

It never keeps a job in memory between steps: every decision is taken from the database (the
messages uploaded so far and the job row), so a coordinator restarted on the same database picks
up exactly where it was. A prediction job's decisions are the core's machine
(`xclp.prediction_job.PredictCoordinator`: the phases, drops, blame, restarts and failure, written
once for every driver); this engine gives it the database as its mailbox, keeps its state in the
job's row as bytes it never reads (service.lifecycle.keep), logs the events it emits, and owns the
clock (each phase's deadline, and the seconds it took). A training job's
machine is `xclp.training_job.TrainCoordinator`, run the same way by service.training_engine.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import contextmanager

from sqlalchemy import delete, select

from service.db import Job, Message, PrunedBytes
from service.job_list import CANCELLED
from service.lifecycle import DbMailbox, expired, fail, keep, machine_state, put_message
from service.liveness import Contacts, silent_sites
from service.training_engine import run_spec, train_step
from xclp.executor import Executor
from xclp.job_kinds import job_kind
from xclp.job_params import JobParams
from xclp.prediction_job import PredictCoordinator
from xclp.prediction_job import refusals as job_refusals
from xclp.training_job import TrainCoordinator

log = logging.getLogger("xclp.engine")

HOLD_WAIT = 60.0  # seconds a writer of a running job's row waits for the engine's step in flight (then 409)


class EngineBusy(Exception):
    """The engine's step in flight did not end within HOLD_WAIT."""


def job_params(job: Job) -> JobParams:
    return JobParams(**job.params)


class JobEngine:
    """Polls running jobs and advances them; one engine per coordinator process."""

    def __init__(self, sessionmaker, interval: float = 0.2, executor=None, contacts: Contacts | None = None):
        """`contacts`: each site's last contact (service.liveness), which the app's requests keep; with it,
        an awaited site silent past its job's idle limit is dropped (without it, only deadlines drop)."""
        self.sessionmaker = sessionmaker
        self.contacts = contacts
        self.interval = interval
        # where a blocked graph's heavy tasks run (xclp.executor): the machine's, not the job's choice
        self.executor = executor if executor is not None else Executor()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.wakeup = threading.Event()
        # Bumped whenever jobs may have changed for the sites (a job submitted, a step taken, a message
        # of the coordinator's written): the sites' long polls (GET /work?wait=, and for a message of the
        # coordinator's) look at the database again when it moves.
        self.changes = 0
        self.stepping: str | None = None  # the job whose step the engine is taking now, if any
        # Held by the engine from reading a job's row to committing its step, and by any other writer of a
        # running job's row (the operator's cancel: `held`). Without it a cancel committed during a step
        # was lost: the step, read before it, wrote the machine's running state over the cancelled one
        # (the row said failed, its machine running, and no one stepped it again).
        self._step_lock = threading.Lock()

    def notify(self) -> None:
        """Jobs changed outside the engine (submitted, a site revoked): step now, and wake the long polls."""
        self.changes += 1
        self.wakeup.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xclp-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wakeup.set()
        if self._thread:
            self._thread.join(timeout=30)

    @contextmanager
    def held(self, timeout: float = HOLD_WAIT):
        """No step of the engine's begins or ends while this is held: read the job again inside, write
        and commit inside. EngineBusy if the step in flight has not ended within `timeout` seconds."""
        if not self._step_lock.acquire(timeout=timeout):
            raise EngineBusy(f"the engine is still in a step of job {self.stepping}: try again in a minute")
        try:
            yield
        finally:
            self._step_lock.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # keep the engine alive; the job that failed is marked failed below
                log.exception("engine tick failed")
            self.wakeup.wait(self.interval)
            self.wakeup.clear()

    def tick(self) -> None:
        with self.sessionmaker() as db:
            ids = db.scalars(select(Job.id).where(Job.status == "running")).all()
        try:
            for job_id in ids:
                changed = False
                self.stepping = job_id  # (service.purge waits for a cancelled job's step in flight to end)
                with self.sessionmaker() as db:
                    for _ in range(8):  # a phase may complete right after the previous one
                        with self._step_lock:  # from the row's read to the step's commit (see __init__)
                            # the row as it is now, not the session's copy (expire_on_commit=False): a cancel
                            # may have come in since the last iteration
                            job = db.get(Job, job_id, populate_existing=True)
                            try:
                                step = advance(db, job, self.executor, self.contacts)
                                db.commit()  # each step commits: no write lock held across the next one
                            except Exception as exc:
                                db.rollback()
                                log.exception("job %s failed in phase %s", job_id, job.phase)
                                job = db.get(Job, job_id)
                                fail(job, f"{job.phase}: {type(exc).__name__}: {exc}")
                                db.commit()
                                step = True
                        changed |= step
                        if not step or job.status != "running":
                            break
                    changed |= bool(db.info.pop("messages_put", False))  # (committed, or rolled back: a look costs little)
                if changed:
                    self.notify()
                    self._prune(job_id)
        finally:
            self.stepping = None

    def _prune(self, job_id: str) -> None:
        """Delete the messages no later step of the job reads (`obsolete_messages`), in a transaction
        of their own after the job's step, so that pruning never delays a phase. Blob files go after
        the rows' deletion has committed (a file no row names is never needed again; one left by a
        crash in between is swept at the next start)."""
        with self.sessionmaker() as db:
            job = db.get(Job, job_id)
            if job is None:
                return
            ids = obsolete_messages(db, job)
            if not ids:
                return
            keys = set(db.scalars(select(Message.blob).where(Message.id.in_(ids), Message.blob.is_not(None))))
            for topic, size in db.execute(select(Message.topic, Message.size).where(Message.id.in_(ids))).all():
                phase = job_kind(job.kind).topic_phase(topic)  # the operator still counts the bytes they carried
                row = db.get(PrunedBytes, (job.id, phase))
                if row is None:
                    row = PrunedBytes(job_id=job.id, phase=phase, bytes=0)
                    db.add(row)
                row.bytes += int(size)
            db.execute(delete(Message).where(Message.id.in_(ids)))
            db.commit()
            store = db.info.get("blobs")
            if keys and store is not None:
                still = set(db.scalars(select(Message.blob).where(Message.blob.in_(keys))))
                for key in keys - still:
                    store.delete(key)


def job_state(job: Job):
    """The job's machine state, from its row (its kind's loader over the bytes it keeps)."""
    return machine_state(job)


def obsolete_messages(db, job: Job) -> list[int]:
    """Ids of the messages no later step of the job reads, by its kind's rule (xclp.job_kinds: a finished
    prediction job's relayed pair traffic, a training run's updates and models of closed rounds); this
    only selects them (JobEngine._prune deletes them)."""
    rules, state = job_kind(job.kind), job_state(job)
    if not rules.prunes(state):
        return []
    rows = db.execute(select(Message.id, Message.topic).where(Message.job_id == job.id)).all()
    return [mid for mid, topic in rows if rules.obsolete(topic, state)]


def advance(db, job: Job, executor=None, contacts: Contacts | None = None) -> bool:
    """Take the step the job's messages allow now, if any. Returns True if anything changed. `executor`:
    where a prediction job's blocked-graph tasks run (xclp.executor; None: here); `contacts`: the sites'
    last contacts, for the idle limit (service.liveness; None: deadlines alone)."""
    if job.status != "running":
        return False
    before = (job.phase, job.attempt, job.round, tuple(job.live))
    if not job_kind(job.kind).rounds:
        _predict_step(db, job, executor, silent_sites(job, contacts))
    else:
        train_step(db, job, silent_sites(job, contacts))
    return (job.phase, job.attempt, job.round, tuple(job.live)) != before or job.status != "running"


def refusals(db, job: Job) -> dict[str, str]:
    """Each site that refused the job (its reason), or that the coordinator left out by the job's rules
    (the rule): what the operator reads in the status."""
    if job_kind(job.kind).rounds:  # a training run's rules drop sites without a message: its machine says why
        return TrainCoordinator(run_spec(job), machine_state(job)).refusals(DbMailbox(db, job.id))
    return job_refusals(DbMailbox(db, job.id), job.sites)


def _predict_step(db, job: Job, executor=None, silent: dict[str, str] | None = None) -> None:
    """One decision of the core's machine (xclp.prediction_job) on what the database holds; the job's row
    keeps the machine's state, so a restarted coordinator goes on where it was. What is left here is the
    clock: a phase's deadline, the sites silent past the idle limit (`silent`), and the seconds each
    phase took."""
    machine = PredictCoordinator(job_params(job), machine_state(job), executor=executor)
    for m in machine.step(DbMailbox(db, job.id), expired(job), silent=silent):
        put_message(db, job.id, m.sender, m.recipient, m.topic, m.body)
    if machine.timings:
        job.timings = {**job.timings, "graph_and_influence": round(sum(machine.timings.values()), 3)}
    keep(job, machine.state, machine.events)


def cancel_job(engine: JobEngine, db, job_id: str, audit: Callable[[Job], None]) -> Job:
    """The operator's cancel, for every door (`xclp job cancel`, the dashboard's button, `purge --force`):
    the job's row read, cancelled, its audit line added (`audit`) and committed while the engine takes no
    step (JobEngine.held), then the engine woken. HTTPException 404 (no such job), 409 (not running, or
    the engine's step in flight did not end within HOLD_WAIT)."""
    from fastapi import HTTPException

    try:
        with engine.held():
            job = db.get(Job, job_id, populate_existing=True)
            if job is None:
                raise HTTPException(404, f"unknown job {job_id!r}")
            if job.status != "running":
                raise HTTPException(409, f"job {job_id} is {job.status}: only a running job can be cancelled")
            cancel(db, job)
            audit(job)
            db.commit()
    except EngineBusy as exc:
        raise HTTPException(409, str(exc)) from None
    engine.notify()
    return job


def cancel(db, job: Job) -> None:
    """The operator ends a running job (and its round's XCLP job); the sites wipe its keys at their
    next sweep, as for any failed job."""
    for child in db.scalars(select(Job).where(Job.parent == job.id, Job.status == "running")):
        fail(child, f"{CANCELLED} (its training job was cancelled)")
    fail(job, CANCELLED)  # (the lists read it as `cancelled`: service.job_list)
