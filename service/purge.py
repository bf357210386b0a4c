"""Retention: what `xclp job purge` and `xclp site purge` remove (service.purge_api is their REST side).

A job's data at the coordinator is its messages — every upload of its sites, every relayed sealed
message, every result the coordinator computed for a site, a training job's broadcast models and
plans — with the blob files of the large ones (service.blobs), the bytes its pruned phases carried
(`PrunedBytes`), and in its row a training job's loop state (each site's hello, the rounds' metrics).
`purge_job` deletes all of it, for the job and the XCLP jobs its rounds started, and leaves the row
as a tombstone: its id, kind, roster, status, times and failure, `purged_at` set, the state emptied.
So `xclp job list` and the audit log still name it, and nothing of what the sites sent remains.

A site's data is what it sent and what was addressed to it: `purge_site` deletes every message of
a revoked site's, as sender or recipient, in jobs that are over, and its hello in training jobs'
state. Kept: its row (name, identity fingerprint, the hash of its revoked token: what
`xclp site readmit` needs, and what tells its old token that it was revoked), its name in the rosters
of past jobs, and the audit log.

On SQLite the coordinator's connections run with `secure_delete` (service.db): a deleted row's bytes
are overwritten in the file, and after a purge the write-ahead log is checkpointed and truncated, so
no copy of a purged body is left in either file. On PostgreSQL deleted rows are dead tuples until
VACUUM (autovacuum) reclaims them, and the server's WAL archive and backups keep what they kept: the
purge removes the job from the database's tables; the storage below them is the database's operator's.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import delete, func, or_, select

from service.db import Job, Message, PrunedBytes, utcnow
from service.lifecycle import machine_state

log = logging.getLogger("xclp.service")


class PurgeRefused(Exception):
    """Not now (a running job without force, a site still in a running job): the 409's words."""


def job_family(db, job: Job) -> list[Job]:
    """The job and the XCLP jobs its training rounds started."""
    return [job, *db.scalars(select(Job).where(Job.parent == job.id)).all()]


def _delete_messages(db, where) -> tuple[int, int, set[str]]:
    """Delete the messages matching `where`: (how many, their bytes, the blob keys they named)."""
    n, size = db.execute(select(func.count(), func.coalesce(func.sum(Message.size), 0)).where(where)).one()
    keys = set(db.scalars(select(Message.blob).where(where, Message.blob.is_not(None))))
    db.execute(delete(Message).where(where))
    return int(n), int(size), keys


def remove_blobs(db, keys: set[str]) -> int:
    """After the rows' deletion has committed: the files no row names any more (a body two jobs
    share stays while either names it)."""
    store = db.info.get("blobs")
    if not keys or store is None:
        return 0
    still = set(db.scalars(select(Message.blob).where(Message.blob.in_(keys))))
    for key in keys - still:
        store.delete(key)
    return len(keys - still)


def flush_storage(db) -> None:
    """SQLite: checkpoint and truncate the write-ahead log, which still holds the pages of the rows
    just deleted (the database file has them overwritten: secure_delete). Busy readers can hold a
    checkpoint back: a few tries, then the next checkpoint does it."""
    bind = db.get_bind()
    if bind.dialect.name != "sqlite":
        return
    for _ in range(20):
        with bind.connect() as conn:
            busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").first()
        if busy is None or not busy[0]:
            return
        time.sleep(0.05)
    log.warning("the write-ahead log could not be truncated after a purge (busy readers); the next checkpoint will")


def wait_for_engine(engine, ids: set[str], timeout: float = 60.0) -> None:
    """A cancelled job whose step the engine is taking now: that step ends (and commits) first, so that
    nothing of it is written after the purge."""
    end = time.monotonic() + timeout
    while getattr(engine, "stepping", None) in ids:
        if time.monotonic() > end:
            raise PurgeRefused(f"the engine is still in a step of job {engine.stepping}: try again in a minute")
        time.sleep(0.05)


def purge_job(db, job: Job) -> dict:
    """Delete the (finished) job's data and its round jobs' (see the module's docstring); the caller
    commits, then calls remove_blobs(db, out["keys"]) and flush_storage(db)."""
    if job.parent is not None:
        raise PurgeRefused(f"job {job.id} is a round of training job {job.parent}: purge that job (its rounds go "
                           "with it)")
    family = job_family(db, job)
    running = [j.id for j in family if j.status == "running"]
    if running:
        raise PurgeRefused(f"job {', '.join(running)} is running: cancel it first (`xclp job purge --force` cancels "
                           "and purges)")
    ids = [j.id for j in family]
    n, size, keys = _delete_messages(db, Message.job_id.in_(ids))
    db.execute(delete(PrunedBytes).where(PrunedBytes.job_id.in_(ids)))
    now = utcnow()
    for j in family:
        # each site's hello, the rounds' metrics: the job's results too (the machine says what of its state they are)
        j.machine = machine_state(j).without_results().to_bytes()
        j.purged_at = j.purged_at or now
    return {"job": job.id, "jobs": ids, "messages": n, "bytes": size, "keys": keys, "purged_at": now}


def purgeable(db, older_than_days: float) -> list[Job]:
    """Finished jobs (done or failed) of their own (not a training round's), not purged yet, that
    finished more than `older_than_days` ago."""
    import datetime as dt

    before = utcnow() - dt.timedelta(days=older_than_days)
    return list(db.scalars(select(Job).where(Job.status != "running", Job.parent.is_(None), Job.purged_at.is_(None),
                                             Job.finished_at.is_not(None), Job.finished_at < before)
                           .order_by(Job.finished_at)).all())


def purge_site(db, name: str) -> dict:
    """Delete what the (revoked) site sent and what was addressed to it, in jobs that are over; the
    caller commits, then remove_blobs and flush_storage. Refused while a running job names it."""
    running = list(db.scalars(select(Job.id).where(Job.status == "running")).all())
    named = [j.id for j in db.scalars(select(Job).where(Job.id.in_(running))).all() if name in (j.sites or [])]
    if named:
        raise PurgeRefused(f"site {name!r} is in running job(s) {', '.join(named)}: purge its data once they are over "
                           "(or cancel them)")
    n, size, keys = _delete_messages(db, or_(Message.sender == name, Message.recipient == name))
    for job in db.scalars(select(Job)).all():
        if name in (job.sites or []):  # what the job's machine kept of the site's data (a training run: its hello)
            job.machine = machine_state(job).without_site(name).to_bytes()
    return {"site": name, "messages": n, "bytes": size, "keys": keys}

