"""The dependencies of every route: a database session, the caller (the operator or a site) and a
job, taken from the app's state (as FastAPI's full-stack template does), so that each router is a
module of its own and not a closure inside create_app."""

from __future__ import annotations

import functools
import hashlib
import hmac
import inspect

from fastapi import Depends, HTTPException, Request
from fastapi.routing import APIRoute
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db import Job, Operator, Site, utcnow
from service.guard import auth_failed, client_of


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def get_db(request: Request):
    """The route's session. Opened and closed on the event loop (an async dependency), not in a worker
    thread: a sync dependency's exit runs in the thread pool, so a finished request waited for a free
    worker thread while its session still held a pool connection — and the requests holding the
    threads waited for those connections (50 agents on PostgreSQL stalled so: bench/fifty_agents.py).
    A session takes its connection at its first query, in the route itself."""
    db = request.app.state.sessionmaker()
    try:
        yield db
    finally:
        db.close()


class ReleasingRoute(APIRoute):
    """Every router's route class: a plain (`def`) route gives its session's connection back in its own
    worker thread, as it returns. Without it the connection stayed checked out until FastAPI had
    validated the response, which for a `def` route takes ANOTHER worker thread: with every thread in a
    route waiting for a connection and every connection held by a finished route waiting for a thread,
    50 agents polling stalled the coordinator in hamming (bench/fifty_agents.py; sessions 'idle in
    transaction' for minutes after their last query). What a route returns is built from loaded values
    (sessions keep them: service.db.make_sessionmaker, expire_on_commit=False), so closing is safe."""

    def __init__(self, path: str, endpoint, **kwargs):
        if not inspect.iscoroutinefunction(endpoint):
            endpoint = _releasing(endpoint)
        super().__init__(path, endpoint, **kwargs)


def _releasing(endpoint):
    @functools.wraps(endpoint)  # (FastAPI reads the parameters through __wrapped__)
    def call(*args, **kwargs):
        try:
            return endpoint(*args, **kwargs)
        finally:
            for v in kwargs.values():
                if isinstance(v, Session):
                    v.close()  # (get_db's own close at the request's end then finds nothing to give back)
    return call


def bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if not auth.lower().startswith("bearer ") or not auth[7:].strip():
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    return auth[7:].strip()


def is_admin(request: Request, token: str) -> bool:
    return hmac.compare_digest(token.encode(), request.app.state.settings.admin_token.encode())


def active_operator(db, token: str) -> str | None:
    """The operator (`xclp operator add`) whose token this is, if not revoked."""
    return db.scalar(select(Operator.name).where(Operator.token_hash == hash_token(token), Operator.revoked_at.is_(None)))


def token_owner(db, token: str) -> tuple[str, str] | None:
    """("site" | "operator", name) of a token the coordinator issued, revoked or not; None for any other."""
    digest = hash_token(token)
    site = db.scalar(select(Site.name).where(Site.token_hash == digest))
    if site is not None:
        return "site", site
    op = db.scalar(select(Operator.name).where(Operator.token_hash == digest))
    return None if op is None else ("operator", op)


def operator_of(request: Request, token: str, db=None) -> str | None:
    """The operator a token is: "admin" (the bootstrap token, $XCLP_ADMIN_TOKEN), an operator's name,
    or None."""
    if is_admin(request, token):
        return "admin"
    if db is not None:
        return _known(request, token, active_operator(db, token))
    with request.app.state.sessionmaker() as own:
        return _known(request, token, active_operator(own, token))


def _known(request: Request, token: str, operator: str | None) -> str | None:
    """An operator's token, once found, is remembered by its digest: its looks pass the sites' polls
    (service.lanes). A revoked one stays remembered — it only skips the queue to hear its 403."""
    if operator is not None and (known := getattr(request.app.state, "operator_digests", None)) is not None:
        known.add(hash_token(token))
    return operator


def wrong_token(request: Request, token: str) -> None:
    """Count a refused token against the client's address (service.guard: 429 past the limit), and
    record it in the audit log (service.audit: whose it was, never the token)."""
    auth_failed(request.app.state, client_of(request.scope), token, f"{request.method} {request.url.path}")


def require_admin(request: Request, token: str = Depends(bearer)) -> str:
    """An operator's call: the bootstrap admin token or an operator's (not revoked). The operator's
    name is the request's (`request.state.operator`), for the audit log."""
    who = operator_of(request, token)
    if who is None:
        wrong_token(request, token)
        raise HTTPException(403, "this call needs the admin token or an operator's token")
    request.state.operator = who
    return who


def _seen(request: Request, site: str) -> None:
    """A site's last authenticated request (the dashboard's "last contact", and the idle limit's:
    service.liveness; memory only)."""
    request.app.state.last_seen[site] = utcnow()  # (service.liveness.Contacts: the idle limit reads it too)


def iso(when) -> str:
    return when.isoformat(timespec="seconds") + "Z"


def revoked_detail(site: str, when) -> str:
    return f"site {site!r} was revoked by the operator at {iso(when)}: its token no longer works"


def site_of_token(db, token: str) -> str | None:
    """The site whose token this is (None: no site's); a revoked site's token is a 401 that says so."""
    row = db.execute(select(Site.name, Site.revoked_at).where(Site.token_hash == hash_token(token))).first()
    if row is not None and row.revoked_at is not None:
        raise HTTPException(401, revoked_detail(row.name, row.revoked_at), headers={"WWW-Authenticate": "Bearer"})
    return None if row is None else row.name


def require_site(request: Request, token: str = Depends(bearer)) -> str:
    """The site whose token this is (else 401), in a short session of its own: the token is checked and
    the connection given back before the route runs (see get_db)."""
    with request.app.state.sessionmaker() as db:
        return check_site(request, token, db)


def check_site(request: Request, token: str, db) -> str:
    site = site_of_token(db, token)
    if site is None:
        wrong_token(request, token)
        raise HTTPException(401, "unknown site token", headers={"WWW-Authenticate": "Bearer"})
    _seen(request, site)
    return site


def caller(request: Request, token: str = Depends(bearer)) -> str:
    """'admin' (any operator: its name is `request.state.operator`) or the site's name (a short session
    of its own, as require_site's)."""
    if is_admin(request, token):
        request.state.operator = "admin"
        return "admin"
    with request.app.state.sessionmaker() as db:
        return _caller(request, token, db)


def _caller(request: Request, token: str, db) -> str:
    site = site_of_token(db, token)
    if site is None:
        op = _known(request, token, active_operator(db, token))
        if op is not None:
            request.state.operator = op
            return "admin"
        wrong_token(request, token)
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


def check_roster(db, names: list[str]) -> None:
    """A new job's sites: each registered (else 404) and none revoked (else 409, naming them: a
    well-formed request that the sites' state refuses, not a malformed one)."""
    rows = dict(db.execute(select(Site.name, Site.revoked_at).where(Site.name.in_(names))).all())
    unknown = [s for s in names if s not in rows]
    if unknown:
        raise HTTPException(404, f"unknown site(s): {unknown}")
    revoked = [s for s in names if rows[s] is not None]
    if revoked:
        raise HTTPException(409, "revoked site(s) cannot take part in a new job: "
                                 + ", ".join(f"{s} (revoked at {iso(rows[s])})" for s in revoked))
