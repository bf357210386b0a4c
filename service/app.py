"""The coordinator's HTTP API (FastAPI).

Resources: sites (registered by the operator), jobs (submitted by the operator, worked on by the
sites) and a job's messages. A message is addressed: a site uploads its part of a phase to the
coordinator, or a sealed site-to-site message to a peer (the coordinator only relays it), and
downloads what is addressed to it — nothing else. Bodies are binary (arrays as .npy, sealed channel
messages, ciphertexts); JSON only for control. Every upload is checked (who, which phase, which
attempt, size, shape) before anything is stored; an identical replay stores nothing. The message
routes are in service.messages_api, the training routes in service.training_api, the request and
error schemas in service.schemas.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.blobs import DEFAULT_THRESHOLD, BlobStore, default_blob_dir
from service.db import (
    COORDINATOR,
    Job,
    Message,
    Site,
    make_engine,
    make_sessionmaker,
)
from service.engine import JobEngine, pair_list
from service.lifecycle import DEFAULT_DEADLINES
from service.messages_api import make_messages_router
from service.schemas import Request as RequestBody
from service.schemas import Seconds, SiteName, errors
from service.training_api import make_training_router
from service.training_engine import train_progress
from xclp.protocol import CRYPTO_CHOICES, DEFAULT_SECURE_CRYPTO, JobParams

log = logging.getLogger("xclp.service")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass
class Settings:
    database: str = "sqlite:///xclp-coordinator.db"
    admin_token: str = ""
    max_body_bytes: int = 1 << 30
    engine_interval: float = 0.2
    default_deadlines: dict = field(default_factory=lambda: dict(DEFAULT_DEADLINES))
    # Message bodies of at least blob_threshold bytes are kept as files in blob_dir (service.blobs)
    # instead of the database. None: next to a SQLite database file (<file>.blobs); with PostgreSQL
    # or an in-memory database, no folder (every body in the database) unless one is given here.
    blob_dir: str | None = None
    blob_threshold: int = DEFAULT_THRESHOLD
    # fsync each blob file before its row commits. None: as durable as the database's own commits —
    # yes on PostgreSQL; no on SQLite, whose commits (WAL, synchronous=NORMAL) are not fsynced either.
    blob_fsync: bool | None = None
    # Long polls (`?wait=`) a site may hold at once; more are answered at once, as without `wait`.
    max_waits_per_site: int = 8


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- schemas ----------------------------------------------------------------------------------


class SiteCreate(RequestBody):
    name: SiteName


class SiteCreated(BaseModel):
    site: str
    token: str


class JobCreate(RequestBody):
    kind: Literal["predict"] = Field("predict", description="'predict': one-shot transductive prediction "
                                                            "(training jobs: POST /jobs/train)")
    sites: list[SiteName] = Field(min_length=2, json_schema_extra={"uniqueItems": True},
                                  description="participating sites (at least two, each once), in roster order")
    crypto: Literal[CRYPTO_CHOICES] = Field(DEFAULT_SECURE_CRYPTO, description="'plaintext' has no security")
    bits: int = Field(1024, ge=1, le=65535, description="LSH length L")
    k: int = Field(10, ge=1, le=10_000, description="neighbours per point in the kNN graph")
    alpha: float = Field(0.99, gt=0, lt=1)
    power: float = Field(3.0, gt=0, le=64, allow_inf_nan=False)
    classes: int = Field(10, ge=2, le=1 << 16, description="number of classes C; labels are 0..C−1 at every site")
    key_bits: int = Field(2048, ge=1024, le=16384, description="Paillier modulus (the sites' policy decides what "
                                                              "they accept; 2048 by default)")
    deadlines: dict[Literal[tuple(DEFAULT_DEADLINES)], Seconds] = Field(default_factory=dict,
                                                                         description="phase -> seconds")


class JobCreated(BaseModel):
    job: str


class JobStatus(BaseModel):
    job: str
    kind: str
    status: str
    phase: str
    attempt: int
    sites: list[str]
    live: list[str]
    seed_sites: list[str]
    graph_sites: list[str]
    dropped: dict[str, str]
    attempts: dict[str, int]
    params: dict
    progress: dict
    timings: dict
    failure: str | None
    created_at: str
    finished_at: str | None
    round: int = Field(0, description="training jobs: the round in progress")
    parent: str | None = Field(None, description="a predict job started by a training job's round: that job")
    training: dict = Field(default_factory=dict, description="training jobs: per-round metrics ('history'), "
                                                             "the final evaluation ('final')")


# --- the app ----------------------------------------------------------------------------------


def create_app(settings: Settings) -> FastAPI:
    if len(settings.admin_token) < 8:
        raise ValueError("the admin token must have at least 8 characters")
    engine = make_engine(settings.database)
    blob_dir = settings.blob_dir or default_blob_dir(settings.database)
    fsync = settings.blob_fsync if settings.blob_fsync is not None else not settings.database.startswith("sqlite")
    blobs = BlobStore(blob_dir, settings.blob_threshold, fsync) if blob_dir else None
    Session = make_sessionmaker(engine, blobs)
    job_engine = JobEngine(Session, settings.engine_interval)
    registry = CollectorRegistry()
    requests_total = Counter("xclp_requests_total", "HTTP requests", ["method", "status"], registry=registry)
    bytes_in = Counter("xclp_upload_bytes_total", "bytes of accepted uploads", registry=registry)
    jobs_gauge = Gauge("xclp_jobs", "jobs by status", ["status"], registry=registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if blobs is not None:  # files whose rows never committed (a coordinator killed mid-upload)
            with Session() as db:
                referenced = set(db.scalars(select(Message.blob).where(Message.blob.is_not(None))))
            if removed := blobs.sweep(referenced):
                log.info("removed %d unreferenced blob files from %s", removed, blobs.root)
        job_engine.start()
        log.info("coordinator started on %s", settings.database.split("@")[-1])
        yield
        job_engine.stop()
        engine.dispose()

    app = FastAPI(title="XCLP coordinator", version="0.1.0", lifespan=lifespan,
                  description="Coordinator of privacy-preserving cross-client label propagation jobs.")
    app.state.settings, app.state.sessionmaker, app.state.engine = settings, Session, job_engine

    @app.exception_handler(RequestValidationError)
    async def one_error_model(request: Request, exc: RequestValidationError):
        # One error body for every error: {"detail": "<what went wrong>"}, here each field's complaint.
        where = lambda e: ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"  # noqa: E731
        return JSONResponse(status_code=422, content={"detail": "; ".join(f"{where(e)}: {e.get('msg')}"
                                                                       for e in exc.errors())})

    api_routes: list[APIRoute] = []  # every route of the API, the training router's too (filled at the end)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route whose path matches; a path served by
            # several routes (GET and POST /jobs) must name them all. A literal path (/jobs/train)
            # is its own resource, not an instance of /jobs/{job_id}.
            hits = [r for r in api_routes if r.path_regex.match(request.url.path)]
            literal = [r for r in hits if r.path == request.url.path]
            headers["Allow"] = ", ".join(sorted({m for r in (literal or hits) for m in r.methods}))
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc.detail)}, headers=headers)

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        response = await call_next(request)
        requests_total.labels(request.method, str(response.status_code)).inc()
        return response

    def get_db():
        with Session() as db:
            yield db

    def bearer(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        if not auth.lower().startswith("bearer ") or not auth[7:].strip():
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        return auth[7:].strip()

    def require_admin(token: str = Depends(bearer)) -> None:
        if not hmac.compare_digest(token.encode(), settings.admin_token.encode()):
            raise HTTPException(403, "this call needs the admin token")

    def require_site(token: str = Depends(bearer), db=Depends(get_db)) -> str:
        site = db.scalar(select(Site.name).where(Site.token_hash == hash_token(token)))
        if site is None:
            raise HTTPException(401, "unknown site token", headers={"WWW-Authenticate": "Bearer"})
        return site

    def caller(token: str = Depends(bearer), db=Depends(get_db)) -> str:
        """'admin' or the site's name."""
        if hmac.compare_digest(token.encode(), settings.admin_token.encode()):
            return "admin"
        site = db.scalar(select(Site.name).where(Site.token_hash == hash_token(token)))
        if site is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return site

    def load_job(db, job_id: str) -> Job:
        job = db.get(Job, job_id)
        if job is None:
            raise HTTPException(404, f"unknown job {job_id!r}")
        return job

    # --- health and metrics ---------------------------------------------------------------------
    @app.get("/health", tags=["ops"])
    def health(db=Depends(get_db)):
        db.execute(select(1))
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
    def metrics(db=Depends(get_db)):
        for status in ("running", "done", "failed"):
            jobs_gauge.labels(status).set(db.scalar(select(func.count()).where(Job.status == status)) or 0)
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    # --- sites ----------------------------------------------------------------------------------
    @app.post("/sites", response_model=SiteCreated, status_code=201, tags=["sites"],
              dependencies=[Depends(require_admin)], responses=errors(400, 401, 403, 409, 422))
    def add_site(body: SiteCreate, db=Depends(get_db)):
        if not NAME.match(body.name) or body.name in (COORDINATOR, "admin"):
            raise HTTPException(422, f"invalid site name {body.name!r}: letters, digits, '_', '.', '-' (≤ 64)")
        token = secrets.token_urlsafe(32)
        db.add(Site(name=body.name, token_hash=hash_token(token)))
        try:
            db.commit()
        except IntegrityError:
            db.rollback()
            raise HTTPException(409, f"site {body.name!r} already exists") from None
        return SiteCreated(site=body.name, token=token)

    @app.get("/sites", tags=["sites"], dependencies=[Depends(require_admin)], responses=errors(401, 403))
    def list_sites(db=Depends(get_db)):
        return {"sites": list(db.scalars(select(Site.name).order_by(Site.name)))}

    # --- jobs -----------------------------------------------------------------------------------
    @app.post("/jobs", response_model=JobCreated, status_code=201, tags=["jobs"],
              dependencies=[Depends(require_admin)], responses=errors(400, 401, 403, 404, 422))
    def submit_job(body: JobCreate, db=Depends(get_db)):
        if body.kind != "predict":
            raise HTTPException(422, f"unknown job kind {body.kind!r}: POST /jobs takes 'predict' jobs; "
                                     "training jobs go to POST /jobs/train")
        if len(body.sites) < 2:
            raise HTTPException(422, "a job needs at least two sites")
        if len(set(body.sites)) != len(body.sites):
            raise HTTPException(422, "a site is named twice")
        known = set(db.scalars(select(Site.name).where(Site.name.in_(body.sites))))
        unknown = [s for s in body.sites if s not in known]
        if unknown:
            raise HTTPException(404, f"unknown site(s): {unknown}")
        bad = set(body.deadlines) - set(DEFAULT_DEADLINES)
        if bad or any(v <= 0 for v in body.deadlines.values()):
            raise HTTPException(422, f"deadlines are positive seconds for phases {sorted(DEFAULT_DEADLINES)}")
        job_id = uuid.uuid4().hex[:16]
        try:
            params = JobParams(job_id=job_id, n_classes=body.classes, bits=body.bits, k=body.k, alpha=body.alpha,
                               power=body.power, crypto=body.crypto, key_bits=body.key_bits).validate()
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        db.add(Job(id=job_id, kind=body.kind, params=dataclasses.asdict(params), sites=list(body.sites), live=list(body.sites),
                   deadlines={**settings.default_deadlines, **body.deadlines}))
        db.commit()
        job_engine.wakeup.set()
        log.info("job %s submitted: %s sites, crypto=%s", job_id, len(body.sites), body.crypto)
        return JobCreated(job=job_id)

    @app.get("/jobs", tags=["jobs"], dependencies=[Depends(require_admin)], responses=errors(401, 403))
    def list_jobs(db=Depends(get_db)):
        rows = db.execute(select(Job.id, Job.status, Job.phase).order_by(Job.created_at)).all()
        return {"jobs": [{"job": i, "status": s, "phase": p} for i, s, p in rows]}

    @app.get("/jobs/{job_id}", response_model=JobStatus, tags=["jobs"], responses=errors(401, 403, 404, 422))
    def job_status(job_id: str, who: str = Depends(caller), db=Depends(get_db)):
        job = load_job(db, job_id)
        if who != "admin" and who not in job.sites:
            raise HTTPException(403, f"site {who!r} is not in job {job_id}")
        return JobStatus(job=job.id, kind=job.kind, status=job.status, phase=job.phase, attempt=job.attempt,
                         sites=job.sites, live=job.live, seed_sites=job.seed_sites, graph_sites=job.graph_sites,
                         dropped=job.dropped, attempts=job.attempts, params=job.params, progress=_progress(db, job), timings=job.timings,
                         failure=job.failure, created_at=job.created_at.isoformat() + "Z",
                         finished_at=None if job.finished_at is None else job.finished_at.isoformat() + "Z",
                         round=job.round or 0, parent=job.parent, training=_training_view(job, who))

    @app.get("/work", tags=["sites"], responses=errors(401))
    def work(site: str = Depends(require_site), db=Depends(get_db)):
        """The running jobs this site still takes part in, and the finished ones that have its results."""
        # Only the columns it needs: a training job's state (its round history) grows with every round.
        jobs = db.execute(select(Job.id, Job.status, Job.live).where(Job.status != "failed")).all()
        return {"jobs": [j.id for j in jobs if site in j.live and j.status == "running"],
                "done": [j.id for j in jobs if site in j.live and j.status == "done"]}

    messages = make_messages_router(Session, settings, blobs, job_engine, bearer, require_site, load_job, bytes_in,
                                    registry)
    app.include_router(messages)
    training = make_training_router(Session, job_engine, require_admin, caller, load_job,
                                    lambda db, names: set(db.scalars(select(Site.name).where(Site.name.in_(names)))))
    app.include_router(training)
    api_routes.extend(r for r in [*app.router.routes, *messages.routes, *training.routes] if isinstance(r, APIRoute))
    return app


