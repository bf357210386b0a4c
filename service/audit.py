"""The audit log: every action that changes the coordinator's state, and every refused credential —
who (an operator's name, a site's name, "-" for a token that is nobody's), what, on what, when and
from which address (`AuditRecord`, table audit_log).

An action's record is added to the session of the action itself (`record`), so that it commits in the
same transaction: a job that exists has its "job.submit" record, and a submission that failed has none.
A refused token is recorded in a transaction of its own (`record_refusal`): the request it came with
changes nothing. A record never holds a token or a message body; a refused token is named only by whose
it is (when it is a token the coordinator issued: a site calling an operator's route, a revoked
operator), never by its text. Wrong tokens from one address are bounded by service.guard's throttle
(past `auth_failures` a minute the requests are answered 429 before any token is looked at), so a
guesser cannot fill the log faster than that.

Actions: job.submit, job.cancel, job.purge, site.add, site.revoke, site.readmit, site.token, site.purge,
site.refuse (a site left a job by its own refusal), operator.add, operator.revoke, ui.login,
auth.failed (a token nobody holds), auth.refused (a known token refused for this call).
"""

from __future__ import annotations

import logging

from fastapi import Request

from service.db import AuditRecord, utcnow
from service.guard import client_of

log = logging.getLogger("xclp.service")
OPERATOR, SITE, UNKNOWN = "operator", "site", "unknown"


def operator(request: Request) -> str:
    """The operator making this request (set by service.deps.require_admin / caller)."""
    who = getattr(request.state, "operator", None)
    if who is None:
        raise RuntimeError("an operator's action without an authenticated operator (service.deps.require_admin)")
    return who


def record(db, request: Request | None, action: str, target: str | None = None, *, who: str | None = None,
           role: str = OPERATOR, client: str | None = None, **detail) -> AuditRecord:
    """Add the action's record to `db` (the action's own session: it commits with the action).
    `who`: by default the operator of `request`."""
    if who is None:
        who = operator(request)
    if client is None and request is not None:
        client = client_of(request.scope)
    row = AuditRecord(at=utcnow(), who=who, role=role, action=action, target=target, client=client,
                      detail={k: v for k, v in detail.items() if v is not None})
    db.add(row)
    return row


def record_refusal(sessionmaker, client: str, owner: tuple[str, str] | None, where: str, why: str = "") -> None:
    """A refused credential, in a transaction of its own. owner: (role, name) of a token the
    coordinator issued (a site's, a revoked operator's), None for one nobody holds."""
    role, who = owner or (UNKNOWN, "-")
    try:
        with sessionmaker() as db:
            db.add(AuditRecord(at=utcnow(), who=who, role=role, action="auth.failed" if owner is None else "auth.refused",
                               target=None, client=client[:64], detail={"request": where[:200], **({"why": why} if why else {})}))
            db.commit()
    except Exception:  # noqa: BLE001 — the refusal is answered all the same; the log says why it is not recorded
        log.exception("could not record a refused token from %s in the audit log", client)
