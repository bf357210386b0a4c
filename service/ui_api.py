"""The operator dashboard: `GET /ui`, pages for people, served by the coordinator itself.

Who sees what. The operator logs in with the admin token and sees every job and site. A site logs in
with its own token and sees only its own view: the jobs it takes part in and its own contact; any
other job's or site's page answers 403. The token is typed once into the login form (POST, never a
URL) and exchanged for a session: a random 32-byte id in an HttpOnly, SameSite=Strict cookie scoped
to /ui, mapped server-side to who logged in, Secure when the dashboard is reached over https
(`secure_cookies`). Against cross-site requests: SameSite=Strict, POST-only state changes (login,
logout), and every POST's Origin (or Referer) must be the dashboard's own (service.guard) — SameSite
alone does not stop a cross-site *login* form, which needs no cookie. A client's failed logins are
throttled (`Throttle`: after 5 in a minute, 429 until the oldest is a minute old).
Sessions last 8 hours (or until logout) and are kept in the coordinator's database as the SHA-256 of
their id (`UISession`), so a restarted coordinator keeps everyone logged in and a copy of the
database holds no live cookie; tokens are never stored, only their hashes.

What the pages show comes from what the coordinator already keeps: each job's phases with their
seconds (`Job.timings`), who dropped in which phase (`Job.dropped`), the bytes of the messages each
phase carried (`Message.size` by topic, and `PrunedBytes` for those deleted since), live progress (the same counts the API's status reports),
a training job's per-round history and privacy ledger, and each site's last contact (its last
authenticated request since the coordinator started, else its last upload). The pages are plain
HTML and one small script (service/ui/static), no CDN: the machines are offline. The script polls
`/ui/api/…` (the same cookie) every second and redraws the live parts, curves as inline SVG.
"""

from __future__ import annotations

import ast
import datetime as dt
import hashlib
import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import delete, func, select

from service.audit import OPERATOR, SITE, record, record_refusal
from service.db import Job, Message, Site, UISession, utcnow
from service.deps import ReleasingRoute, active_operator, get_db, hash_token, is_admin, load_job, token_owner
from service.engine import cancel_job
from service.guard import LOGIN_BYTES
from service.job_list import KINDS, STATUSES, select_rows, shown_status
from xclp.job_kinds import JOB_KINDS, job_kind

UI = Path(__file__).resolve().parent / "ui"
templates = Jinja2Templates(directory=str(UI / "templates"))
COOKIE = "xclp_session"
SESSION_SECONDS = 8 * 3600
MAX_LOGIN_BYTES = LOGIN_BYTES  # a token is 43 characters; the form is refused long before it could hurt

router = APIRouter(route_class=ReleasingRoute, prefix="/ui", include_in_schema=False)


OPERATOR_PREFIX = "operator:"  # a session's `who` for an operator of `xclp operator add` (not a site name: no ':')


@dataclass
class Viewer:
    who: str  # "admin", "operator:NAME" or a site's name
    expires: dt.datetime

    @property
    def admin(self) -> bool:
        """An operator (the bootstrap token's or one's own): sees and may do what the admin token may."""
        return self.who == "admin" or self.who.startswith(OPERATOR_PREFIX)

    @property
    def operator(self) -> str | None:
        """The operator's name, as the audit log records it."""
        return self.who.removeprefix(OPERATOR_PREFIX) if self.admin else None


