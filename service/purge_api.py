"""Retention's routes: purge a job (`POST /jobs/{id}/purge`), the finished jobs older than N days
(`POST /jobs/purge?older_than_days=N`) and a revoked site's data (`POST /sites/{name}/purge`). What is
removed and what is kept: service.purge. Each purge is recorded in the audit log (service.audit) in
the transaction that deletes the rows."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy import select

from service.audit import record
from service.db import Job, Site
from service.deps import ReleasingRoute, get_db, iso, load_job, require_admin
from service.engine import cancel_job
from service.purge import PurgeRefused, flush_storage, purge_job, purge_site, purgeable, remove_blobs, wait_for_engine
from service.schemas import errors

router = APIRouter(route_class=ReleasingRoute, tags=["retention"])


class JobPurged(BaseModel):
    job: str
    jobs: list[str] = Field(description="the job and the XCLP jobs of its training rounds, each now a tombstone")
    messages: int = Field(description="messages deleted (uploads, relayed messages, results)")
    bytes: int = Field(description="their bytes")
    blobs: int = Field(description="blob files deleted")
    purged_at: str
    cancelled: bool = Field(False, description="the job was running and was cancelled first (force)")


class JobsPurged(BaseModel):
    older_than_days: float
    purged: list[JobPurged]


class SitePurged(BaseModel):
    site: str
    messages: int = Field(description="messages it sent or that were addressed to it, deleted")
    bytes: int
    blobs: int


def _purge_one(request: Request, db, job: Job, force: bool = False) -> JobPurged:
    cancelled = False
    if force and job.status == "running" and job.parent is None:
        job = cancel_job(request.app.state.engine, db, job.id, lambda job: record(
            db, request, "job.cancel", job.id, kind=job.kind, phase=job.phase, via="purge --force"))
        try:
            wait_for_engine(request.app.state.engine, {job.id} | {j.id for j in db.scalars(
                select(Job).where(Job.parent == job.id))})
        except PurgeRefused as exc:
            raise HTTPException(409, str(exc)) from None
        db.expire_all()
        job = db.get(Job, job.id)
        cancelled = True
    try:
        out = purge_job(db, job)
    except PurgeRefused as exc:
        db.rollback()
        raise HTTPException(409, str(exc)) from None
    record(db, request, "job.purge", job.id, kind=job.kind, jobs=out["jobs"], messages=out["messages"],
           bytes=out["bytes"], cancelled=cancelled or None)
    db.commit()
    blobs = remove_blobs(db, out["keys"])
    return JobPurged(job=job.id, jobs=out["jobs"], messages=out["messages"], bytes=out["bytes"], blobs=blobs,
                     purged_at=iso(out["purged_at"]), cancelled=cancelled)


@router.post("/jobs/purge", response_model=JobsPurged, dependencies=[Depends(require_admin)],
             responses=errors(401, 403, 422))
def purge_old_jobs(request: Request, db=Depends(get_db),
                   older_than_days: float = Query(gt=0, le=36500, allow_inf_nan=False,
                                                  description="purge every finished job (done or failed) that "
                                                              "finished more than this many days ago")):
    """Retention: purge the finished jobs older than `older_than_days` (each as `POST /jobs/{id}/purge`)."""
    done = [_purge_one(request, db, job) for job in purgeable(db, older_than_days)]
    if done:
        flush_storage(db)
    return JobsPurged(older_than_days=older_than_days, purged=done)


@router.post("/jobs/{job_id}/purge", response_model=JobPurged, dependencies=[Depends(require_admin)],
             responses=errors(401, 403, 404, 409, 422))
def purge_one_job(job_id: str, request: Request, db=Depends(get_db),
                  force: bool = Query(False, description="a running job is cancelled first (else 409)")):
    """Delete a finished job's messages, blob files and results (and its training rounds' XCLP jobs');
    its row stays as a tombstone (`purged_at`). A running job: 409, unless `force` cancels it first."""
    out = _purge_one(request, db, load_job(db, job_id), force)
    flush_storage(db)
    return out


@router.post("/sites/{name}/purge", response_model=SitePurged, dependencies=[Depends(require_admin)],
             responses=errors(401, 403, 404, 409, 422))
def purge_site_data(name: str, request: Request, db=Depends(get_db)):
    """Delete a revoked site's data: every message it sent or that was addressed to it (its uploads, its
    results, relayed messages to it) and its hello in training jobs. Its row stays (name, identity: for
    `readmit`). 409 while the site is in service or a running job names it."""
    site = db.get(Site, name)
    if site is None:
        raise HTTPException(404, f"unknown site {name!r}")
    if site.revoked_at is None:
        raise HTTPException(409, f"site {name!r} is in service: revoke it first (`xclp site revoke {name}`)")
    try:
        out = purge_site(db, name)
    except PurgeRefused as exc:
        db.rollback()
        raise HTTPException(409, str(exc)) from None
    record(db, request, "site.purge", name, messages=out["messages"], bytes=out["bytes"])
    db.commit()
    blobs = remove_blobs(db, out["keys"])
    flush_storage(db)
    return SitePurged(site=name, messages=out["messages"], bytes=out["bytes"], blobs=blobs)
