"""The job engine: moves jobs through their phases and runs the coordinator's server steps.

It never keeps a job in memory between steps: every decision is taken from the database (the
messages uploaded so far and the job row), so a coordinator restarted on the same database picks
up exactly where it was. The server steps themselves are `xclp.protocol.CoordinatorSession`, the
same code the in-process simulation runs.

Phases and what ends them (the recovery rules of docs/security.md and README.md, "Robustness"):

  setup     every live site has announced              → roster to every site
  seed      every live site has sent its contribution to every other live site
  counts    every live site has sent masked counts      → total to every site
  hamming   every live site sent its own distances and both shares of each of its pairs
            → graph and influence columns, one message per site
  row_sums  every participant sent masked rows          → sums to every participant; done

A deadline per phase: when it passes, the sites that have not done their part are dropped.
Before or during hamming a dropped site is removed from the graph; after it, it still shapes the
graph but adds no labels; in counts and row_sums the phase restarts without it (attempt + 1, so
every mask is fresh).
"""

from __future__ import annotations

import json
import logging
import threading
import time

from sqlalchemy import delete, select

from service.db import COORDINATOR, Job, Message, PrunedBytes, has_messages, message_body, message_phase, utcnow
from service.lifecycle import drop, expired, fail, next_phase, put_message
from service.training_engine import TRAIN_STEPS, obsolete_round_messages
from xclp.protocol import (
    JOB_PHASES,
    LEFT_OUT,
    REFUSE,
    CoordinatorSession,
    JobParams,
    Layout,
    Topic,
    blame,
    decode_announce,
    encode_roster,
    read_refusal,
    refusal,
    restart_without,
    schema_outliers,
)

log = logging.getLogger("xclp.engine")



def job_params(job: Job) -> JobParams:
    return JobParams(**job.params)


def pair_list(order: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(order) for b in order[i + 1 :]]


class JobEngine:
    """Polls running jobs and advances them; one engine per coordinator process."""

    def __init__(self, sessionmaker, interval: float = 0.2):
        self.sessionmaker = sessionmaker
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.wakeup = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xclp-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wakeup.set()
        if self._thread:
            self._thread.join(timeout=30)

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
        for job_id in ids:
            changed = False
            with self.sessionmaker() as db:
                for _ in range(8):  # a phase may complete right after the previous one
                    job = db.get(Job, job_id)
                    try:
                        step = advance(db, job)
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
            if changed:
                self.wakeup.set()
                self._prune(job_id)

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
                phase = message_phase(job.kind, topic)  # the operator still counts the bytes they carried
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


def obsolete_messages(db, job: Job) -> list[int]:
    """Ids of the messages a job no longer needs. A finished predict job's relayed pair traffic
    (sealed; for OT n_a·n_b·L values per pair) has served its purpose once the shares and results
    are in; a training job's are listed by its own engine, round by round."""
    if job.kind == "train":
        return obsolete_round_messages(db, job)
    if job.status == "running":
        return []
    return list(db.scalars(select(Message.id).where(Message.job_id == job.id, Message.topic.startswith("pair/"))))


def advance(db, job: Job) -> bool:
    """Take the step the job's messages allow now, if any. Returns True if anything changed."""
    if job.status != "running":
        return False
    before = (job.phase, job.attempt, job.round, tuple(job.live))
    if _take_refusals(db, job):
        return True
    (TRAIN_STEPS if job.kind == "train" else PHASE_STEPS)[job.phase](db, job)
    if len(job.live) < 2 and job.status == "running":
        fail(job, f"fewer than two sites left after {job.phase} (dropped: {job.dropped})")
    return (job.phase, job.attempt, job.round, tuple(job.live)) != before or job.status != "running"


def refusals(db, job: Job) -> dict[str, str]:
    """Each site that refused the job (its reason), or that the coordinator left out by the job's rules
    (the rule): what the operator reads in the status."""
    out = {s: read_refusal(message_body(db, job.id, s, COORDINATOR, REFUSE))
           for s in sorted(has_messages(db, job.id, COORDINATOR, REFUSE))}
    for (s,) in db.execute(select(Message.recipient).where(Message.job_id == job.id, Message.sender == COORDINATOR,
                                                           Message.topic == LEFT_OUT)).all():
        out.setdefault(s, "left out by the coordinator: " + read_refusal(message_body(db, job.id, COORDINATOR, s,
                                                                                       LEFT_OUT)))
    return dict(sorted(out.items()))


def _take_refusals(db, job: Job) -> bool:
    """A site that refused (its policy) or failed (its reason) leaves the job at once, by the rules of
    a site that missed the current phase's deadline — never waited for. A masked sum in progress
    restarts without it (attempt + 1), as after a deadline; fewer than two sites fail the job with
    every reason in the failure."""
    gone = has_messages(db, job.id, COORDINATOR, REFUSE) & set(job.live)
    if not gone:
        return False
    if job.kind == "predict" and job.phase in ("counts", "row_sums"):
        _, job.attempt = restart_without(job.live, gone, job.attempt)
        job.phase_started_at = utcnow()
    drop(job, gone)
    if len(job.live) < 2:
        why = "; ".join(f"{s}: {r}" for s, r in refusals(db, job).items())
        fail(job, f"fewer than two sites left in {job.phase}: {why}")
    return True


def cancel(db, job: Job) -> None:
    """The operator ends a running job (and its round's XCLP job); the sites wipe its keys at their
    next sweep, as for any failed job."""
    for child in db.scalars(select(Job).where(Job.parent == job.id, Job.status == "running")):
        fail(child, "cancelled by the operator (its training job was cancelled)")
    fail(job, "cancelled by the operator")