def _id_hash(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


def open_session(db, who: str) -> str:
    """A new session for `who`: its id, for the cookie (only its hash is stored). Expired ones go."""
    now = utcnow()
    db.execute(delete(UISession).where(UISession.expires_at <= now))
    sid = secrets.token_urlsafe(32)
    db.add(UISession(id_hash=_id_hash(sid), who=who, expires_at=now + dt.timedelta(seconds=SESSION_SECONDS)))
    db.commit()
    return sid


def close_session(db, sid: str | None) -> None:
    if sid:
        db.execute(delete(UISession).where(UISession.id_hash == _id_hash(sid)))
        db.commit()


class LoginRequired(Exception):
    """No valid session: pages redirect to the login page, the JSON endpoints answer 401."""


def viewer(request: Request, db=Depends(get_db)) -> Viewer:
    sid = request.cookies.get(COOKIE)
    row = db.get(UISession, _id_hash(sid)) if sid and len(sid) <= 128 else None
    if row is None or row.expires_at <= utcnow():
        raise LoginRequired
    return Viewer(row.who, row.expires_at)


def login_required_handler(request: Request, exc: LoginRequired) -> Response:
    if request.url.path.startswith("/ui/api/"):
        return Response('{"detail": "log in at /ui/login"}', status_code=401, media_type="application/json")
    return RedirectResponse("/ui/login", status_code=303)


def is_page(request: Request) -> bool:
    return request.url.path.startswith("/ui") and not request.url.path.startswith("/ui/api/")


def error_page(request: Request, status: int, detail: str) -> Response:
    return templates.TemplateResponse(request, "error.html", {"status": status, "detail": detail}, status_code=status)


def _forbidden(what: str) -> HTTPException:
    return HTTPException(403, f"this session may not see {what}")


# --- login ---------------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request):
    return templates.TemplateResponse(request, "login.html", {"error": None})


def _client(request: Request) -> str:
    """The client's address: the socket's peer, or the X-Forwarded-For of a proxy the coordinator
    trusts (uvicorn's --forwarded-allow-ips; `xclp coordinator serve --forwarded-allow-ips`)."""
    return request.client.host if request.client else "an unknown address"


def secure_cookies(request: Request) -> bool:
    """Secure (https only) session cookies: the request came over https — directly, or through a
    trusted proxy's X-Forwarded-Proto (uvicorn rewrites the scheme) — or the coordinator's public
    address (--public-url) is https."""
    public = request.app.state.settings.public_url or ""
    return request.url.scheme == "https" or public.lower().startswith("https://")


@router.post("/login")
async def login(request: Request, db=Depends(get_db)):
    # The cross-site check and the body limit are service.guard's, before this runs; the throttle
    # before the body is read too: a client past its failures gets no further answer about tokens.
    throttle, client = request.app.state.login_throttle, _client(request)
    wait = throttle.wait(client)
    if wait > 0:
        s = math.ceil(wait)
        return templates.TemplateResponse(
            request, "login.html", {"error": f"too many failed logins from {client}; try again in {s} s"},
            status_code=429, headers={"Retry-After": str(s)})
    body = await request.body()
    if len(body) > MAX_LOGIN_BYTES:
        return templates.TemplateResponse(request, "login.html", {"error": "that is not a token"}, status_code=413)
    token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
    who = None
    if token and is_admin(request, token):
        who = "admin"
    elif token:
        who = db.scalar(select(Site.name).where(Site.token_hash == hash_token(token), Site.revoked_at.is_(None)))
        if who is None and (op := active_operator(db, token)) is not None:
            who = OPERATOR_PREFIX + op
    if who is None:
        throttle.fail(client)
        record_refusal(request.app.state.sessionmaker, client, token_owner(db, token) if token else None,
                       "POST /ui/login")
        return templates.TemplateResponse(request, "login.html",
                                          {"error": "unknown token: give the admin token or a site's token"},
                                          status_code=401)
    operator = who.removeprefix(OPERATOR_PREFIX) if who == "admin" or who.startswith(OPERATOR_PREFIX) else None
    record(db, request, "ui.login", None, who=operator or who, role=OPERATOR if operator else SITE)
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(COOKIE, open_session(db, who), max_age=SESSION_SECONDS, path="/ui",
                        httponly=True, samesite="strict", secure=secure_cookies(request))
    return response


@router.post("/logout")
def logout(request: Request, db=Depends(get_db)):
    close_session(db, request.cookies.get(COOKIE))
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


# --- what the pages show -------------------------------------------------------------------------


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat(timespec="seconds") + "Z"


def _visible_jobs(db, v: Viewer) -> list[Job]:
    jobs = db.scalars(select(Job).order_by(Job.created_at.desc())).all()
    return [j for j in jobs if v.admin or v.who in j.sites]


def revoked_sites(db) -> dict[str, str]:
    """Each revoked site and when (`xclp site revoke`): the pages mark it wherever it is named."""
    return {n: _iso(t) for n, t in db.execute(select(Site.name, Site.revoked_at).where(Site.revoked_at.is_not(None)))}


def job_row(job: Job, revoked: dict[str, str] | None = None) -> dict:
    """A job as the lists show it; `revoked` (revoked_sites): its sites that were revoked since, and when."""
    return {"job": job.id, "kind": job.kind, "status": shown_status(job.status, job.failure), "phase": job.phase,
            "sites": job.sites,
            "revoked": {s: t for s, t in (revoked or {}).items() if s in job.sites},
            "parent": job.parent, "round": job.round or 0,
            "crypto": job.params.get("crypto") or (job.params.get("config") or {}).get("crypto"),
            "algorithm": job.params.get("algorithm"), "created_at": _iso(job.created_at),
            "finished_at": _iso(job.finished_at)}


def failure_sentence(job: Job) -> str | None:
    """A failed job's reason as a reader sees it. The engines write reasons for the log, where a dict
    of dropped sites or an exception's class name is useful; on the page they become words: each
    Python dict or list in the text becomes "a (b), c (d)" / "a, b", a leading "phase: SomeError:"
    becomes "in phase …:", and the sentence starts with a capital and ends with a full stop."""
    text = (job.failure or "").strip()
    if not text:
        return None

    def words(m: re.Match) -> str:
        try:
            value = ast.literal_eval(m.group(0))
        except (ValueError, SyntaxError):
            return m.group(0)
        if isinstance(value, dict):
            return ", ".join(f"{k} (in {v})" if isinstance(v, str) and any(v in k.phases for k in JOB_KINDS.values())
                             else f"{k} ({v})" for k, v in value.items()) or "none"
        if isinstance(value, (list, tuple, set)):
            return ", ".join(str(x) for x in value) or "none"
        return str(value)

    text = re.sub(r"\{[^{}]*\}|\[[^\[\]]*\]", words, text)
    m = re.match(r"^(\w+): \w+(?:Error|Exception|Refused): (.*)$", text, re.S)
    if m:
        text = f"in phase {m.group(1)}: {m.group(2)}"
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def progress_bar(job: Job, progress: dict) -> dict:
    """How much of the whole job the page's bar shows, and in what state. A failed job keeps the part it
    had completed (never a full bar); a running one adds its current phase's share of parts received."""
    if job.status == "done":
        return {"fraction": 1.0, "state": "done"}
    running = job.status == "running"
    if job_kind(job.kind).rounds:
        total = max(1, int(progress.get("rounds") or 1))
        # the rounds, then the final evaluation as one more step
        done = int(progress.get("rounds_done") or 0)
        part = (float(progress["received"]) / progress["expected"]) if running and progress.get("expected") else 0.0
        fraction = (done + part) / (total + 1)
    else:
        steps = job_kind(job.kind).steps
        reached = steps.index(job.phase) if job.phase in steps else len(steps)
        fraction = (reached + (float(progress.get("fraction") or 0) if running else 0.0)) / len(steps)
    return {"fraction": round(min(fraction, 1.0), 3), "state": job.status}


def job_detail(db, job: Job, v: Viewer, contacts=None) -> dict:
    """The job page's facts; `contacts`: the sites' last contacts (service.liveness), for who the phase awaits."""
    from service.jobs_api import _training_view
    from service.liveness import liveness
    from service.looks import job_facts

    phases = job_kind(job.kind).phases
    reached = phases.index(job.phase) if job.phase in phases else len(phases) - 1
    facts = job_facts(db, job, page=True)  # (once per state of the job, its bytes by phase too: service.looks)
    nbytes = facts["bytes"]
    timeline = []
    for i, p in enumerate(phases[:-1]):  # "done" is where a job ends, not a phase it spends time in
        state = "done" if i < reached or job.status == "done" else ("failed" if job.status == "failed" else "running") \
            if i == reached else "pending"
        timeline.append({"phase": p, "state": state, "seconds": job.timings.get(p), "bytes": nbytes.get(p, 0),
                         "dropped": sorted(s for s, at in job.dropped.items() if at == p)})
    kind = job_kind(job.kind)
    training = _training_view(job, v.who) if kind.rounds else {}
    privacy = training.get("privacy") if kind.rounds else kind.privacy(job.params)
    children = [] if not kind.rounds else [
        r["xclp_job"] for r in (training.get("history") or []) if r and r.get("xclp_job")]
    refused = {s: r for s, r in facts["refusals"].items() if v.admin or s == v.who}
    progress = facts["progress"]
    return {**job_row(job, revoked_sites(db)), "attempt": job.attempt, "live": job.live, "dropped": job.dropped,
            "failure": failure_sentence(job), "refused": refused, "progress": progress,
            "bar": progress_bar(job, progress), "timeline": timeline, "bytes_total": sum(nbytes.values()),
            "params": {k: job.params.get(k) for k in ("crypto", "bits", "k", "classes", "n_classes", "algorithm",
                                                      "rounds", "label_flip", "dp_noise") if k in job.params},
            "history": _curves(training.get("history") or []), "final": training.get("final"),
            "privacy": privacy if privacy and privacy.get("epsilon") is not None else None,
            "children": children, **liveness(db, job, contacts, facts["awaited"])}


def _curves(history: list[dict]) -> list[dict]:
    """Per round: the accuracies a job measures (and what `local_accuracy` is measured on), and the
    sites left out — a count and names, for a table of their own: they are not an accuracy."""
    keys = ("local_accuracy", "local_accuracy_of", "pseudo_label_accuracy", "xclp_pseudo_label_accuracy")
    return [{"round": r.get("round"), **{k: r.get(k) for k in keys}, "left_out": len(r.get("left_out") or []),
             "left_out_sites": sorted(r.get("left_out") or []), "epsilon": r.get("epsilon")} for r in history if r]


def site_rows(request: Request, db, v: Viewer) -> list[dict]:
    names = list(db.scalars(select(Site.name).order_by(Site.name)))
    if not v.admin:
        names = [n for n in names if n == v.who]
    uploads = dict(db.execute(select(Message.sender, func.max(Message.created_at))
                              .where(Message.sender.in_(names)).group_by(Message.sender)).all())
    seen = request.app.state.last_seen
    jobs = db.execute(select(Job.id, Job.status, Job.sites, Job.live)).all()
    revoked = revoked_sites(db)
    out = []
    for n in names:
        times = [t for t in (seen.get(n), uploads.get(n)) if t is not None]
        mine = [j for j in jobs if n in j.sites]
        out.append({"site": n, "revoked_at": revoked.get(n), "last_contact": _iso(max(times)) if times else None,
                    "jobs": len(mine), "running": sum(1 for j in mine if j.status == "running" and n in j.live)})
    return out


# --- JSON for the page script ----------------------------------------------------------------------


@router.get("/api/jobs")
def api_jobs(v: Viewer = Depends(viewer), db=Depends(get_db), kind: str | None = None, status: str | None = None,
             unfold: bool = False):
    """The jobs list, newest first: a training job's rounds folded under it unless `unfold`, filtered by
    kind and status (service.job_list, as `xclp job list`)."""
    revoked = revoked_sites(db)
    rows = select_rows([job_row(j, revoked) for j in _visible_jobs(db, v)], kind or None, status or None,
                       fold=not unfold)
    return {"jobs": rows, "kinds": list(KINDS), "statuses": list(STATUSES)}


@router.get("/api/jobs/{job_id}")
def api_job(job_id: str, request: Request, v: Viewer = Depends(viewer), db=Depends(get_db)):
    job = load_job(db, job_id)
    if not v.admin and v.who not in job.sites:
        raise _forbidden(f"job {job_id}")
    return job_detail(db, job, v, request.app.state.last_seen)


@router.get("/api/sites")
def api_sites(request: Request, v: Viewer = Depends(viewer), db=Depends(get_db)):
    return {"sites": site_rows(request, db, v)}


# --- pages ---------------------------------------------------------------------------------------


@router.get("", response_class=HTMLResponse)
def jobs_page(request: Request, v: Viewer = Depends(viewer), db=Depends(get_db)):
    revoked = revoked_sites(db)  # (once, not once per job)
    return templates.TemplateResponse(request, "jobs.html", {
        "viewer": v, "jobs": select_rows([job_row(j, revoked) for j in _visible_jobs(db, v)]),
        "sites": site_rows(request, db, v), "kinds": KINDS, "statuses": STATUSES})


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, v: Viewer = Depends(viewer), db=Depends(get_db)):
    job = load_job(db, job_id)
    if not v.admin and v.who not in job.sites:
        raise _forbidden(f"job {job_id}")
    return templates.TemplateResponse(request, "job.html", {"viewer": v, "job": job_detail(db, job, v, request.app.state.last_seen)})


