"""Sites: registered by the operator (each gets a token once), and what a site asks for work."""

from __future__ import annotations

import re
import secrets

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from service.db import COORDINATOR, Job, Site
from service.deps import get_db, hash_token, require_admin, require_site
from service.schemas import Request as RequestBody
from service.schemas import SiteName, errors

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
router = APIRouter(tags=["sites"])


class SiteCreate(RequestBody):
    name: SiteName
    fingerprint: str | None = Field(None, pattern=r"^SHA256:[A-Za-z0-9+/]{43}$",
                                    description="the site's identity fingerprint, as its agent logs it at start: "
                                                "every announce of the site must then be signed by that identity")


class SiteCreated(BaseModel):
    site: str
    token: str


@router.post("/sites", response_model=SiteCreated, status_code=201, dependencies=[Depends(require_admin)],
             responses=errors(400, 401, 403, 409, 413, 422))
def add_site(body: SiteCreate, db=Depends(get_db)):
    if not NAME.match(body.name) or body.name in (COORDINATOR, "admin"):
        raise HTTPException(422, f"invalid site name {body.name!r}: letters, digits, '_', '.', '-' (≤ 64)")
    token = secrets.token_urlsafe(32)
    db.add(Site(name=body.name, token_hash=hash_token(token), fingerprint=body.fingerprint))
    try:
        db.commit()
    except IntegrityError:
        db.rollback()
        raise HTTPException(409, f"site {body.name!r} already exists") from None
    return SiteCreated(site=body.name, token=token)


@router.get("/sites", dependencies=[Depends(require_admin)], responses=errors(401, 403))
def list_sites(request: Request, db=Depends(get_db)):
    """The sites' names, and when each last made an authenticated request to this coordinator process."""
    rows = db.execute(select(Site.name, Site.fingerprint).order_by(Site.name)).all()
    names = [r.name for r in rows]
    seen = request.app.state.last_seen
    return {"sites": names, "last_seen": {s: seen[s].isoformat() + "Z" for s in names if s in seen},
            "fingerprints": {r.name: r.fingerprint for r in rows if r.fingerprint}}


@router.get("/work", responses=errors(401))
def work(site: str = Depends(require_site), db=Depends(get_db)):
    """The running jobs this site still takes part in, and the finished ones that have its results."""
    # Only the columns it needs: a training job's state (its round history) grows with every round.
    jobs = db.execute(select(Job.id, Job.status, Job.live).where(Job.status != "failed")).all()
    return {"site": site,  # whose token this is: an agent started with another site's name stops at once
            "jobs": [j.id for j in jobs if site in j.live and j.status == "running"],
            "done": [j.id for j in jobs if site in j.live and j.status == "done"]}