def _training_view(job: Job, who: str) -> dict:
    """Child predict jobs show which features they run on; training jobs their history and result.
    The operator sees every site's metrics; a site sees the aggregates and only its own metrics (how
    many labels another site holds, or how well its model does, is that site's business)."""
    state = job.state or {}
    if job.kind != "train":
        return {k: v for k, v in state.items() if k in ("features", "model_round")}
    view = {k: state.get(k) for k in ("history", "final", "features", "labelled", "strikes", "participants")}
    if who == "admin":
        return view

    def own(row: dict | None) -> dict | None:
        if row is None:
            return None
        return {k: ({s: v for s, v in x.items() if s == who} if k in ("site_metrics", "local_accuracy_by_site") else x)
                for k, x in row.items()}

    return {"history": [own(r) for r in view["history"] or []], "final": own(view["final"]),
            "features": view["features"], "strikes": {who: (view["strikes"] or {}).get(who, 0)},
            "participants": view["participants"]}  # who is in the current attempt of a round's masked sum


def _progress(db, job: Job) -> dict:
    """How far the current phase is: parts received out of parts expected."""
    if job.kind == "train":
        return train_progress(job, db)
    expected = {"setup": len(job.live), "seed": len(job.live) * (len(job.live) - 1), "counts": len(job.live),
                "hamming": len(job.live) + 2 * len(pair_list(job.live)), "row_sums": len(job.live)}.get(job.phase, 0)
    prefix = {"setup": "announce", "seed": "seed", "counts": f"counts/{job.attempt}", "hamming": None,
              "row_sums": f"rows/{job.attempt}"}.get(job.phase)
    if job.phase == "hamming":
        got = db.scalar(select(func.count()).where(Message.job_id == job.id, Message.recipient == COORDINATOR,
                                                   (Message.topic == "intra") | Message.topic.startswith("share/")))
    elif prefix is not None:
        got = db.scalar(select(func.count()).where(Message.job_id == job.id, Message.topic == prefix))
    else:
        got = expected
    return {"phase": job.phase, "received": int(got or 0), "expected": expected,
            "fraction": round(min(1.0, (got or 0) / expected), 3) if expected else 1.0}
