"""The dependencies of every route: a database session, the caller (the operator or a site) and a
job, taken from the app's state (as FastAPI's full-stack template does), so that each router is a
module of its own and not a closure inside create_app."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Depends, HTTPException, Request
from sqlalchemy import select

from service.db import Job, Site, utcnow


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def get_db(request: Request):
    with request.app.state.sessionmaker() as db:
        yield db


def bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if not auth.lower().startswith("bearer ") or not auth[7:].strip():
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    return auth[7:].strip()


def is_admin(request: Request, token: str) -> bool:
    return hmac.compare_digest(token.encode(), request.app.state.settings.admin_token.encode())


def require_admin(request: Request, token: str = Depends(bearer)) -> None:
    if not is_admin(request, token):
        raise HTTPException(403, "this call needs the admin token")


def _seen(request: Request, site: str) -> None:
    """A site's last authenticated request (the dashboard's "last contact"; memory only)."""
    request.app.state.last_seen[site] = utcnow()


def require_site(request: Request, token: str = Depends(bearer), db=Depends(get_db)) -> str:
    site = db.scalar(select(Site.name).where(Site.token_hash == hash_token(token)))
    if site is None:
        raise HTTPException(401, "unknown site token", headers={"WWW-Authenticate": "Bearer"})
    _seen(request, site)
    return site


def caller(request: Request, token: str = Depends(bearer), db=Depends(get_db)) -> str:
    """'admin' or the site's name."""
    if is_admin(request, token):
        return "admin"
    site = db.scalar(select(Site.name).where(Site.token_hash == hash_token(token)))
    if site is None:
        raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
    _seen(request, site)
    return site


def load_job(db, job_id: str) -> Job:
    job = db.get(Job, job_id)
    if job is None:
        raise HTTPException(404, f"unknown job {job_id!r}")
    return job


def known_sites(db, names: list[str]) -> set[str]:
    return set(db.scalars(select(Site.name).where(Site.name.in_(names))))
