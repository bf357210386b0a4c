"""The audit log's reader: `GET /audit` (an operator's token; `xclp log`). What is recorded, and
when: service.audit."""

from __future__ import annotations

import datetime as dt
import re

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field
from sqlalchemy import select

from service.db import AuditRecord
from service.deps import ReleasingRoute, get_db, require_admin
from service.schemas import errors

MAX_RECORDS = 10_000  # one answer's most
ISO_TIME = (r"^(?P<y>[0-9]{4})-(?P<mo>0[1-9]|1[0-2])-(?P<d>0[1-9]|[12][0-9]|3[01])"
            r"([T ](?P<h>[01][0-9]|2[0-3]):(?P<mi>[0-5][0-9])(:(?P<s>[0-5][0-9])(\.[0-9]{1,6})?)?)?"
            r"(?P<z>Z|[+-](0[0-9]|1[0-4]):[0-5][0-9])?$")


def _utc(text: str) -> dt.datetime:
    """An ISO 8601 time as naive UTC (the database's times). A day past its month's end counts on into
    the next (2026-02-30: March 2), and a time before year 1 is year 1: every time the pattern admits
    is an answer, not an error."""
    m = re.match(ISO_TIME, text)
    if m is None:  # (the route's pattern has refused it already)
        raise HTTPException(422, f"since: {text!r} is not an ISO 8601 time")
    g = {k: int(v) if v and v[0].isdigit() else v for k, v in m.groupdict().items()}
    try:
        when = dt.datetime(max(g["y"], 1), g["mo"], 1, g["h"] or 0, g["mi"] or 0, g["s"] or 0) \
            + dt.timedelta(days=g["d"] - 1)
        if g["z"] and g["z"] != "Z":
            sign = 1 if g["z"][0] == "+" else -1
            when -= sign * dt.timedelta(hours=int(g["z"][1:3]), minutes=int(g["z"][4:6]))
    except OverflowError:
        when = dt.datetime.min if g["y"] < 5000 else dt.datetime.max
    return when


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


router = APIRouter(route_class=ReleasingRoute, tags=["audit"])


@router.get("/audit", response_model=AuditLog, dependencies=[Depends(require_admin)],
            responses=errors(401, 403, 422))
def audit_log(since: str | None = Query(None, pattern=ISO_TIME, description="only records at or after this time "
                                                                           "(ISO 8601; UTC when no zone is given)"),
              action: str | None = Query(None, max_length=32, description="only this action (e.g. job.submit), or "
                                                                          "a prefix ending in '.' (e.g. site.)"),
              who: str | None = Query(None, max_length=64, description="only this operator's or site's records"),
              target: str | None = Query(None, max_length=200, description="only records about this job or site"),
              limit: int = Query(1000, ge=1, le=MAX_RECORDS, description="at most this many, the newest"),
              db=Depends(get_db)):
    """The audit log, oldest first (the newest `limit` records of those that match)."""
    since = _utc(since) if since is not None else None
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
