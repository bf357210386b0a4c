"""Operators: the people who run the coordinator, each with a token of their own, so that the audit
log (service.audit) can say who did what.

`POST /operators` (any operator) makes one: its token is shown once and stored as its SHA-256 only.
SHA-256 and not a password KDF (bcrypt, scrypt, Argon2): the token is 32 random bytes, not a password a
person chose — 2^256 guesses are out of reach at any hash rate, so a slow hash would add nothing but
a slower request, and an unsalted digest is what lets the coordinator find a token's operator with one
indexed lookup (the sites' tokens are kept the same way). The bootstrap token ($XCLP_ADMIN_TOKEN) is
the operator "admin" and keeps working: it is how the first operator is added, and how a lost or
revoked operator is replaced. Every operator may do everything the bootstrap token may (one role);
a revoked operator's token stops working at once and its name is never given again.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from service.audit import record
from service.db import COORDINATOR, Operator, UISession, utcnow
from service.deps import ReleasingRoute, get_db, hash_token, iso, require_admin
from service.schemas import Request as RequestBody
from service.schemas import SiteName, errors
from service.sites_api import NAME, new_token

router = APIRouter(route_class=ReleasingRoute, tags=["operators"])
UI_PREFIX = "operator:"  # a dashboard session's `who` for an operator (service.ui_api)


class OperatorCreate(RequestBody):
    name: SiteName = Field(description="letters, digits, '_', '.', '-'; at most 64; not 'coordinator' or 'admin'")


class OperatorCreated(BaseModel):
    operator: str
    token: str = Field(description="shown once: the coordinator keeps only its SHA-256")


class OperatorRow(BaseModel):
    operator: str
    created_at: str
    created_by: str
    revoked_at: str | None = None


class OperatorList(BaseModel):
    operators: list[OperatorRow]


@router.post("/operators", response_model=OperatorCreated, status_code=201, responses=errors(400, 401, 403, 409, 413, 422))
def add_operator(body: OperatorCreate, request: Request, who: str = Depends(require_admin), db=Depends(get_db)):
    if not NAME.match(body.name) or body.name in (COORDINATOR, "admin"):
        raise HTTPException(422, f"invalid operator name {body.name!r}: letters, digits, '_', '.', '-' (≤ 64), "
                                 "not 'admin' (the bootstrap token's)")
    token = new_token()
    db.add(Operator(name=body.name, token_hash=hash_token(token), created_by=who))
    try:
        db.flush()
    except IntegrityError:
        db.rollback()
        raise HTTPException(409, f"operator {body.name!r} already exists (a revoked operator's name is not given "
                                 "again: the audit log's records name one person)") from None
    record(db, request, "operator.add", body.name)
    db.commit()
    return OperatorCreated(operator=body.name, token=token)


@router.get("/operators", response_model=OperatorList, dependencies=[Depends(require_admin)],
            responses=errors(401, 403))
def list_operators(db=Depends(get_db)):
    """Every operator but the bootstrap one ("admin"), revoked ones included."""
    rows = db.scalars(select(Operator).order_by(Operator.name)).all()
    return OperatorList(operators=[OperatorRow(operator=r.name, created_at=iso(r.created_at), created_by=r.created_by,
                                               revoked_at=None if r.revoked_at is None else iso(r.revoked_at))
                                   for r in rows])


@router.post("/operators/{name}/revoke", response_model=OperatorRow, responses=errors(401, 403, 404, 409, 422))
def revoke_operator(name: str, request: Request, who: str = Depends(require_admin), db=Depends(get_db)):
    """The operator's token stops working at once, and its dashboard sessions end."""
    if name == "admin":
        raise HTTPException(409, "the bootstrap operator 'admin' is $XCLP_ADMIN_TOKEN: change that and restart the "
                                 "coordinator to replace it")
    op = db.get(Operator, name)
    if op is None:
        raise HTTPException(404, f"unknown operator {name!r}")
    if op.revoked_at is not None:
        raise HTTPException(409, f"operator {name!r} was revoked at {iso(op.revoked_at)}")
    op.revoked_at = utcnow()
    db.execute(delete(UISession).where(UISession.who == UI_PREFIX + name))
    record(db, request, "operator.revoke", name, self=(who == name) or None)
    db.commit()
    return OperatorRow(operator=op.name, created_at=iso(op.created_at), created_by=op.created_by,
                       revoked_at=iso(op.revoked_at))
