"""The audit log's reader: `GET /audit` (an operator's token; `xclp log`). What is recorded, and
when: service.audit."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field
from sqlalchemy import select

from service.db import AuditRecord
from service.deps import get_db, require_admin
from service.schemas import errors

MAX_RECORDS = 10_000  # one answer's most


class AuditEntry(BaseModel):
    id: int
    at: str = Field(description="when (UTC, ISO 8601)")
    who: str = Field(description="the operator's or the site's name; '-' for a token nobody holds")
    role: str = Field(description="operator, site or unknown")
    action: str
    target: str | None = Field(None, description="the job or site (or operator) acted on")
    client: str | None = Field(None, description="the address the request came from")
    detail: dict


class AuditLog(BaseModel):
    records: list[AuditEntry]


def iso(when: dt.datetime) -> str:
    return when.isoformat(timespec="seconds") + "Z"


def entry(r: AuditRecord) -> AuditEntry:
    return AuditEntry(id=r.id, at=iso(r.at), who=r.who, role=r.role, action=r.action, target=r.target,
                      client=r.client, detail=r.detail or {})


router = APIRouter(tags=["audit"])


@router.get("/audit", response_model=AuditLog, dependencies=[Depends(require_admin)],
            responses=errors(401, 403, 422))
def audit_log(since: dt.datetime | None = Query(None, description="only records at or after this time (ISO 8601; "
                                                                  "UTC when no zone is given)"),
              action: str | None = Query(None, max_length=32, description="only this action (e.g. job.submit), or "
                                                                          "a prefix ending in '.' (e.g. site.)"),
              who: str | None = Query(None, max_length=64, description="only this operator's or site's records"),
              target: str | None = Query(None, max_length=200, description="only records about this job or site"),
              limit: int = Query(1000, ge=1, le=MAX_RECORDS, description="at most this many, the newest"),
              db=Depends(get_db)):
    """The audit log, oldest first (the newest `limit` records of those that match)."""
    if since is not None and since.tzinfo is not None:
        try:
            since = since.astimezone(dt.UTC).replace(tzinfo=None)
        except OverflowError:  # (0001-01-01T00:00+01:00 is before the first UTC time there is)
            raise HTTPException(422, f"since: {since.isoformat()} is out of range") from None
    q = select(AuditRecord)
    if since is not None:
        q = q.where(AuditRecord.at >= since)
    if action:
        q = q.where(AuditRecord.action.startswith(action, autoescape=True) if action.endswith(".") else AuditRecord.action == action)
    if who:
        q = q.where(AuditRecord.who == who)
    if target:
        q = q.where(AuditRecord.target == target)
    rows = db.scalars(q.order_by(AuditRecord.id.desc()).limit(limit)).all()
    return AuditLog(records=[entry(r) for r in reversed(rows)])