# --- phases -----------------------------------------------------------------------------------


def _setup(db, job: Job) -> None:
    have = has_messages(db, job.id, COORDINATOR, "announce")
    missing = set(job.live) - have
    if missing:
        if not expired(job):
            return
        drop(job, missing)  # never announced: as if it had never been in the job
        if len(job.live) < 2:
            return
    order = [s for s in job.sites if s in job.live]
    outliers = schema_outliers([decode_announce(message_body(db, job.id, s, COORDINATOR, "announce")) for s in order])
    if outliers:  # the data contract: they leave the job now, and the operator reads why
        for s, why in outliers.items():
            put_message(db, job.id, COORDINATOR, s, LEFT_OUT, refusal(why))
        drop(job, set(outliers))
        return
    roster = encode_roster([message_body(db, job.id, s, COORDINATOR, "announce") for s in order])
    for s in order:
        put_message(db, job.id, COORDINATOR, s, "roster", roster)
    next_phase(job, "seed")


def _seed(db, job: Job) -> None:
    sent = {}
    for s in job.live:
        peers = {r for r in job.live if r != s}
        got = {m for (m,) in db.execute(select(Message.recipient).where(
            Message.job_id == job.id, Message.sender == s, Message.topic == "seed")).all()}
        sent[s] = peers <= got
    incomplete = {s for s, ok in sent.items() if not ok}
    if incomplete:
        if not expired(job):
            return
        drop(job, incomplete)
    job.seed_sites = [s for s in job.sites if s in job.live]
    next_phase(job, "counts")


def _masked_sum_ready(db, job: Job, topic: str) -> bool:
    """True when every live site has sent `topic`. Past the deadline the sites that have not are
    dropped and the phase restarts without them (attempt + 1, hence fresh masks): a masked sum
    cannot complete without every mask that went into it."""
    missing = set(job.live) - has_messages(db, job.id, COORDINATOR, topic)
    if not missing:
        return True
    if expired(job):
        _, job.attempt = restart_without(job.live, missing, job.attempt)
        drop(job, missing)
        job.phase_started_at = utcnow()
    return False


def _counts(db, job: Job) -> None:
    topic = Topic.counts(job.attempt)
    if not _masked_sum_ready(db, job, topic):
        return
    coord = CoordinatorSession(job_params(job))
    for s in job.live:
        coord.receive_counts(s, message_body(db, job.id, s, COORDINATOR, topic))
    total = coord.counts_total(job.live)
    for s in job.live:
        put_message(db, job.id, COORDINATOR, s, Topic.counts_total(job.attempt), total)
    next_phase(job, "hamming")


def _hamming_missing(db, job: Job) -> set[str]:
    """The sites to remove so that every remaining site sent its distances and every remaining
    pair both shares."""
    order = [s for s in job.sites if s in job.live]
    missing = set(order) - has_messages(db, job.id, COORDINATOR, "intra")
    incomplete = {(a, b) for a, b in pair_list(order)
                  if has_messages(db, job.id, COORDINATOR, Topic.share(a, b)) != {a, b}}
    return blame(order, incomplete, missing)


def _hamming(db, job: Job) -> None:
    missing = _hamming_missing(db, job)
    if missing:
        if not expired(job):
            return
        # Gone before or during SecureHamming: removed from the graph, as if never there. The
        # graph is built in the next step, after this drop is committed.
        drop(job, missing)
        return
    t0 = time.perf_counter()
    order = [s for s in job.sites if s in job.live]
    coord = CoordinatorSession(job_params(job))
    for s in order:
        coord.register(s, message_body(db, job.id, s, COORDINATOR, "announce"))
    for s in order:
        coord.receive_intra(s, message_body(db, job.id, s, COORDINATOR, "intra"))
    # Shares that do not combine: one of the two sites misbehaved. The pair is as good as missing;
    # blame goes as for missing pairs (the core's rule, xclp.protocol.blame), and the job goes on.
    blamed = coord.receive_pairs(order, {(a, b): {s: message_body(db, job.id, s, COORDINATOR, Topic.share(a, b))
                                                  for s in (a, b)} for a, b in pair_list(order)})
    if blamed:
        log.warning(json.dumps({"event": "bad_shares", "job": job.id, "blamed": sorted(blamed)}))
        drop(job, blamed)
        return
    W = coord.build_graph(order)
    coord.compute_influence(W)
    for s in order:
        put_message(db, job.id, COORDINATOR, s, "influence", coord.influence_message(s))
    job.graph_sites = order
    job.timings = {**job.timings, "graph_and_influence": round(time.perf_counter() - t0, 3)}
    next_phase(job, "row_sums")


def _row_sums(db, job: Job) -> None:
    topic = Topic.rows(job.attempt)
    if not _masked_sum_ready(db, job, topic):
        return
    coord = CoordinatorSession(job_params(job))
    for s in job.graph_sites:
        coord.register(s, message_body(db, job.id, s, COORDINATOR, "announce"))
    coord.layout = Layout(sites=list(job.graph_sites), sizes=[coord.roster[s].n for s in job.graph_sites])
    coord.start_row_sums()
    for s in job.live:
        coord.receive_row_sums(s, message_body(db, job.id, s, COORDINATOR, topic))
    for s, body in coord.row_sums_for(list(job.live)).items():
        put_message(db, job.id, COORDINATOR, s, Topic.sums(job.attempt), body)
    next_phase(job, "done")


PHASE_STEPS = {"setup": _setup, "seed": _seed, "counts": _counts, "hamming": _hamming, "row_sums": _row_sums}
assert tuple(PHASE_STEPS) == JOB_PHASES[:-1], "a step for every phase of a job, in order"
