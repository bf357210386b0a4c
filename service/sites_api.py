"""Sites: registered by the operator (each gets a token once), revoked, readmitted or given a new token
by the operator (each recorded in the audit log, service.audit), and what a site asks for work (a
bounded long poll while it has none)."""

from __future__ import annotations

import asyncio
import re
import secrets
import time

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from service.audit import record
from service.db import COORDINATOR, Job, Site, UISession, has_messages, utcnow
from service.deps import ReleasingRoute, get_db, hash_token, iso, require_admin, require_site
from service.lifecycle import put_message
from service.schemas import Request as RequestBody
from service.schemas import SiteName, errors
from xclp.refusal import REFUSE, refusal

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
router = APIRouter(route_class=ReleasingRoute, tags=["sites"])
RECHECK_SECONDS = 1.0  # a waiting poll for work reads the database at least this often
STALE_AFTER = 600.0  # seconds without contact after which `GET /sites` marks a site stale (by default)


class SiteCreate(RequestBody):
    name: SiteName
    fingerprint: str | None = Field(None, pattern=r"^SHA256:[A-Za-z0-9+/]{43}$",
                                    description="the site's identity fingerprint, as its agent logs it at start: "
                                                "every announce of the site must then be signed by that identity")


class SiteCreated(BaseModel):
    site: str
    token: str


class SiteRevoked(BaseModel):
    site: str
    revoked_at: str = Field(description="when (UTC, ISO 8601)")
    jobs: list[str] = Field(description="the running jobs it was taken out of (a refusal recorded on its behalf)")


def new_token() -> str:
    """A site's bearer token: 32 random bytes, URL-safe base64, never starting with '-' (a token passed
    as `--token -…` is read by argparse as an option: the agent would refuse its own command line)."""
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token


@router.post("/sites", response_model=SiteCreated, status_code=201, responses=errors(400, 401, 403, 409, 413, 422))
def add_site(body: SiteCreate, request: Request, _=Depends(require_admin), db=Depends(get_db)):
    if not NAME.match(body.name) or body.name in (COORDINATOR, "admin"):
        raise HTTPException(422, f"invalid site name {body.name!r}: letters, digits, '_', '.', '-' (≤ 64)")
    token = new_token()
    db.add(Site(name=body.name, token_hash=hash_token(token), fingerprint=body.fingerprint))
    try:
        db.flush()
    except IntegrityError:
        db.rollback()
        old = db.get(Site, body.name)
        again = (f": it was revoked at {iso(old.revoked_at)}; `xclp site readmit {body.name}` admits it again under "
                 "its name and identity") if old is not None and old.revoked_at is not None else ""
        raise HTTPException(409, f"site {body.name!r} already exists{again}") from None
    record(db, request, "site.add", body.name, fingerprint=body.fingerprint)
    db.commit()
    return SiteCreated(site=body.name, token=token)


@router.get("/sites", dependencies=[Depends(require_admin)], responses=errors(401, 403, 422))
def list_sites(request: Request, db=Depends(get_db),
               stale_after: float | None = Query(None, gt=0, le=1e9, allow_inf_nan=False,
                                                 description="seconds without contact after which a site in "
                                                             f"service is 'stale' (default {STALE_AFTER:g})")):
    """The sites' names, and when each last made an authenticated request to this coordinator process;
    `stale`: each site in service silent for longer than `stale_after` seconds (counted from the
    coordinator's start for a site not heard from since), with its seconds of silence."""
    rows = db.execute(select(Site.name, Site.fingerprint, Site.revoked_at).order_by(Site.name)).all()
    names = [r.name for r in rows]
    seen = request.app.state.last_seen
    limit = stale_after or getattr(request.app.state.settings, "stale_after", STALE_AFTER)
    silence = {r.name: round(seen.silence(r.name), 1) for r in rows if r.revoked_at is None} \
        if hasattr(seen, "silence") else {}
    return {"sites": names, "last_seen": {s: seen[s].isoformat() + "Z" for s in names if s in seen},
            "fingerprints": {r.name: r.fingerprint for r in rows if r.fingerprint},
            "revoked": {r.name: iso(r.revoked_at) for r in rows if r.revoked_at is not None},
            "stale": {s: q for s, q in silence.items() if q > limit}, "stale_after_s": limit}


def _site(db, name: str) -> Site:
    site = db.get(Site, name)
    if site is None:
        raise HTTPException(404, f"unknown site {name!r}")
    if site.revoked_at is not None:
        raise HTTPException(409, f"site {name!r} was revoked at {iso(site.revoked_at)}: `xclp site readmit {name}` "
                                 "admits it again (a new token, the same name and identity)")
    return site