@router.get("/sites/{name}", response_class=HTMLResponse)
def site_page(request: Request, name: str, v: Viewer = Depends(viewer), db=Depends(get_db)):
    if not v.admin and v.who != name:
        raise _forbidden(f"site {name}")
    rows = [r for r in site_rows(request, db, v) if r["site"] == name]
    if not rows:
        raise HTTPException(404, f"unknown site {name!r}")
    revoked = revoked_sites(db)
    jobs = [job_row(j, revoked) for j in _visible_jobs(db, v) if name in j.sites]
    return templates.TemplateResponse(request, "site.html", {"viewer": v, "site": rows[0], "jobs": jobs})


@router.post("/jobs/{job_id}/cancel")
def cancel_from_page(request: Request, job_id: str, v: Viewer = Depends(viewer), db=Depends(get_db)):
    """The job page's Cancel button (the operator's only; a POST, so service.guard checks its Origin):
    the job ends as `xclp job cancel` ends it (service.engine.cancel), and the page shows it failed."""
    if not v.admin:
        raise _forbidden("the cancel button: only the operator may cancel a job")
    cancel_job(request.app.state.engine, db, job_id, lambda job: record(
        db, request, "job.cancel", job_id, who=v.operator, kind=job.kind, phase=job.phase, via="dashboard"))
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)