@router.post("/sites/{name}/revoke", response_model=SiteRevoked, responses=errors(401, 403, 404, 409, 422))
def revoke_site(request: Request, name: str, _=Depends(require_admin), db=Depends(get_db)):
    """Take a site out of service: its token stops working at once (401, saying when it was revoked),
    no new job may name it, and each running job it is in drops it at once, by the job's rules for a
    site that refuses ("revoked by the operator", recorded on its behalf)."""
    site = _site(db, name)
    site.revoked_at = utcnow()
    db.execute(delete(UISession).where(UISession.who == name))  # its dashboard logins end too
    record(db, request, "site.revoke", name)
    db.commit()
    why = refusal(f"revoked by the operator at {iso(site.revoked_at)}")
    jobs = []
    for job in db.scalars(select(Job).where(Job.status == "running")).all():
        if name not in job.live or name in has_messages(db, job.id, COORDINATOR, REFUSE):
            continue
        put_message(db, job.id, name, COORDINATOR, REFUSE, why)
        try:
            db.commit()
            jobs.append(job.id)
        except IntegrityError:  # its own refusal came in first: the job drops it all the same
            db.rollback()
    request.app.state.engine.notify()
    return SiteRevoked(site=name, revoked_at=iso(site.revoked_at), jobs=jobs)


@router.post("/sites/{name}/token", response_model=SiteCreated, responses=errors(401, 403, 404, 409, 422))
def rotate_token(name: str, request: Request, _=Depends(require_admin), db=Depends(get_db)):
    """A new token for the site, shown once; the old one stops working at once. The site keeps its
    identity fingerprint and its jobs (its agent goes on with them once restarted with the new token)."""
    site = _site(db, name)
    token = new_token()
    site.token_hash = hash_token(token)
    db.execute(delete(UISession).where(UISession.who == name))  # logins made with the old token end
    record(db, request, "site.token", name)
    db.commit()
    return SiteCreated(site=name, token=token)


@router.post("/sites/{name}/readmit", response_model=SiteCreated, responses=errors(401, 403, 404, 409, 422))
def readmit_site(name: str, request: Request, _=Depends(require_admin), db=Depends(get_db)):
    """Admit a revoked site again under its name and registered identity (fingerprint), with a new
    token shown once (the revoked one stays refused). It may be named by new jobs again; the running
    jobs it was dropped from go on without it."""
    site = db.get(Site, name)
    if site is None:
        raise HTTPException(404, f"unknown site {name!r}")
    if site.revoked_at is None:
        raise HTTPException(409, f"site {name!r} is in service: only a revoked site can be readmitted")
    token = new_token()
    record(db, request, "site.readmit", name, revoked_at=iso(site.revoked_at), fingerprint=site.fingerprint)
    site.token_hash, site.revoked_at = hash_token(token), None
    db.commit()
    request.app.state.engine.notify()
    return SiteCreated(site=name, token=token)


def _work(Session, site: str) -> dict:
    with Session() as db:
        # Only the columns it needs: a training job's state (its round history) grows with every round.
        jobs = db.execute(select(Job.id, Job.status, Job.live).where(Job.status != "failed",
                                                                     Job.purged_at.is_(None))).all()
    return {"site": site,  # whose token this is: an agent started with another site's name stops at once
            "jobs": [j.id for j in jobs if site in j.live and j.status == "running"],
            "done": [j.id for j in jobs if site in j.live and j.status == "done"]}


@router.get("/work", responses=errors(401, 422))
async def work(request: Request, wait: float = 0.0, site: str = Depends(require_site)):
    """The running jobs this site still takes part in, and the finished ones that have its results.

    wait: seconds (at most 10) to hold the request while the site has no running job, answering as
    soon as its answer changes (a job submitted, one finished): an idle agent's one request instead
    of many. With `wait`, `held` says whether the coordinator held it (else it answered at once: the
    site has a running job, or already holds its share of waiting polls)."""
    state = request.app.state
    Session, settings, engine = state.sessionmaker, state.settings, state.engine
    seen = engine.changes
    answer = await run_in_threadpool(_work, Session, site)
    wait = min(max(wait, 0.0), settings.max_wait) if wait == wait else 0.0  # (NaN: none)
    waiting = state.work_waits
    if wait <= 0:
        return answer
    if answer["jobs"] or waiting.get(site, 0) >= settings.max_waits_per_site:
        return {**answer, "held": False}
    # The wait sleeps on the event loop, not in a worker thread, and reads the database only when the
    # engine says jobs changed (or every RECHECK_SECONDS): waiting polls cost the others nothing.
    waiting[site] = waiting.get(site, 0) + 1
    try:
        end = time.monotonic() + wait
        read_at = time.monotonic()
        while (now := time.monotonic()) < end:
            await asyncio.sleep(min(0.05, end - now))
            if await request.is_disconnected():  # an agent stopped: nobody to answer (nor to wait for at shutdown)
                break
            if engine.changes == seen and time.monotonic() - read_at < RECHECK_SECONDS:
                continue
            seen, read_at = engine.changes, time.monotonic()
            new = await run_in_threadpool(_work, Session, site)
            if new != answer:
                answer = new
                break
    finally:
        waiting[site] -= 1
    return {**answer, "held": True}
